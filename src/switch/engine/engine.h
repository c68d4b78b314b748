// The aggregation engine: jobs, their slot pools, and the per-packet algorithm.
//
// No I/O, no clock, no allocation on the packet path. An I/O backend hands each received
// datagram to ingest() on the thread that owns the datagram's slot and sends what comes back;
// ingest() decodes the header once and dispatches on the message type (a rank's DATA, or on a leaf
// the spine's RESULT, ABORT and HELD), so that no backend reads the bytes it decoded.
// The control plane creates, aborts and destroys jobs from its own thread; data threads never
// take a lock (jobs are published and retired RCU-style, see destroy_job()).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gradswitch/wire.h"
#include "switch/engine/counters.h"
#include "switch/engine/latency.h"
#include "switch/engine/optimizer.h"

namespace gradswitch {

struct EngineConfig {
  unsigned threads = 1;    // data threads; slot s belongs to thread s % threads
  unsigned max_jobs = 64;  // jobs alive at once (<= 256)
  // A leaf switch (--uplink, docs/protocol.md §8): ingest() also hears RESULT, ABORT and HELD from
  // the spine; elsewhere they are dropped as bad_type.
  bool leaf = false;
};

// Where a rank receives results: an IPv4 address and UDP port, both in network byte order.
struct Endpoint {
  uint32_t ipv4_be = 0;
  uint16_t port_be = 0;
};

// A leaf switch's job takes part, as one rank, in a job at a spine switch (docs/protocol.md §8):
// a round complete in the rack goes up as that rank's DATA, and the spine's RESULT comes back down.
struct UplinkSpec {
  uint32_t job_id = 0;  // the spine's job
  uint32_t key = 0;
  uint16_t rank = 0;                   // the rank the leaf's partial sums carry at the spine
  uint16_t slots = 0;                  // the spine job's pool (at least this job's)
  uint32_t payload_bytes = 0;          // the spine's largest payload
  std::vector<Endpoint> data_threads;  // the spine's data port of thread t (slot s: t = s % size)
};

struct JobSpec {
  std::string name;
  // One per member, in rank order; a job is created once every rank has joined.
  std::vector<Endpoint> endpoints;
  uint16_t world = 0;  // 1 .. GS_MAX_WORLD
  // The ranks whose DATA this switch sums (bit r: rank r); 0 = all of them. A leaf serves the ranks
  // of its rack; a spine hears from one rank per leaf (the leaf's partial sums carry that rank).
  // A round completes when every member contributed.
  uint64_t members = 0;
  uint8_t wire = GS_ELEM_FLOAT32;  // the float encoding the ranks agreed on (int32 tensors always use int32)
  uint16_t slots = 256;            // pool size = the workers' window
  uint32_t payload_bytes = GS_DEFAULT_PAYLOAD_BYTES;  // largest payload, multiple of 4
  uint32_t key = 0;                                   // random per job, chosen by the caller
  // The job's id: 0 lets the engine number jobs itself (deterministic: tests, test vectors); the
  // control plane draws a random one, since id and key together are the secret that makes DATA
  // unforgeable (docs/security.md). create_job refuses an id in use (see id_usable()).
  uint32_t id = 0;
  // The element types DATA of this job may carry: bit t for gs_elem_type t; 0 = default_elem_types().
  uint32_t elem_types = 0;
  // Ranks whose DATA may come from any port of their endpoint's IP (bit r: rank r): a leaf switch
  // sends a rack's rounds from its data threads' ports (docs/protocol.md §8).
  uint64_t source_ip_only = 0;
  // Set for a job that optimizes in the switch (float32 wire only): results carry parameters.
  std::shared_ptr<const OptimizerSpec> optimizer;
  // Bounded-time rounds (docs/protocol.md §3.1): a round closes `deadline_ns` after its first
  // contribution once it holds `quorum` of them (0: no deadline, every round waits for every member).
  // The engine has no clock: the backend calls close_overdue() at IngestResult::deadline_ns.
  uint64_t deadline_ns = 0;
  uint16_t quorum = 1;
  // Set on a leaf switch: rounds complete in the rack go up to the spine (never with an optimizer:
  // the spine, the root, runs it).
  std::shared_ptr<const UplinkSpec> uplink;
};

// What one packet turned into: at most one packet to send.
struct IngestResult {
  enum Kind : uint8_t { kDropped, kAbsorbed, kSend } kind = kDropped;
  DropReason reason = DropReason::kNone;  // for kDropped
  uint32_t job_id = 0;                    // set once the job is known
  uint16_t job_index = 0;                 // with job_id: < max_jobs, unique among live jobs
  uint16_t src_rank = GS_RANK_ALL;        // set once the sender is validated (key and rank)
  // kSend: `len` bytes at `data` go to endpoints[dest_rank], or to all `world` endpoints when
  // dest_rank == GS_RANK_ALL, or, when `dest_mask` is not 0, to endpoints[i] for each bit i set in it
  // (a HELD to a resender and the ranks its round lacks). Valid until the next ingest() on this thread.
  // Backends read them through destinations().
  uint16_t dest_rank = GS_RANK_ALL;
  uint64_t dest_mask = 0;
  const uint8_t* data = nullptr;
  uint32_t len = 0;
  // Where it goes (valid, like `data`, until the next ingest()): the job's members' endpoints in rank
  // order (dest_rank is an index into them, not a rank), or for a DATA packet going up from a leaf
  // the spine's data port of the slot.
  const Endpoint* endpoints = nullptr;
  uint16_t world = 0;  // endpoints in `endpoints`
  // kSend: what `data` carries, so that no backend re-reads the header the engine wrote: the
  // message type (GS_MSG_RESULT, GS_MSG_ABORT or GS_MSG_HELD; GS_MSG_DATA going up from a leaf),
  // the allreduce's seq, the slot, and the elements of a RESULT or DATA (0 otherwise).
  uint8_t type = 0;
  uint32_t seq = 0;
  uint16_t count = 0;
  uint16_t slot = 0;
  // The datagram came down from the spine (a leaf's uplink path): a kSend RESULT then answers the
  // round that went up, whose loss timer stops.
  bool from_spine = false;
  // A DATA packet opened a round of a job with a deadline: at `deadline_ns` (the packet's now_ns
  // plus JobSpec::deadline_ns) the backend calls close_overdue() for this slot, `version`, seq and
  // `offset`. 0: nothing to time.
  uint64_t deadline_ns = 0;
  uint8_t version = 0;
  uint32_t offset = 0;
};

// The endpoints a kSend result goes to, bit i for endpoints[i], none beyond `world` (<= GS_MAX_WORLD
// = 64); 0 for a destination outside them.
inline uint64_t destinations(const IngestResult& r) {
  const uint64_t all = r.world >= 64 ? ~uint64_t{0} : (uint64_t{1} << r.world) - 1;
  if (r.dest_mask) return r.dest_mask & all;
  if (r.dest_rank != GS_RANK_ALL) return r.dest_rank < r.world ? uint64_t{1} << r.dest_rank : 0;
  return all;
}

// Two contributions to one round that cannot be summed: the ranks disagree on the allreduce
// (different tensor lengths, element types or fixed32 scales). `held` is the round's first
// contributor, `arriving` the packet that showed the disagreement.
struct Mismatch {
  struct Side {
    uint16_t rank = 0;
    uint16_t count = 0;
    uint8_t elem_type = 0;
    int8_t scale_exp = 0;
    bool last = false;  // the chunk ends that rank's tensor
  };
  uint32_t seq = 0, offset = 0;
  Side held, arriving;
};

// A consistent-enough view for the control plane (fields read without stopping the data path).
struct JobStatus {
  uint32_t job_id = 0;
  std::string name;
  uint16_t world = 0;
  uint8_t wire = 0;
  uint16_t slots = 0;
  uint32_t payload_bytes = 0;
  bool aborted = false;
  uint8_t abort_reason = 0;
  uint16_t abort_rank = GS_RANK_ALL;
  Mismatch mismatch;     // abort_reason == GS_ABORT_MISMATCH
  uint64_t left = 0;     // ranks that left with LEAVE
  uint64_t members = 0;  // JobSpec::members (0: every rank)
  // abort_reason == GS_ABORT_UPLINK: why the spine ended the job (its abort reason and rank; reason
  // 0 when the spine was lost rather than ending it).
  uint8_t uplink_reason = 0;
  uint16_t uplink_rank = GS_RANK_ALL;
  uint64_t last_activity_ns = 0;       // latest packet of this job, any thread
  std::vector<int64_t> rank_last_seq;  // highest seq seen per rank, -1 = none yet
  CounterValues counters;
};

// A round that waits for contributions (Engine::open_rounds).
struct OpenRound {
  uint16_t slot = 0;
  uint8_t version = 0;
  uint32_t seq = 0, offset = 0;
  uint64_t seen = 0;       // ranks that contributed
  uint64_t opened_ns = 0;  // when the first one arrived (monotonic_ns)
};

struct SlotStatus {
  bool open = false;      // a round is in progress
  bool uplink = false;    // a leaf's round, complete in the rack, waits for the spine's result
  bool complete = false;  // the last round completed (its result is the shadow copy)
  uint32_t seq = 0, offset = 0;
  uint64_t seen = 0;  // ranks that contributed to the round
};

class Job;
struct JobThreadState;
struct SlotVersion;
enum class RoundState : uint8_t;

class Engine {
 public:
  explicit Engine(const EngineConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const EngineConfig& config() const { return config_; }
  unsigned thread_of_slot(uint16_t slot) const { return slot % config_.threads; }
  // Bytes of slot memory a job with this spec needs.
  static size_t job_memory_bytes(const JobSpec& spec);
  // The element types a job joined with `wire` accepts when JobSpec::elem_types is 0: the wire and
  // int32 (integer tensors travel as int32 whatever the float encoding); float32 alone for a job
  // that optimizes in the switch (docs/protocol.md section 2).
  static uint32_t default_elem_types(uint8_t wire, bool optimizer);

  // ---- control plane side (one thread) ----
  // Creates a job; returns its id, or 0 with `error` set (bad spec, table full, id not usable).
  uint32_t create_job(const JobSpec& spec, std::string* error);
  // Whether create_job would take `id` (non-zero, not a live job's, room in its hash bucket).
  bool id_usable(uint32_t id) const;
  // Marks a job aborted: from now on its packets are answered with GS_MSG_ABORT (except
  // retransmissions of completed rounds, which still get their result). False when the job is
  // unknown or was already aborted (data threads abort jobs too: GS_ABORT_MISMATCH, rank_left).
  bool abort_job(uint32_t job_id, uint8_t reason, uint16_t rank);
  // A leaf's job ends because its spine ended the spine's job (`spine_reason`, `spine_rank`) or was
  // lost (spine_reason 0): aborted with GS_ABORT_UPLINK. Same return as abort_job.
  bool abort_from_uplink(uint32_t job_id, uint8_t spine_reason, uint16_t spine_rank);
  // A rank left with LEAVE. Rounds it has contributed to can still complete; a round that needs it
  // cannot. Returns true when the job was aborted (GS_ABORT_RANK_LEFT) because an open round was
  // waiting for that rank; later packets that would open or wait on such a round abort it too.
  bool rank_left(uint32_t job_id, uint16_t rank);
  // Unpublishes a job and frees it once no data thread can still be using it.
  void destroy_job(uint32_t job_id);
  bool job_status(uint32_t job_id, JobStatus* out) const;
  bool slot_status(uint32_t job_id, uint16_t slot, uint8_t version, SlotStatus* out) const;
  std::vector<uint32_t> job_ids() const;
  // The optimizer of an optimizer job (control plane: parameters, state, lr), else nullptr.
  Optimizer* job_optimizer(uint32_t job_id) const;
  CounterValues total_counters() const;

  // ---- observers (engine_observe.cpp) ----
  // Readers on a thread other than the control plane's (the metrics endpoint) hold a ReadGuard
  // while they use job_ids(), job_status(), job_latency() or open_rounds(): destroy_job waits for
  // them as it waits for data threads in a burst. One reader at a time; never held by a data thread.
  class ReadGuard {
   public:
    explicit ReadGuard(const Engine& e);
    ~ReadGuard();
    ReadGuard(const ReadGuard&) = delete;
    ReadGuard& operator=(const ReadGuard&) = delete;

   private:
    const Engine& e_;
  };
  // Rounds (first contribution to completion) and allreduces (first DATA packet of a seq seen by the
  // data thread that completes its last chunk, to that completion), over every job since start.
  LatencyValues total_round_times() const;
  LatencyValues total_allreduce_times() const;
  bool job_latency(uint32_t job_id, LatencyValues* rounds, LatencyValues* allreduces) const;
  // Jobs aborted since start, by reason (index: gs_abort_reason; 0 unused).
  static constexpr size_t kAbortReasons = 8;
  std::array<uint64_t, kAbortReasons> aborts() const;
  // The job's open rounds (a contribution arrived, not every rank's yet), oldest first; false when
  // the job is unknown.
  bool open_rounds(uint32_t job_id, std::vector<OpenRound>* out) const;

  // ---- data side (thread `thread` only) ----
  // A data thread brackets each burst of ingest() calls; between bursts it is quiescent.
  void begin_burst(unsigned thread);
  void end_burst(unsigned thread);
  // One datagram, whatever its type. `from` is its source: DATA counts only from the address its rank
  // joined from, and on a leaf (EngineConfig::leaf) only the spine's data ports are heard (else it
  // is dropped, bad_source). From the spine, a RESULT completes the leaf round that waits for it (the
  // result goes to every member; IngestResult::slot says which slot was answered), an ABORT aborts
  // the leaf's job (GS_ABORT_UPLINK) and tells every member, a HELD is absorbed.
  IngestResult ingest(unsigned thread, const uint8_t* packet, size_t len, uint64_t now_ns, Endpoint from);
  // Count packets the backend sent (or failed to send) on behalf of this thread.
  void count_sent(unsigned thread, uint32_t job_id, uint32_t packets, uint64_t bytes);

  // ---- leaf switches (JobSpec::uplink; data side, thread `thread` only, inside a burst) ----
  // The DATA packet of `slot`'s round that waits for the spine, marked RETX, to send again (its loss
  // timer expired); kDropped when no round of that slot waits any more.
  IngestResult uplink_resend(unsigned thread, uint32_t job_id, uint16_t slot);

  // ---- bounded-time rounds (JobSpec::deadline_ns; data side, thread `thread` only, inside a burst) ----
  // The deadline of the round (seq, offset) of `slot` `version` has passed: if it is still open and
  // holds the job's quorum, it closes with the contributions present and its PARTIAL RESULT goes to
  // every member (kSend); with fewer, the contribution that reaches the quorum closes it. kAbsorbed
  // when the round completed meanwhile (or is another one now), kDropped for an unknown job.
  IngestResult close_overdue(unsigned thread, uint32_t job_id, uint16_t slot, uint8_t version, uint32_t seq,
                             uint32_t offset, uint64_t now_ns);

 private:
  struct alignas(64) ThreadState {
    std::atomic<uint64_t> burst_seq{0};  // odd while inside a burst
    Counters totals;
    LatencyHistogram round_times, allreduce_times;
    alignas(8) uint8_t abort_packet[GS_HEADER_BYTES];
    alignas(8) uint8_t held_packet[GS_HEADER_BYTES + GS_HELD_BODY_BYTES];
    alignas(64) uint8_t aligned_payload[GS_MAX_PAYLOAD_BYTES];
  };

  Job* find_job(uint32_t job_id) const;
  Job* find_uplink_job(uint32_t spine_job_id) const;

  // ---- the packet path: ingest()'s message types and their steps (engine.cpp, engine_uplink.cpp) ----
  // One datagram on its way through ingest(), its header decoded (job.h). Each step fills `a.r`.
  struct Arrival;
  // A rank's DATA, in the steps of docs/protocol.md §3. The steps of this path are inlined into
  // ingest() (always_inline: one function's code, as it was before it was split into steps).
  [[gnu::always_inline]] inline void ingest_data(unsigned thread, Arrival& a);
  [[gnu::always_inline]] inline Job* admit_data(unsigned thread, Arrival& a);
  [[gnu::always_inline]] inline static void note_arrival(Arrival& a, const Job& job);
  [[gnu::always_inline]] inline void still_open(unsigned thread, Arrival& a, Job& job, SlotVersion& sv,
                                                bool opened);
  [[gnu::always_inline]] inline DropReason check_data(unsigned thread, Arrival& a, const Job& job) const;
  [[gnu::always_inline]] inline static void answer_completed(Arrival& a, const Job& job, SlotVersion& sv,
                                                             uint8_t held);
  [[gnu::always_inline]] inline static bool join_round(Arrival& a, Job& job, SlotVersion& sv);
  [[gnu::always_inline]] inline static void add_payload(Arrival& a, SlotVersion& sv);
  [[gnu::always_inline]] inline static void concede(Arrival& a, SlotVersion& sv);
  [[gnu::always_inline]] inline static bool open_round(Arrival& a, SlotVersion& sv, RoundState state,
                                                       uint32_t held_seq, uint32_t held_offset);
  [[gnu::always_inline]] inline static const uint8_t* aligned_payload(Arrival& a);
  [[gnu::always_inline]] inline void complete_round(unsigned thread, Arrival& a, Job& job, uint8_t version);
  // Narrows a 16-bit sum, runs an optimizer's step and publishes the round's result (6.).
  IngestResult& finish_round(unsigned thread, Job& job, uint16_t slot, uint8_t version, IngestResult& r,
                             uint64_t now_ns);
  // Closes an open round of a job with a deadline without the members it lacks, or that conceded it
  // (§3.1). `completer`: the rank whose arrival closed it once every member reached it, else
  // GS_RANK_ALL (its deadline did, or the quorum's contribution past it).
  IngestResult& close_partial(unsigned thread, Job& job, uint16_t slot, uint8_t version, IngestResult& r,
                              uint64_t now_ns, uint16_t completer = GS_RANK_ALL);
  // §3.1: the sender of `h` reached its round, so it holds the slot's previous round (`other`, the
  // slot's other version, when that holds an older round): that round owes it nothing more.
  [[gnu::always_inline]] inline static void reached_next(SlotVersion& other, const gs_header& h);
  // 2. for a partial round: DATA from a member the round closed without.
  static void answer_late(Arrival& a, const Job& job, SlotVersion& sv);
  static void answer_from_shadow(Arrival& a, const Job& job, SlotVersion& sv, uint8_t flags);
  // An ABORT with the reason to rank `dest`, or to every rank (GS_RANK_ALL).
  static void answer_abort(Arrival& a, const Job& job, uint16_t dest, DropReason why, uint8_t reason,
                           uint16_t at_fault);
  // Aborts the job (or, aborted already, reports the first reason) and tells every rank.
  static void abort_everyone(Arrival& a, Job& job, DropReason why, uint8_t reason, uint16_t at_fault,
                             const Mismatch* m);
  // On a leaf, the spine's RESULT, ABORT or HELD (engine_uplink.cpp).
  void ingest_from_spine(unsigned thread, Arrival& a);
  void abort_from_spine(Arrival& a, Job& job);
  void result_from_spine(unsigned thread, Arrival& a, Job& job);

  // Completes a leaf's round in the rack: sends its partial sum up instead of a result down.
  IngestResult& send_up(unsigned thread, Job& job, uint16_t slot, uint8_t version, IngestResult& r);
  // A resend to an open round: HELD to the sender (`sender_bit`, 0 when its resend was new to the
  // round) and to the members the round lacks; absorbed when that is nobody.
  static IngestResult& answer_held(ThreadState& ts, JobThreadState& js, const Job& job, const gs_header& h,
                                   SlotVersion& sv, uint64_t sender_bit, uint64_t now_ns, IngestResult& r);
  // A round's lacking ranks are told once it has been open this long (stuck, by a data center's round
  // trips even behind full queues; sooner, the request mostly duplicates the lacking rank's own
  // recovery on the bottleneck: docs/transport.md, "The switch asks the rank a round lacks"), at most
  // once per kRetellNs (the resends of one loss arrive together; later ones come from timers and
  // probes, milliseconds apart).
  static constexpr uint64_t kAskAfterNs = 20'000'000;
  static constexpr uint64_t kRetellNs = 1'000'000;
  // Fills `r` with the packet that `sv` keeps for the spine.
  static IngestResult& going_up(const Job& job, uint16_t slot, SlotVersion& sv, IngestResult& r);
  // A complete round: writes the RESULT header before its sum (the shadow copy) and sends it to
  // every member.
  IngestResult& publish_result(unsigned thread, Job& job, uint16_t slot, uint8_t version, IngestResult& r,
                               uint64_t now_ns);
  // Waits until no ReadGuard holds a job that destroy_job just unpublished.
  void wait_for_readers() const;
  // Job ids are random 32-bit numbers: they are found through a hash table of kWays-way buckets
  // (never rehashed, so data threads read it without locks while the control plane writes it).
  static constexpr unsigned kWays = 4;
  std::atomic<Job*>* bucket_of(std::atomic<Job*>* table, uint32_t key) const;
  static bool bucket_insert(std::atomic<Job*>* bucket, Job* job);  // false when the bucket is full
  static void bucket_erase(std::atomic<Job*>* bucket, const Job* job);

  mutable std::mutex reader_mu_;                 // one ReadGuard at a time
  mutable std::atomic<uint64_t> reader_seq_{0};  // odd while a ReadGuard is held
  std::array<std::atomic<uint64_t>, kAbortReasons> aborts_{};
  EngineConfig config_;
  std::unique_ptr<ThreadState[]> threads_;
  std::unique_ptr<std::atomic<Job*>[]> by_index_;  // max_jobs entries: the jobs' dense indices
  unsigned bucket_bits_ = 1;
  std::unique_ptr<std::atomic<Job*>[]> buckets_;         // by job id: (1 << bucket_bits_) * kWays
  std::unique_ptr<std::atomic<Job*>[]> uplink_buckets_;  // leaf jobs, by their spine job's id
  uint32_t next_generation_ = 1;
};

}  // namespace gradswitch
