// The per-packet algorithm (docs/protocol.md §3 is its specification) and job lifecycle.
#include "switch/engine/engine.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "common/header.h"
#include "common/kernels.h"
#include "common/seq.h"
#include "switch/engine/job.h"

namespace gradswitch {

namespace {

constexpr size_t kAlign = 64;
size_t round_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}
size_t result_bytes(const JobSpec& s) {
  // A job with a deadline keeps room for a PARTIAL RESULT's contributor trailer (§3.1).
  return round_up(GS_HEADER_BYTES + s.payload_bytes + (s.deadline_ns ? GS_PARTIAL_TRAILER_BYTES : 0));
}
// The datagram a round's shadow copy answers with: header, elements, and a PARTIAL's trailer.
uint32_t result_len(const SlotVersion& sv) {
  return static_cast<uint32_t>(GS_HEADER_BYTES + gs_payload_bytes(sv.elem_type, sv.count) +
                               (sv.partial ? GS_PARTIAL_TRAILER_BYTES : 0));
}
// 16-bit and mx8 elements are summed in fp32: 4 bytes for each element a payload can carry, behind
// room for the header with which a leaf sends such a sum up (job.h). mx8's elements are 1 byte: its
// jobs need twice the 16-bit types' room.
size_t accum_bytes(const JobSpec& s) {
  const uint32_t types =
      s.elem_types ? s.elem_types : Engine::default_elem_types(s.wire, s.optimizer != nullptr);
  const uint8_t widest = (types >> GS_ELEM_MX8 & 1) ? GS_ELEM_MX8 : GS_ELEM_FLOAT16;
  return kAlign + round_up(gs_max_count(widest, s.payload_bytes) * 4);
}

// §3.1: does `sv` hold a round before round (seq, offset, count) of its slot, the slot's previous round
// when it is in the other version? A slot's rounds follow one another in (seq, offset), but for fixed32's
// bootstrap round (count 0, §5): its data round, in the other version, has the same (seq, offset).
bool holds_earlier(const SlotVersion& sv, uint32_t seq, uint32_t offset, uint16_t count) {
  const uint32_t held_seq = sv.seq.load(std::memory_order_relaxed);
  const uint32_t held_offset = sv.offset.load(std::memory_order_relaxed);
  return round_is_newer(seq, offset, held_seq, held_offset) ||
         (seq == held_seq && offset == held_offset && sv.count == 0 && count != 0);
}

std::string check_membership(const JobSpec& spec) {
  const uint64_t all = spec.world >= 64 ? ~uint64_t{0} : (uint64_t{1} << spec.world) - 1;
  if (spec.members & ~all) return "members must be ranks of the job";
  const size_t n = spec.members ? static_cast<size_t>(__builtin_popcountll(spec.members)) : spec.world;
  if (spec.endpoints.size() != n) return "one endpoint per member is required";
  return "";
}

std::string check_uplink(const JobSpec& spec) {
  const UplinkSpec& u = *spec.uplink;
  if (spec.optimizer) return "a leaf's job cannot optimize (the spine, the root, runs the optimizer)";
  if (u.data_threads.empty()) return "the spine's data ports are missing";
  if (spec.slots > u.slots) return "the leaf's slots exceed the spine's";
  // Every round must fit one spine packet: fp32-summed types go up as fp32, in more bytes.
  const size_t up =
      gs_payload_bytes(uplink_elem_type(spec.wire), gs_max_count(spec.wire, spec.payload_bytes));
  if (up > u.payload_bytes) return "the leaf's rounds would not fit the spine's payload";
  return "";
}

}  // namespace

Job::Job(uint32_t job_id, uint16_t job_index, const JobSpec& job_spec, unsigned threads)
    : id(job_id),
      index(job_index),
      elem_types(job_spec.elem_types
                     ? job_spec.elem_types
                     : Engine::default_elem_types(job_spec.wire, job_spec.optimizer != nullptr)),
      spec(job_spec),
      slots(new Slot[job_spec.slots]),
      per_thread(new JobThreadState[threads]) {
  const size_t rb = result_bytes(spec), ab = accum_bytes(spec);
  const size_t total = size_t{spec.slots} * 2 * (rb + ab);
  memory_ = static_cast<uint8_t*>(::operator new (total, std::align_val_t{kAlign}));
  uint8_t* p = memory_;
  for (uint16_t s = 0; s < spec.slots; ++s) {
    for (auto& v : slots[s].version) {
      v.result = p;
      v.accum = reinterpret_cast<float*>(p + rb + kAlign);
      p += rb + ab;
    }
  }
  members = spec.members;
  if (members == 0) members = spec.world >= 64 ? ~uint64_t{0} : (uint64_t{1} << spec.world) - 1;
  uint8_t index = 0;
  for (uint16_t r = 0; r < spec.world; ++r)
    if (members >> r & 1) endpoint_index[r] = index++;
  member_count = index;
}

Job::~Job() {
  ::operator delete (memory_, std::align_val_t{kAlign});
}

Engine::Engine(const EngineConfig& config)
    : config_(config), threads_(new ThreadState[config.threads ? config.threads : 1]) {
  if (config_.threads == 0) config_.threads = 1;
  if (config_.max_jobs == 0 || config_.max_jobs > 256) config_.max_jobs = 256;
  by_index_.reset(new std::atomic<Job*>[config_.max_jobs]);
  for (unsigned i = 0; i < config_.max_jobs; ++i) by_index_[i].store(nullptr);
  // At least as many buckets as jobs: with random ids a bucket rarely holds two.
  while ((1u << bucket_bits_) < config_.max_jobs) ++bucket_bits_;
  const size_t entries = (size_t{1} << bucket_bits_) * kWays;
  buckets_.reset(new std::atomic<Job*>[entries]);
  uplink_buckets_.reset(new std::atomic<Job*>[entries]);
  for (size_t i = 0; i < entries; ++i) buckets_[i].store(nullptr), uplink_buckets_[i].store(nullptr);
}

Engine::~Engine() {
  for (unsigned i = 0; i < config_.max_jobs; ++i) delete by_index_[i].load();
}

uint32_t Engine::default_elem_types(uint8_t wire, bool optimizer) {
  if (optimizer) return 1u << GS_ELEM_FLOAT32;
  return (1u << wire) | (1u << GS_ELEM_INT32);
}

std::atomic<Job*>* Engine::bucket_of(std::atomic<Job*>* table, uint32_t key) const {
  // Fibonacci hashing: the multiply spreads every bit of the key over the bucket number.
  return &table[size_t{(key * 0x9E3779B1u) >> (32 - bucket_bits_)} * kWays];
}

bool Engine::bucket_insert(std::atomic<Job*>* bucket, Job* job) {
  for (unsigned w = 0; w < kWays; ++w) {
    if (!bucket[w].load(std::memory_order_relaxed)) {
      bucket[w].store(job, std::memory_order_seq_cst);
      return true;
    }
  }
  return false;
}

void Engine::bucket_erase(std::atomic<Job*>* bucket, const Job* job) {
  for (unsigned w = 0; w < kWays; ++w)
    if (bucket[w].load(std::memory_order_relaxed) == job) bucket[w].store(nullptr, std::memory_order_seq_cst);
}

bool Engine::id_usable(uint32_t id) const {
  if (id == 0 || find_job(id)) return false;
  std::atomic<Job*>* b = bucket_of(buckets_.get(), id);
  for (unsigned w = 0; w < kWays; ++w)
    if (!b[w].load(std::memory_order_relaxed)) return true;
  return false;
}

size_t Engine::job_memory_bytes(const JobSpec& spec) {
  return size_t{spec.slots} * 2 * (result_bytes(spec) + accum_bytes(spec));
}

uint32_t Engine::create_job(const JobSpec& spec, std::string* error) {
  auto fail = [&](const std::string& why) {
    if (error) *error = why;
    return 0u;
  };
  if (spec.world == 0 || spec.world > GS_MAX_WORLD)
    return fail("world size must be 1.." + std::to_string(GS_MAX_WORLD));
  if (std::string why = check_membership(spec); !why.empty()) return fail(why);
  if (spec.slots == 0) return fail("a job needs at least one slot");
  if (spec.payload_bytes == 0 || spec.payload_bytes % 4 || spec.payload_bytes > GS_MAX_PAYLOAD_BYTES)
    return fail("payload must be a multiple of 4 bytes, at most " + std::to_string(GS_MAX_PAYLOAD_BYTES));
  if (gs_elem_size(spec.wire) == 0) return fail("unknown wire element type");
  if (spec.optimizer) {
    if (spec.wire != GS_ELEM_FLOAT32) return fail("optimization in the switch needs the float32 wire");
    if (spec.optimizer->params == 0 || spec.optimizer->params > 0xFFFFFFFFull)
      return fail("an optimizer job needs 1 .. 2^32-1 parameters");
  }
  if (spec.uplink)
    if (std::string why = check_uplink(spec); !why.empty()) return fail(why);
  if (spec.elem_types & ~uint32_t{0xFE}) return fail("elem_types names an unknown element type");
  if (spec.deadline_ns && (spec.optimizer || spec.uplink || spec.quorum == 0 || spec.quorum > spec.world))
    return fail("a deadline needs a quorum of 1..world, and neither an optimizer nor an uplink");
  unsigned index = config_.max_jobs;
  for (unsigned i = 0; i < config_.max_jobs; ++i) {
    if (by_index_[i].load(std::memory_order_relaxed) == nullptr) {
      index = i;
      break;
    }
  }
  if (index == config_.max_jobs)
    return fail("job table full (" + std::to_string(config_.max_jobs) + " jobs)");
  uint32_t id = spec.id;
  if (id == 0) {  // numbered by the engine: the generation above the index, never 0
    do {
      const uint32_t generation = next_generation_++ & 0xFFFFFFu;
      id = (generation << 8) | index;
    } while (!id_usable(id));
  } else if (!id_usable(id)) {
    return fail("job id " + std::to_string(id) + " is in use or its hash bucket is full (draw another)");
  }
  Job* job = new (std::nothrow) Job(id, static_cast<uint16_t>(index), spec, config_.threads);
  if (!job) return fail("out of memory for the job's slots");
  job->abort_counts = aborts_.data();
  if (spec.optimizer) {
    try {
      job->optimizer = std::make_unique<Optimizer>(*spec.optimizer, spec.payload_bytes / 4);
    } catch (const std::bad_alloc&) {
      delete job;
      return fail("out of memory for the optimizer's parameters and state");
    }
  }
  by_index_[index].store(job, std::memory_order_relaxed);
  // Published: data threads find it from here on (a leaf's job also by its spine job's id).
  if (spec.uplink && !bucket_insert(bucket_of(uplink_buckets_.get(), spec.uplink->job_id), job)) {
    by_index_[index].store(nullptr, std::memory_order_relaxed);
    delete job;
    return fail("too many of this leaf's jobs hash alike by their spine job ids (retry the job)");
  }
  bucket_insert(bucket_of(buckets_.get(), id), job);
  return id;
}

Job* Engine::find_job(uint32_t job_id) const {
  std::atomic<Job*>* b = bucket_of(buckets_.get(), job_id);
  for (unsigned w = 0; w < kWays; ++w) {
    Job* job = b[w].load(std::memory_order_acquire);
    if (job && job->id == job_id) return job;
  }
  return nullptr;
}

bool Job::try_abort(uint8_t reason, uint16_t rank, const Mismatch* m, uint8_t spine_reason,
                    uint16_t spine_rank) {
  if (abort_claimed_.exchange(true, std::memory_order_acq_rel)) return false;
  abort_reason = reason;
  abort_rank = rank;
  if (m) mismatch = *m;
  uplink_reason = spine_reason;
  uplink_rank = spine_rank;
  aborted.store(true, std::memory_order_release);
  if (abort_counts && reason < Engine::kAbortReasons)
    abort_counts[reason].fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool Engine::abort_job(uint32_t job_id, uint8_t reason, uint16_t rank) {
  Job* job = find_job(job_id);
  return job && job->try_abort(reason, rank);
}

bool Engine::abort_from_uplink(uint32_t job_id, uint8_t spine_reason, uint16_t spine_rank) {
  Job* job = find_job(job_id);
  return job && job->try_abort(GS_ABORT_UPLINK, GS_RANK_ALL, nullptr, spine_reason, spine_rank);
}

bool Engine::rank_left(uint32_t job_id, uint16_t rank) {
  Job* job = find_job(job_id);
  if (!job || rank >= job->spec.world) return false;
  const uint64_t bit = uint64_t{1} << rank;
  // Published before the scan: a round opened after the scan sees the bit (ingest_data, step 4); one
  // opened concurrently is caught by the next packet touching it (a worker's probe).
  job->left.fetch_or(bit, std::memory_order_seq_cst);
  for (uint16_t s = 0; s < job->spec.slots; ++s)
    for (const SlotVersion& v : job->slots[s].version)
      if (v.state.load(std::memory_order_seq_cst) == RoundState::kOpen && !(reached(v) & bit))
        return job->try_abort(GS_ABORT_RANK_LEFT, rank);
  return false;
}

void Engine::destroy_job(uint32_t job_id) {
  Job* job = find_job(job_id);
  if (!job) return;
  bucket_erase(bucket_of(buckets_.get(), job_id), job);
  if (job->spec.uplink) bucket_erase(bucket_of(uplink_buckets_.get(), job->spec.uplink->job_id), job);
  by_index_[job->index].store(nullptr, std::memory_order_relaxed);
  // RCU-style grace period: a thread inside a burst may still hold the pointer; wait until every
  // such thread has left that burst. Threads outside a burst will not find the job any more.
  for (unsigned t = 0; t < config_.threads; ++t) {
    const uint64_t seen = threads_[t].burst_seq.load(std::memory_order_seq_cst);
    if (seen & 1) {
      while (threads_[t].burst_seq.load(std::memory_order_seq_cst) == seen)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  wait_for_readers();
  delete job;
}

void Engine::begin_burst(unsigned thread) {
  threads_[thread].burst_seq.fetch_add(1, std::memory_order_seq_cst);
}
void Engine::end_burst(unsigned thread) {
  threads_[thread].burst_seq.fetch_add(1, std::memory_order_release);
}

bool Engine::job_status(uint32_t job_id, JobStatus* out) const {
  Job* job = find_job(job_id);
  if (!job) return false;
  out->job_id = job->id;
  out->name = job->spec.name;
  out->world = job->spec.world;
  out->wire = job->spec.wire;
  out->slots = job->spec.slots;
  out->payload_bytes = job->spec.payload_bytes;
  out->aborted = job->aborted.load(std::memory_order_acquire);
  out->abort_reason = out->aborted ? job->abort_reason : 0;
  out->abort_rank = out->aborted ? job->abort_rank : GS_RANK_ALL;
  out->mismatch = out->aborted && job->abort_reason == GS_ABORT_MISMATCH ? job->mismatch : Mismatch{};
  out->left = job->left.load(std::memory_order_relaxed);
  out->members = job->spec.members;
  out->uplink_reason = out->aborted ? job->uplink_reason : 0;
  out->uplink_rank = out->aborted ? job->uplink_rank : GS_RANK_ALL;
  out->last_activity_ns = 0;
  out->rank_last_seq.assign(job->spec.world, -1);
  out->counters = CounterValues{};
  for (unsigned t = 0; t < config_.threads; ++t) {
    const JobThreadState& ts = job->per_thread[t];
    out->counters += ts.counters.read();
    out->last_activity_ns =
        std::max(out->last_activity_ns, ts.last_activity_ns.load(std::memory_order_relaxed));
    for (uint16_t r = 0; r < job->spec.world; ++r) {
      const int64_t s = ts.rank_seq[r].load(std::memory_order_relaxed);
      int64_t& best = out->rank_last_seq[r];
      if (s >= 0 && (best < 0 || seq_after(static_cast<uint32_t>(s), static_cast<uint32_t>(best)))) best = s;
    }
  }
  return true;
}

bool Engine::slot_status(uint32_t job_id, uint16_t slot, uint8_t version, SlotStatus* out) const {
  Job* job = find_job(job_id);
  if (!job || slot >= job->spec.slots || version > 1) return false;
  const SlotVersion& sv = job->slots[slot].version[version];
  const RoundState state = sv.state.load(std::memory_order_relaxed);
  out->open = state == RoundState::kOpen;
  out->complete = state == RoundState::kComplete;
  out->uplink = state == RoundState::kUplink;
  out->seq = sv.seq.load(std::memory_order_relaxed);
  out->offset = sv.offset.load(std::memory_order_relaxed);
  out->seen = sv.seen.load(std::memory_order_relaxed);
  return true;
}

Optimizer* Engine::job_optimizer(uint32_t job_id) const {
  Job* job = find_job(job_id);
  return job ? job->optimizer.get() : nullptr;
}

std::vector<uint32_t> Engine::job_ids() const {
  std::vector<uint32_t> ids;
  for (unsigned i = 0; i < config_.max_jobs; ++i)
    if (Job* job = by_index_[i].load(std::memory_order_acquire)) ids.push_back(job->id);
  return ids;
}

CounterValues Engine::total_counters() const {
  CounterValues v;
  for (unsigned t = 0; t < config_.threads; ++t) v += threads_[t].totals.read();
  return v;
}

void Engine::count_sent(unsigned thread, uint32_t job_id, uint32_t packets, uint64_t bytes) {
  counter_add(threads_[thread].totals.pkts_out, packets);
  counter_add(threads_[thread].totals.bytes_out, bytes);
  // The job may be gone by now (destroyed between ingest and send); then only totals count.
  if (Job* job = find_job(job_id)) {
    counter_add(job->per_thread[thread].counters.pkts_out, packets);
    counter_add(job->per_thread[thread].counters.bytes_out, bytes);
  }
}

// ---- the packet path (docs/protocol.md §3): ingest() and the steps of its message types ----

IngestResult Engine::ingest(unsigned thread, const uint8_t* packet, size_t len, uint64_t now_ns,
                            Endpoint from) {
  ThreadState& ts = threads_[thread];
  IngestResult r;
  Arrival a(ts, r, packet, len, now_ns, from);
  counter_add(ts.totals.pkts_in);
  counter_add(ts.totals.bytes_in, len);
  // Every message opens with the common header (docs/protocol.md §2): decoded here, once.
  if (len < GS_HEADER_BYTES) {
    a.drop(DropReason::kShortPacket);
    return r;
  }
  gs_header_decode(packet, &a.h);
  if (a.h.magic != GS_MAGIC) {
    a.drop(DropReason::kBadMagic);
  } else if (a.h.version != GS_VERSION) {
    a.drop(DropReason::kBadVersion);
  } else if (a.h.type == GS_MSG_DATA) {
    ingest_data(thread, a);
  } else if (config_.leaf &&
             (a.h.type == GS_MSG_RESULT || a.h.type == GS_MSG_ABORT || a.h.type == GS_MSG_HELD)) {
    ingest_from_spine(thread, a);  // engine_uplink.cpp
  } else {
    a.drop(DropReason::kBadType);
  }
  return r;
}

// §3.1, the release: `other` is the slot's other version, and the sender of `h` reached the round of
// `h`. A worker starts a slot's round only once it holds the result of the slot's previous round, which
// is in the other version when that holds an earlier round (it holds none earlier than the previous:
// the round of `h` was started by a rank holding the previous round's result).
void Engine::reached_next(SlotVersion& other, const gs_header& h) {
  if (other.owed && other.state.load(std::memory_order_relaxed) == RoundState::kComplete &&
      holds_earlier(other, h.seq, h.offset, h.count))
    other.owed &= ~(uint64_t{1} << h.rank);
}

// A rank's DATA: its contribution to the round of its slot version.
void Engine::ingest_data(unsigned thread, Arrival& a) {
  Job* job = admit_data(thread, a);
  if (!job) return;
  const gs_header& h = a.h;
  note_arrival(a, *job);

  const uint8_t version = h.flags & GS_FLAG_VERSION;
  SlotVersion& sv = job->slots[h.slot].version[version];
  const RoundState state = sv.state.load(std::memory_order_relaxed);
  const uint32_t held_seq = sv.seq.load(std::memory_order_relaxed);
  const uint32_t held_offset = sv.offset.load(std::memory_order_relaxed);
  const bool same_round = state != RoundState::kEmpty && h.seq == held_seq && h.offset == held_offset;
  // §3.1: the sender's arrival at this round, or at a newer one than the version holds (not a stale
  // resend), proves it holds the slot's previous round's result: that round stops waiting for it.
  if (job->spec.deadline_ns &&
      (same_round || state == RoundState::kEmpty ||
       (state == RoundState::kComplete && round_is_newer(h.seq, h.offset, held_seq, held_offset))))
    reached_next(job->slots[h.slot].version[version ^ 1], h);

  // 2. A retransmission of a completed round: the shadow copy answers it.
  if (same_round && state == RoundState::kComplete) {
    if (sv.seen.load(std::memory_order_relaxed) >> h.rank & 1)
      return answer_completed(a, *job, sv, GS_FLAG_DSACK);
    // 2'', a conceder (§3.1): it reached the round, but nothing of it is in the sum (no DSACK).
    if (sv.conceded.load(std::memory_order_relaxed) >> h.rank & 1) return answer_completed(a, *job, sv, 0);
    return answer_late(a, *job, sv);
  }
  // 3. An aborted job answers everything else with the reason, so workers fail fast.
  if (job->aborted.load(std::memory_order_acquire))
    return answer_abort(a, *job, h.rank, DropReason::kJobAborted, job->abort_reason, job->abort_rank);
  // 4. A round that needs a rank which left (LEAVE) can never complete.
  if (const uint64_t left = job->left.load(std::memory_order_seq_cst)) {
    const uint64_t needed = left & ~(same_round ? reached(sv) : 0);
    if (needed)
      return abort_everyone(a, *job, DropReason::kJobAborted, GS_ABORT_RANK_LEFT,
                            static_cast<uint16_t>(__builtin_ctzll(needed)), nullptr);
  }
  // 5. The slot version's round: join it or start it.
  if (same_round ? !join_round(a, *job, sv) : !open_round(a, sv, state, held_seq, held_offset)) return;
  if (sv.arrived < job->member_count) {
    // 6''. Every member reached it, some by conceding (§3.1): it closes now, without them; the
    // arrival that closed it is its completer, as for a default round.
    if (reached(sv) == job->members) {
      close_partial(thread, *job, h.slot, version, a.r, a.now_ns, h.rank);
      return;
    }
    return still_open(thread, a, *job, sv, !same_round);
  }
  // 6. Complete: up to the spine from a leaf, else the result to every rank.
  sv.completer = h.rank;
  sv.completed_by_resend = h.flags & GS_FLAG_RETX;
  if (job->spec.uplink) {
    send_up(thread, *job, h.slot, version, a.r);
    return;
  }
  complete_round(thread, a, *job, version);
}

// What the job's thread state learns from each of its DATA packets, and the result's addressing.
void Engine::note_arrival(Arrival& a, const Job& job) {
  const gs_header& h = a.h;
  IngestResult& r = a.r;
  JobThreadState& js = *a.js;
  r.src_rank = h.rank;
  r.endpoints = job.spec.endpoints.data();
  r.world = job.member_count;
  r.slot = h.slot;
  js.last_activity_ns.store(a.now_ns, std::memory_order_relaxed);
  std::atomic<int64_t>& rank_seq = js.rank_seq[h.rank];
  const int64_t last = rank_seq.load(std::memory_order_relaxed);
  if (last < 0 || seq_after(h.seq, static_cast<uint32_t>(last)))
    rank_seq.store(h.seq, std::memory_order_relaxed);
  js.clock.seen(h.seq, a.now_ns);
}

// 5b. The contribution went in and the round still lacks ranks.
void Engine::still_open(unsigned thread, Arrival& a, Job& job, SlotVersion& sv, bool opened) {
  const gs_header& h = a.h;
  IngestResult& r = a.r;
  const uint8_t version = h.flags & GS_FLAG_VERSION;
  // Bounded-time rounds (§3.1): the opening contribution starts the round's deadline, which the
  // backend's timer brings to close_overdue(); past it, the quorum's contribution closes the round.
  if (job.spec.deadline_ns) {
    if (sv.overdue && sv.arrived >= job.spec.quorum) {
      close_partial(thread, job, h.slot, version, r, a.now_ns);
      return;
    }
    if (opened) {
      r.deadline_ns = a.now_ns + job.spec.deadline_ns;
      r.seq = h.seq;
      r.version = version;
      r.offset = h.offset;
    }
  }
  r.kind = IngestResult::kAbsorbed;
  // A resend that the round lacked: the sender's timer found its loss, which the ranks the round
  // still lacks may not have done yet (their rounds sent at once, a peer's small window): tell them.
  if (h.flags & GS_FLAG_RETX) answer_held(a.ts, *a.js, job, h, sv, 0, a.now_ns, r);
}

// 1. Is it a DATA packet of a live job, from one of its ranks? The job, or nullptr when dropped.
Job* Engine::admit_data(unsigned thread, Arrival& a) {
  Job* job = find_job(a.h.job_id);
  if (!job) {
    a.drop(DropReason::kUnknownJob);
    return nullptr;
  }
  a.r.job_id = a.h.job_id;
  a.r.job_index = job->index;
  a.js = &job->per_thread[thread];
  counter_add(a.js->counters.pkts_in);
  counter_add(a.js->counters.bytes_in, a.len);
  if (const DropReason why = check_data(thread, a, *job); why != DropReason::kNone) {
    a.drop(why);
    return nullptr;
  }
  return job;
}

// 1, continued: is it well-formed, for this job? Sets the payload's element size and length.
DropReason Engine::check_data(unsigned thread, Arrival& a, const Job& job) const {
  const gs_header& h = a.h;
  const JobSpec& spec = job.spec;
  if (h.key != spec.key) return DropReason::kWrongKey;
  if (h.rank >= spec.world || !(job.members >> h.rank & 1)) return DropReason::kBadRank;
  // Only the rank's own address (its IP and UDP port) speaks for it: a packet with the right id and
  // key from elsewhere is a forgery or a stray (docs/security.md). A leaf switch sends from its data
  // threads' ports: for a rank it forwarded, the IP alone is checked.
  const Endpoint& own = spec.endpoints[job.endpoint_index[h.rank]];
  if (a.from.ipv4_be != own.ipv4_be ||
      (a.from.port_be != own.port_be && !(spec.source_ip_only >> h.rank & 1)))
    return DropReason::kBadSource;
  if (h.slot >= spec.slots) return DropReason::kSlotOutOfRange;
  if (thread_of_slot(h.slot) != thread) return DropReason::kWrongThread;
  a.elem_size = gs_elem_size(h.elem_type);  // 0 for unknown types, so the shift is < 32
  if (a.elem_size == 0 || !(job.elem_types >> h.elem_type & 1)) return DropReason::kBadElemType;
  a.payload_len = gs_payload_bytes(h.elem_type, h.count);
  // A concession (§3.1) is the header alone, and only a job with a deadline takes one.
  a.concede = (h.flags & GS_FLAG_CONCEDE) != 0;
  const size_t body = a.concede ? 0 : a.payload_len;
  // At most a full chunk: for mx8 a count whose bytes would fit (a partial block) may still exceed the
  // elements the fp32 accumulator holds.
  if (h.count > gs_max_count(h.elem_type, spec.payload_bytes) || a.len != GS_HEADER_BYTES + body ||
      (a.concede && !spec.deadline_ns))
    return DropReason::kBadLength;
  if (const Optimizer* opt = job.optimizer.get()) {
    // Each chunk must map onto whole parameters so that its step is applied exactly once.
    const uint32_t chunk = spec.payload_bytes / 4;
    if (h.offset % chunk != 0 || uint64_t{h.offset} + h.count > opt->spec().params)
      return DropReason::kBadOffset;
  }
  // A rank that left (LEAVE) contributes nothing more, and its retransmissions get no answer.
  if (job.left.load(std::memory_order_relaxed) >> h.rank & 1) return DropReason::kRankLeft;
  return DropReason::kNone;
}

// 2. A retransmission of a completed round, from a worker whose result was lost: the shadow copy
//    answers it alone, even in an aborted job (the round's sum is right; only later ones fail).
//    Without RETX it is a copy the network made of a contribution the round already counted:
//    answering it would amplify the duplication (and split the thread's runs of results).
void Engine::answer_completed(Arrival& a, const Job& job, SlotVersion& sv, uint8_t held) {
  if (!(a.h.flags & GS_FLAG_RETX)) {
    counter_add(a.js->counters.duplicates);
    counter_add(a.ts.totals.duplicates);
    a.r.kind = IngestResult::kAbsorbed;
    return;
  }
  counter_add(a.js->counters.retx_answered);
  counter_add(a.ts.totals.retx_answered);
  // `held`: DSACK when the round holds the sender's contribution, 0 for a conceder (answer_late
  // answers the others).
  answer_from_shadow(a, job, sv, static_cast<uint8_t>(held | (sv.partial ? GS_FLAG_PARTIAL : 0)));
}

// The shadow copy, to the sender alone: UNICAST and `flags` with the sender's version.
void Engine::answer_from_shadow(Arrival& a, const Job& job, SlotVersion& sv, uint8_t flags) {
  sv.result[offsetof(gs_header, flags)] =
      static_cast<uint8_t>((a.h.flags & GS_FLAG_VERSION) | GS_FLAG_UNICAST | flags);
  IngestResult& r = a.r;
  r.kind = IngestResult::kSend;
  r.dest_rank = job.endpoint_index[a.h.rank];
  r.data = sv.result;
  r.len = result_len(sv);
  r.type = GS_MSG_RESULT;
  r.seq = a.h.seq;
  r.count = sv.count;
}

// 2', for a round its deadline closed without the sender (§3.1): the contribution is dropped (late),
//    and the sender gets the round's result, so that every rank holds the same values. Once per
//    owed rank unless it is a resend: a copy the network made of a late DATA is not answered again.
//    The sender stays owed: the answer may be lost, and only its arrival at the slot's next round
//    shows that it holds the result.
void Engine::answer_late(Arrival& a, const Job& job, SlotVersion& sv) {
  const uint64_t bit = uint64_t{1} << a.h.rank;
  const bool first = (sv.owed & bit) && !(sv.late & bit);
  sv.late |= bit;
  a.drop(DropReason::kLate);
  if (first || (a.h.flags & GS_FLAG_RETX)) answer_from_shadow(a, job, sv, GS_FLAG_PARTIAL);
}

// An ABORT with the reason, to the sender (`dest`, a rank) or, when this packet aborted the job, to
// every rank (GS_RANK_ALL), so that none of them waits for its timeout.
void Engine::answer_abort(Arrival& a, const Job& job, uint16_t dest, DropReason why, uint8_t reason,
                          uint16_t at_fault) {
  const gs_header& h = a.h;
  HeaderBuilder(GS_MSG_ABORT, h.job_id, job.spec.key)
      .rank(at_fault)
      .slot(h.slot)
      .round(h.seq, h.offset)
      .exps(static_cast<int8_t>(reason), 0)
      .encode(a.ts.abort_packet);
  a.drop(why);
  IngestResult& r = a.r;
  r.kind = IngestResult::kSend;
  r.dest_rank = dest == GS_RANK_ALL ? dest : job.endpoint_index[dest];
  r.data = a.ts.abort_packet;
  r.len = GS_HEADER_BYTES;
  r.type = GS_MSG_ABORT;
  r.seq = h.seq;
}

void Engine::abort_everyone(Arrival& a, Job& job, DropReason why, uint8_t reason, uint16_t at_fault,
                            const Mismatch* m) {
  // Another thread (or the control plane) may have aborted the job first: report its reason.
  if (!job.try_abort(reason, at_fault, m) && job.aborted.load(std::memory_order_acquire)) {
    reason = job.abort_reason;
    at_fault = job.abort_rank;
  }
  answer_abort(a, job, GS_RANK_ALL, why, reason, at_fault);
}

// The kernels read the payload as elements, aligned to their size; after a 42-byte L2-L4 header
// (the DPDK backend) it is not, and is copied aligned first. Only when read as elements: a round's
// first contribution of 4- or 8-byte elements is a plain byte copy and needs no aligned copy.
const uint8_t* Engine::aligned_payload(Arrival& a) {
  const uint8_t* raw = a.packet + GS_HEADER_BYTES;
  if (reinterpret_cast<uintptr_t>(raw) % a.elem_size == 0) return raw;
  std::memcpy(a.ts.aligned_payload, raw, a.payload_len);
  return a.ts.aligned_payload;
}

// 5a. A contribution (or a concession, §3.1) to the open round of its slot version: summed (noted),
//     or (false) answered instead: a duplicate, or a disagreement on the allreduce that aborts the job.
bool Engine::join_round(Arrival& a, Job& job, SlotVersion& sv) {
  const gs_header& h = a.h;
  const uint64_t bit = uint64_t{1} << h.rank;
  const bool ends_tensor = (h.flags & GS_FLAG_LAST) != 0;
  if (reached(sv) & bit) {  // a contributor's or a conceder's second arrival
    counter_add(a.js->counters.duplicates);
    counter_add(a.ts.totals.duplicates);
    a.r.kind = IngestResult::kAbsorbed;
    if (!(h.flags & GS_FLAG_RETX)) return false;  // a network duplicate: answering would amplify it
    // A resend of a contribution the open round holds: tell the sender that nothing was lost and
    // that the round waits for other ranks, so it can undo, and those ranks that the round waits
    // for them (docs/protocol.md section 3).
    counter_add(a.js->counters.held_answered);
    counter_add(a.ts.totals.held_answered);
    answer_held(a.ts, *a.js, job, h, sv, bit, a.now_ns, a.r);
    return false;
  }
  // scale_exp means something only for fixed32 (docs/protocol.md §2): other types ignore it.
  if (h.count != sv.count || h.elem_type != sv.elem_type ||
      (h.elem_type == GS_ELEM_FIXED32 && h.scale_exp != sv.scale_exp) || ends_tensor != sv.last) {
    // The ranks disagree on this allreduce (tensor lengths, types): it can never complete.
    Mismatch m;
    m.seq = h.seq;
    m.offset = h.offset;
    m.held = {static_cast<uint16_t>(__builtin_ctzll(reached(sv))), sv.count, sv.elem_type, sv.scale_exp,
              sv.last};
    m.arriving = {h.rank, h.count, h.elem_type, h.scale_exp, ends_tensor};
    abort_everyone(a, job, DropReason::kInconsistent, GS_ABORT_MISMATCH, h.rank, &m);
    return false;
  }
  if (h.next_exp > sv.next_exp) sv.next_exp = h.next_exp;
  sv.min_window = gs_smaller_window(sv.min_window, h.window);
  if (a.concede) {
    concede(a, sv);
    return true;
  }
  add_payload(a, sv);
  sv.seen.store(sv.seen.load(std::memory_order_relaxed) | bit, std::memory_order_relaxed);
  ++sv.arrived;
  return true;
}

// 5a, the sum: the DATA's payload added into the round's.
void Engine::add_payload(Arrival& a, SlotVersion& sv) {
  const gs_header& h = a.h;
  uint8_t* sum = sv.result + GS_HEADER_BYTES;
  const uint8_t* payload = aligned_payload(a);
  const Kernels& k = kernels();
  switch (h.elem_type) {
    case GS_ELEM_FLOAT32:
      k.add_f32(reinterpret_cast<float*>(sum), reinterpret_cast<const float*>(payload), h.count);
      break;
    case GS_ELEM_INT32:
    case GS_ELEM_FIXED32:
      k.add_i32(reinterpret_cast<int32_t*>(sum), reinterpret_cast<const int32_t*>(payload), h.count);
      break;
    case GS_ELEM_FLOAT16:
    case GS_ELEM_BFLOAT16:
    case GS_ELEM_MX8:
      widen_into_fp32(h.elem_type, sv.accum, payload, h.count, true);
      break;
    case GS_ELEM_FLOAT64:
      k.add_f64(reinterpret_cast<double*>(sum), reinterpret_cast<const double*>(payload), h.count);
      break;
  }
}

// 5a', a concession (§3.1): the sender reached the round without contributing; nothing is summed and
//      `arrived` (the contributions, which the quorum counts) stays.
void Engine::concede(Arrival& a, SlotVersion& sv) {
  const uint64_t bit = uint64_t{1} << a.h.rank;
  sv.conceded.store(sv.conceded.load(std::memory_order_relaxed) | bit, std::memory_order_relaxed);
  counter_add(a.js->counters.conceded);
  counter_add(a.ts.totals.conceded);
}

// 5b. The first contribution to a new round of its slot version, which initialises it (no zeroing
//     pass, except for a concession, which contributes nothing); false when dropped as stale or pinned.
bool Engine::open_round(Arrival& a, SlotVersion& sv, RoundState state, uint32_t held_seq,
                        uint32_t held_offset) {
  const gs_header& h = a.h;
  // A new round may replace an empty or completed one, never an open one (nor one that waits for
  // the spine), and never with an older round: both are stale packets.
  if (state == RoundState::kOpen || state == RoundState::kUplink ||
      (state == RoundState::kComplete && !round_is_newer(h.seq, h.offset, held_seq, held_offset))) {
    a.drop(DropReason::kStaleRound);
    return false;
  }
  if (sv.owed) {
    // The shadow copy is the only place its owed ranks' result is (§3.1). A rank that sends a newer
    // round here holds that result (it reuses a version only after its result).
    sv.owed &= ~(uint64_t{1} << h.rank);
    if (sv.owed) {
      a.drop(DropReason::kPinned);
      return false;
    }
  }
  sv.count = h.count;
  sv.elem_type = h.elem_type;
  sv.scale_exp = h.scale_exp;
  sv.next_exp = h.next_exp;
  sv.min_window = h.window;
  sv.last = (h.flags & GS_FLAG_LAST) != 0;
  sv.arrived = 0;
  sv.seen.store(0, std::memory_order_relaxed);
  sv.conceded.store(0, std::memory_order_relaxed);
  sv.seq.store(h.seq, std::memory_order_relaxed);
  sv.offset.store(h.offset, std::memory_order_relaxed);
  sv.opened_ns.store(a.now_ns, std::memory_order_relaxed);
  sv.told_ns = 0;
  sv.overdue = false;
  sv.partial = false;
  sv.late = 0;
  if (a.concede) {
    // A concession opens the round with nothing summed (§3.1): the sum starts at zero.
    if (sums_in_fp32(h.elem_type))
      std::memset(sv.accum, 0, size_t{h.count} * sizeof(float));
    else
      std::memset(sv.result + GS_HEADER_BYTES, 0, a.payload_len);
    concede(a, sv);
  } else {
    if (sums_in_fp32(h.elem_type))
      widen_into_fp32(h.elem_type, sv.accum, aligned_payload(a), h.count, false);
    else
      std::memcpy(sv.result + GS_HEADER_BYTES, a.packet + GS_HEADER_BYTES, a.payload_len);
    sv.arrived = 1;
    sv.seen.store(uint64_t{1} << h.rank, std::memory_order_relaxed);
  }
  sv.state.store(RoundState::kOpen, std::memory_order_relaxed);
  return true;
}

void widen_into_fp32(uint8_t elem_type, float* accum, const uint8_t* payload, size_t count, bool add) {
  const Kernels& k = kernels();
  const auto* p16 = reinterpret_cast<const uint16_t*>(payload);  // aligned_payload: 2-byte aligned
  switch (elem_type) {
    case GS_ELEM_FLOAT16:
      (add ? k.add_f16_to_f32 : k.f16_to_f32)(accum, p16, count);
      break;
    case GS_ELEM_BFLOAT16:
      (add ? k.add_bf16_to_f32 : k.bf16_to_f32)(accum, p16, count);
      break;
    case GS_ELEM_MX8:
      (add ? k.add_mx8_to_f32 : k.mx8_to_f32)(accum, payload, count);
      break;
  }
}

void narrow_from_fp32(uint8_t elem_type, uint8_t* payload, const float* accum, size_t count) {
  const Kernels& k = kernels();
  auto* p16 = reinterpret_cast<uint16_t*>(payload);
  switch (elem_type) {
    case GS_ELEM_FLOAT16:
      k.f32_to_f16(p16, accum, count);
      break;
    case GS_ELEM_BFLOAT16:
      k.f32_to_bf16(p16, accum, count);
      break;
    case GS_ELEM_MX8:
      k.f32_to_mx8(payload, accum, count);
      break;
  }
}

// 6. A complete round (not a leaf's): narrows 16-bit sums, runs the optimizer's step, and publishes
//    the result, which stays as the shadow copy.
void Engine::complete_round(unsigned thread, Arrival& a, Job& job, uint8_t version) {
  finish_round(thread, job, a.h.slot, version, a.r, a.now_ns);
}

IngestResult& Engine::finish_round(unsigned thread, Job& job, uint16_t slot, uint8_t version, IngestResult& r,
                                   uint64_t now_ns) {
  SlotVersion& sv = job.slots[slot].version[version];
  if (sums_in_fp32(sv.elem_type))
    narrow_from_fp32(sv.elem_type, sv.result + GS_HEADER_BYTES, sv.accum, sv.count);
  if (job.optimizer && sv.count > 0) {
    // The sum becomes the step's gradient; the result (and so the shadow copy) carries the new
    // parameters, which is why a retransmission can never apply the step twice.
    auto* sum = reinterpret_cast<float*>(sv.result + GS_HEADER_BYTES);
    job.optimizer->step(sv.offset.load(std::memory_order_relaxed), sv.count, sum, job.spec.world, sum);
  }
  return publish_result(thread, job, slot, version, r, now_ns);
}

IngestResult& Engine::close_partial(unsigned thread, Job& job, uint16_t slot, uint8_t version,
                                    IngestResult& r, uint64_t now_ns, uint16_t completer) {
  SlotVersion& sv = job.slots[slot].version[version];
  // §3.1, the pins. The members that did not reach the round, and its conceders, still need its result.
  const uint64_t unreached = job.members & ~reached(sv);
  sv.owed |= job.members & ~sv.seen.load(std::memory_order_relaxed);
  // A member that did not reach it has not shown that it holds the slot's previous round either
  // (the other version's, when that holds an older round: reached_next()), whose result it may have lost.
  SlotVersion& previous = job.slots[slot].version[version ^ 1];
  if (unreached && previous.state.load(std::memory_order_relaxed) == RoundState::kComplete &&
      holds_earlier(previous, sv.seq.load(std::memory_order_relaxed),
                    sv.offset.load(std::memory_order_relaxed), sv.count))
    previous.owed |= unreached;
  sv.partial = true;
  sv.completer = completer;
  sv.completed_by_resend = false;
  const auto missing = static_cast<uint64_t>(__builtin_popcountll(unreached));
  JobThreadState& js = job.per_thread[thread];
  counter_add(js.counters.partial);
  counter_add(threads_[thread].totals.partial);
  counter_add(js.counters.missed, missing);
  counter_add(threads_[thread].totals.missed, missing);
  return finish_round(thread, job, slot, version, r, now_ns);
}

IngestResult Engine::close_overdue(unsigned thread, uint32_t job_id, uint16_t slot, uint8_t version,
                                   uint32_t seq, uint32_t offset, uint64_t now_ns) {
  IngestResult r;
  Job* job = find_job(job_id);
  if (!job || slot >= job->spec.slots || version > 1 || thread_of_slot(slot) != thread) return r;
  if (!job->spec.deadline_ns) return r;  // every round of a job without a deadline waits for every rank
  r.job_id = job_id;
  r.job_index = job->index;
  r.kind = IngestResult::kAbsorbed;
  SlotVersion& sv = job->slots[slot].version[version];
  // Completed meanwhile, or another round now; an aborted job answers its ranks' DATA with ABORT.
  if (sv.state.load(std::memory_order_relaxed) != RoundState::kOpen ||
      sv.seq.load(std::memory_order_relaxed) != seq || sv.offset.load(std::memory_order_relaxed) != offset ||
      job->aborted.load(std::memory_order_acquire))
    return r;
  if (sv.arrived < job->spec.quorum) {
    sv.overdue = true;
    return r;
  }
  return close_partial(thread, *job, slot, version, r, now_ns);
}

IngestResult& Engine::answer_held(ThreadState& ts, JobThreadState& js, const Job& job, const gs_header& h,
                                  SlotVersion& sv, uint64_t sender_bit, uint64_t now_ns, IngestResult& r) {
  const uint64_t seen = reached(sv);  // the contributors and the conceders (§3.1)
  uint64_t lacking = job.members & ~seen;
  // Only a round open for kAskAfterNs asks: sooner, the lacking rank's own detector is still on it,
  // or its DATA is still queued on the way (a request then costs a redundant resend, on the
  // bottleneck link). One loss makes every other rank resend at about the same time: one HELD tells
  // the lacking ranks, the next ones only after kRetellNs (the first may be lost, or its resend).
  const uint64_t opened = sv.opened_ns.load(std::memory_order_relaxed);
  if (now_ns - opened < kAskAfterNs || (sv.told_ns != 0 && now_ns - sv.told_ns < kRetellNs)) lacking = 0;
  const uint64_t to = sender_bit | lacking;
  if (to == 0) return r;  // absorbed: told recently, or a leaf's round that waits for its spine
  if (lacking) {
    sv.told_ns = now_ns;
    const auto told = static_cast<uint64_t>(__builtin_popcountll(lacking));
    counter_add(js.counters.lacking_told, told);
    counter_add(ts.totals.lacking_told, told);
  }
  HeaderBuilder(GS_MSG_HELD, h.job_id, job.spec.key)
      .rank(GS_RANK_ALL)
      .slot(h.slot)
      .flags(static_cast<uint8_t>((h.flags & GS_FLAG_VERSION) | (sender_bit ? GS_FLAG_DSACK : 0)))
      .elems(sv.elem_type, 0)
      .round(h.seq, h.offset)
      .encode(ts.held_packet);
  gs_held_set_contributors(seen, ts.held_packet + GS_HEADER_BYTES);
  uint64_t dest = 0;
  for (uint64_t m = to; m; m &= m - 1) dest |= uint64_t{1} << job.endpoint_index[__builtin_ctzll(m)];
  r.kind = IngestResult::kSend;
  r.dest_rank = GS_RANK_ALL;
  r.dest_mask = dest;
  r.data = ts.held_packet;
  r.len = GS_HEADER_BYTES + GS_HELD_BODY_BYTES;
  r.type = GS_MSG_HELD;
  r.seq = h.seq;
  return r;
}

IngestResult& Engine::publish_result(unsigned thread, Job& job, uint16_t slot, uint8_t version,
                                     IngestResult& r, uint64_t now_ns) {
  SlotVersion& sv = job.slots[slot].version[version];
  const uint32_t seq = sv.seq.load(std::memory_order_relaxed);
  HeaderBuilder(GS_MSG_RESULT, job.id, job.spec.key)
      .rank(sv.completer)
      .slot(slot)
      .flags(static_cast<uint8_t>(version | (sv.completed_by_resend ? GS_FLAG_RETX : 0) |
                                  (sv.partial ? GS_FLAG_PARTIAL : 0)))
      .elems(sv.elem_type, sv.count)
      .round(seq, sv.offset.load(std::memory_order_relaxed))
      .exps(sv.next_exp, sv.scale_exp)
      .window(sv.min_window)
      .encode(sv.result);
  if (sv.partial)
    gs_held_set_contributors(sv.seen.load(std::memory_order_relaxed),
                             sv.result + GS_HEADER_BYTES + gs_payload_bytes(sv.elem_type, sv.count));
  sv.state.store(RoundState::kComplete, std::memory_order_relaxed);
  counter_add(job.per_thread[thread].counters.completed);
  counter_add(threads_[thread].totals.completed);
  JobThreadState& js = job.per_thread[thread];
  if (const uint64_t opened = sv.opened_ns.load(std::memory_order_relaxed); opened && now_ns >= opened) {
    js.round_times.observe(now_ns - opened);
    threads_[thread].round_times.observe(now_ns - opened);
  }
  if (sv.last && sv.count > 0)  // the tensor's last chunk (fixed32: its data round, not the exponent's)
    if (const uint64_t took = js.clock.finish(seq, now_ns)) {
      js.allreduce_times.observe(took);
      threads_[thread].allreduce_times.observe(took);
    }
  r.kind = IngestResult::kSend;
  r.dest_rank = GS_RANK_ALL;
  r.data = sv.result;
  r.len = result_len(sv);
  r.endpoints = job.spec.endpoints.data();
  r.world = job.member_count;
  r.type = GS_MSG_RESULT;
  r.seq = seq;
  r.count = sv.count;
  r.slot = slot;
  return r;
}

}  // namespace gradswitch
