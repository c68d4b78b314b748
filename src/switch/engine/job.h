// Engine internals: a job, its slot pool and its per-thread state. Only engine*.cpp include this.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradswitch/wire.h"
#include "switch/engine/counters.h"
#include "switch/engine/engine.h"
#include "switch/engine/latency.h"

namespace gradswitch {

// Types the switch widens into the fp32 accumulator, sums there and narrows once at the end:
// float16, bfloat16 and mx8 (docs/protocol.md §2).
inline bool sums_in_fp32(uint8_t elem_type) {
  return elem_type == GS_ELEM_FLOAT16 || elem_type == GS_ELEM_BFLOAT16 || elem_type == GS_ELEM_MX8;
}
// The element type a round of `elem_type` goes up to the spine in: fp32-summed types stay fp32.
inline uint8_t uplink_elem_type(uint8_t elem_type) {
  return sums_in_fp32(elem_type) ? static_cast<uint8_t>(GS_ELEM_FLOAT32) : elem_type;
}
// Widens a payload of a sums_in_fp32 type into `accum` (written, or added when `add`), and narrows
// `accum` back into a payload of that type (round to nearest even; mx8 as §2.2 specifies).
void widen_into_fp32(uint8_t elem_type, float* accum, const uint8_t* payload, size_t count, bool add);
void narrow_from_fp32(uint8_t elem_type, uint8_t* payload, const float* accum, size_t count);

// kUplink: a leaf's round that every member of the rack contributed to, sent up to the spine and
// waiting for its result (which then becomes the shadow copy, kComplete).
enum class RoundState : uint8_t { kEmpty, kOpen, kComplete, kUplink };

// One version of one slot: the round it holds (identified by seq and offset), who contributed,
// and the running sum. When complete, `result` is the shadow copy that answers retransmissions.
struct SlotVersion {
  std::atomic<RoundState> state{RoundState::kEmpty};  // atomics: the control plane reads them
  std::atomic<uint64_t> seen{0};
  // Members that reached the round without contributing (DATA with GS_FLAG_CONCEDE, docs/protocol.md
  // §3.1): with `seen`, the ranks the round reached. Never in `seen`, so never in a PARTIAL's trailer.
  std::atomic<uint64_t> conceded{0};
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> offset{0};
  std::atomic<uint64_t> opened_ns{0};  // when the round's first contribution arrived
  uint16_t arrived = 0;
  uint16_t count = 0;
  uint8_t elem_type = 0;
  int8_t scale_exp = 0;
  int8_t next_exp = GS_EXP_NONE;
  bool last = false;  // the round's first contribution carried GS_FLAG_LAST
  // The rank whose contribution completed the round (RESULT's `rank`); GS_RANK_ALL on a leaf when the
  // spine's round was completed by another rack.
  uint16_t completer = 0;
  // The smallest window the round's contributions declared (0: none did), which the RESULT carries
  // to every rank: a job's ranks run the smallest of their windows (docs/protocol.md §4.2). On a leaf,
  // once the spine answers, the spine's: the smallest of every rack's.
  uint16_t min_window = 0;
  // That contribution was a resend (DATA with RETX): RESULT then carries RETX, which tells the workers
  // that waited for it that a loss held the round, not a late rank (docs/protocol.md §2, §4.1).
  bool completed_by_resend = false;
  // When a HELD last told the ranks this open round lacks (0: not yet): at most once per kRetellNs.
  uint64_t told_ns = 0;
  // Bounded-time rounds (docs/protocol.md §3.1). `overdue`: the deadline passed before the quorum
  // arrived, so the contribution that reaches it closes the round. `partial`: the round closed
  // without every member (its RESULT carries PARTIAL and the contributor trailer). `owed`: members
  // that may still lack the round's result: those a partial round closed without, its conceders,
  // and (a complete round) those the slot's next round closed without; each until it arrives at the
  // slot's next round, which it starts only with this round's result. While any is, the version
  // takes no new round (its shadow copy is the only place their result is). `late`: members whose
  // late DATA or concession (step 2') was answered once; a copy without RETX is not answered again.
  bool overdue = false;
  bool partial = false;
  uint64_t owed = 0;
  uint64_t late = 0;
  // GS_HEADER_BYTES of header, then the payload as it goes back on the wire. 4- and 8-byte element
  // types accumulate in place here (the payload starts 32-byte aligned); sums_in_fp32 types
  // accumulate in `accum` and are narrowed at the end. A leaf sends a round up from the same memory:
  // `result` with the DATA header written over the result's, or for sums_in_fp32 types the fp32
  // `accum`, behind the GS_HEADER_BYTES reserved just before it.
  uint8_t* result = nullptr;
  float* accum = nullptr;
};

// The ranks a round reached: its contributors and its conceders (§3.1).
inline uint64_t reached(const SlotVersion& sv) {
  return sv.seen.load(std::memory_order_relaxed) | sv.conceded.load(std::memory_order_relaxed);
}

struct Slot {
  SlotVersion version[2];
};

// State a data thread writes for a job: counters and liveness, one cache line group per thread.
struct alignas(64) JobThreadState {
  Counters counters;
  std::atomic<uint64_t> last_activity_ns{0};
  std::array<std::atomic<int64_t>, GS_MAX_WORLD> rank_seq;  // -1: nothing seen yet
  LatencyHistogram round_times, allreduce_times;
  AllreduceClock clock;
  JobThreadState() {
    for (auto& s : rank_seq) s.store(-1, std::memory_order_relaxed);
  }
};

class Job {
 public:
  Job(uint32_t id, uint16_t index, const JobSpec& spec, unsigned threads);
  ~Job();

  const uint32_t id;
  const uint16_t index;       // dense, < max_jobs (IngestResult::job_index)
  const uint32_t elem_types;  // bit t: DATA may carry gs_elem_type t
  const JobSpec spec;
  std::unique_ptr<Slot[]> slots;
  std::unique_ptr<JobThreadState[]> per_thread;

  std::unique_ptr<Optimizer> optimizer;  // optimizer jobs only

  // Aborting is claimed once (control plane or a data thread, whichever comes first); the fields
  // below are written by the claimer before `aborted` is released.
  bool try_abort(uint8_t reason, uint16_t rank, const Mismatch* mismatch = nullptr, uint8_t uplink_reason = 0,
                 uint16_t uplink_rank = GS_RANK_ALL);
  std::atomic<bool> aborted{false};
  uint8_t abort_reason = 0;
  uint16_t abort_rank = GS_RANK_ALL;
  Mismatch mismatch;  // abort_reason == GS_ABORT_MISMATCH

  // The engine's count of aborts by reason (Engine::aborts()), bumped by the claimer.
  std::atomic<uint64_t>* abort_counts = nullptr;

  // Ranks that left with LEAVE: a round that still needs one of them can never complete.
  std::atomic<uint64_t> left{0};

  // JobSpec::members resolved: the member bits, how many, and each member's index in
  // spec.endpoints (for answers to one rank).
  uint64_t members = 0;
  uint16_t member_count = 0;
  std::array<uint8_t, GS_MAX_WORLD> endpoint_index{};

  // GS_ABORT_UPLINK: what the spine said (written by the abort's claimer, like abort_reason).
  uint8_t uplink_reason = 0;
  uint16_t uplink_rank = GS_RANK_ALL;

 private:
  uint8_t* memory_ = nullptr;
  std::atomic<bool> abort_claimed_{false};
};

// One datagram on its way through Engine::ingest(): its header, decoded once, and what the steps of
// its path share. `r` is ingest()'s result, which the steps fill.
struct Engine::Arrival {
  Arrival(ThreadState& thread_state, IngestResult& result, const uint8_t* datagram, size_t datagram_len,
          uint64_t now, Endpoint source)
      : ts(thread_state), r(result), packet(datagram), len(datagram_len), now_ns(now), from(source) {}
  ThreadState& ts;
  IngestResult& r;
  const uint8_t* const packet;
  const size_t len;
  const uint64_t now_ns;
  const Endpoint from;
  gs_header h;                   // decoded by ingest() before any path starts
  JobThreadState* js = nullptr;  // the job's, once it is known: its drops count there too
  size_t elem_size = 0;          // DATA, once checked: the payload's element size and length
  size_t payload_len = 0;
  bool concede = false;  // DATA with GS_FLAG_CONCEDE, once checked: an arrival without payload (§3.1)
  // Ends the datagram's path: dropped, and counted.
  void drop(DropReason why) {
    ts.totals.drop(why);
    if (js) js->counters.drop(why);
    r.kind = IngestResult::kDropped;
    r.reason = why;
  }
};

}  // namespace gradswitch
