// A leaf switch's side of two-level aggregation (docs/protocol.md §8): a round complete in the rack
// goes up to the spine as one rank's DATA, and the spine's RESULT comes back down to the rack's
// members as the round's result and shadow copy. Like the rest of the engine: no I/O, no clock, no
// allocation; the loss timers of the packets that went up live in the I/O side (src/switch/uplink).
#include <cstring>

#include "common/counter.h"
#include "common/header.h"
#include "switch/engine/engine.h"
#include "switch/engine/job.h"

namespace gradswitch {

namespace {

// Where a round's packet to the spine starts: the result buffer (its sum is the payload in place),
// or for fp32-summed types the header room before the fp32 accumulator.
uint8_t* uplink_packet(SlotVersion& sv) {
  return sums_in_fp32(sv.elem_type) ? reinterpret_cast<uint8_t*>(sv.accum) - GS_HEADER_BYTES : sv.result;
}

}  // namespace

Job* Engine::find_uplink_job(uint32_t spine_job_id) const {
  std::atomic<Job*>* b = bucket_of(uplink_buckets_.get(), spine_job_id);
  for (unsigned w = 0; w < kWays; ++w) {
    Job* job = b[w].load(std::memory_order_acquire);
    if (job && job->spec.uplink->job_id == spine_job_id) return job;
  }
  return nullptr;
}

IngestResult& Engine::send_up(unsigned thread, Job& job, uint16_t slot, uint8_t version, IngestResult& r) {
  SlotVersion& sv = job.slots[slot].version[version];
  const UplinkSpec& up = *job.spec.uplink;
  HeaderBuilder(GS_MSG_DATA, up.job_id, up.key)
      .rank(up.rank)
      .slot(slot)
      .flags(static_cast<uint8_t>(version | (sv.last ? GS_FLAG_LAST : 0)))
      .elems(uplink_elem_type(sv.elem_type), sv.count)
      .round(sv.seq.load(std::memory_order_relaxed), sv.offset.load(std::memory_order_relaxed))
      .exps(sv.next_exp, sv.scale_exp)  // the rack's maximum: the spine takes the maximum over the racks
      .window(sv.min_window)            // the rack's smallest: the spine takes the smallest over the racks
      .encode(uplink_packet(sv));
  sv.state.store(RoundState::kUplink, std::memory_order_relaxed);
  counter_add(job.per_thread[thread].counters.sent_up);
  counter_add(threads_[thread].totals.sent_up);
  return going_up(job, slot, sv, r);
}

IngestResult& Engine::going_up(const Job& job, uint16_t slot, SlotVersion& sv, IngestResult& r) {
  const UplinkSpec& up = *job.spec.uplink;
  r.kind = IngestResult::kSend;
  r.dest_rank = GS_RANK_ALL;
  r.data = uplink_packet(sv);
  r.len = static_cast<uint32_t>(GS_HEADER_BYTES + gs_payload_bytes(uplink_elem_type(sv.elem_type), sv.count));
  r.endpoints = &up.data_threads[slot % up.data_threads.size()];
  r.world = 1;
  r.type = GS_MSG_DATA;
  r.seq = sv.seq.load(std::memory_order_relaxed);
  r.count = sv.count;
  r.slot = slot;
  return r;
}

IngestResult Engine::uplink_resend(unsigned thread, uint32_t job_id, uint16_t slot) {
  IngestResult r;
  Job* job = find_job(job_id);
  if (!job || !job->spec.uplink || slot >= job->spec.slots || thread_of_slot(slot) != thread) return r;
  r.job_id = job_id;
  r.job_index = job->index;
  for (uint8_t version = 0; version < 2; ++version) {
    SlotVersion& sv = job->slots[slot].version[version];
    if (sv.state.load(std::memory_order_relaxed) != RoundState::kUplink) continue;
    uplink_packet(sv)[offsetof(gs_header, flags)] |= GS_FLAG_RETX;
    counter_add(job->per_thread[thread].counters.resent_up);
    counter_add(threads_[thread].totals.resent_up);
    return going_up(*job, slot, sv, r);
  }
  return r;
}

// The spine's RESULT, ABORT or HELD (Engine::ingest dispatches them here on a leaf): it must name a
// leaf job's spine job, with its key, and come from one of the spine's data ports.
void Engine::ingest_from_spine(unsigned thread, Arrival& a) {
  const gs_header& h = a.h;
  IngestResult& r = a.r;
  r.from_spine = true;
  Job* job = find_uplink_job(h.job_id);
  if (!job) return a.drop(DropReason::kUnknownJob);
  const UplinkSpec& up = *job->spec.uplink;
  r.job_id = job->id;
  r.job_index = job->index;
  a.js = &job->per_thread[thread];
  counter_add(a.js->counters.pkts_in);
  counter_add(a.js->counters.bytes_in, a.len);
  if (h.key != up.key) return a.drop(DropReason::kWrongKey);
  bool from_spine = false;
  for (const Endpoint& e : up.data_threads)
    from_spine |= e.ipv4_be == a.from.ipv4_be && e.port_be == a.from.port_be;
  if (!from_spine) return a.drop(DropReason::kBadSource);
  a.js->last_activity_ns.store(a.now_ns, std::memory_order_relaxed);
  if (h.type == GS_MSG_HELD) {
    // The spine holds the rack's resent partial sum: the round waits for other racks. The leaf's
    // own resend timer keeps running (the spine's RESULT may still be lost).
    r.kind = IngestResult::kAbsorbed;
    return;
  }
  if (h.type == GS_MSG_ABORT) return abort_from_spine(a, *job);
  result_from_spine(thread, a, *job);
}

// The spine ended its job: so ends the rack's, and every member learns it now (with the reason of
// whichever abort came first, when the rack's job had ended already).
void Engine::abort_from_spine(Arrival& a, Job& job) {
  const gs_header& h = a.h;
  job.try_abort(GS_ABORT_UPLINK, GS_RANK_ALL, nullptr, static_cast<uint8_t>(h.next_exp), h.rank);
  HeaderBuilder(GS_MSG_ABORT, job.id, job.spec.key)
      .rank(job.abort_rank)
      .slot(h.slot)
      .round(h.seq, h.offset)
      .exps(static_cast<int8_t>(job.abort_reason), 0)
      .encode(a.ts.abort_packet);
  a.drop(DropReason::kJobAborted);
  IngestResult& r = a.r;
  r.kind = IngestResult::kSend;
  r.dest_rank = GS_RANK_ALL;
  r.data = a.ts.abort_packet;
  r.len = GS_HEADER_BYTES;
  r.endpoints = job.spec.endpoints.data();
  r.world = job.member_count;
  r.type = GS_MSG_ABORT;
  r.seq = h.seq;
  r.slot = h.slot;
}

// The spine's RESULT of a round the rack sent up: it becomes the rack's result and shadow copy.
void Engine::result_from_spine(unsigned thread, Arrival& a, Job& job) {
  const gs_header& h = a.h;
  if (h.slot >= job.spec.slots) return a.drop(DropReason::kSlotOutOfRange);
  if (thread_of_slot(h.slot) != thread) return a.drop(DropReason::kWrongThread);
  const uint8_t version = h.flags & GS_FLAG_VERSION;
  SlotVersion& sv = job.slots[h.slot].version[version];
  // Only the round that waits for it: anything else is a second answer (the spine answered a
  // resend and the multicast both) or an old one.
  if (sv.state.load(std::memory_order_relaxed) != RoundState::kUplink ||
      h.seq != sv.seq.load(std::memory_order_relaxed) ||
      h.offset != sv.offset.load(std::memory_order_relaxed))
    return a.drop(DropReason::kUplinkStale);
  const uint8_t elem = uplink_elem_type(sv.elem_type);
  const size_t elem_size = gs_elem_size(elem);
  if (h.elem_type != elem || h.count != sv.count || a.len != GS_HEADER_BYTES + size_t{h.count} * elem_size ||
      (elem == GS_ELEM_FIXED32 && h.scale_exp != sv.scale_exp))
    return a.drop(DropReason::kBadLength);

  const uint8_t* payload = a.packet + GS_HEADER_BYTES;
  const size_t payload_len = size_t{h.count} * elem_size;
  if (reinterpret_cast<uintptr_t>(payload) % elem_size != 0) {
    std::memcpy(a.ts.aligned_payload, payload, payload_len);
    payload = a.ts.aligned_payload;
  }
  uint8_t* out = sv.result + GS_HEADER_BYTES;
  if (sums_in_fp32(sv.elem_type))
    narrow_from_fp32(sv.elem_type, out, reinterpret_cast<const float*>(payload), h.count);
  else
    std::memcpy(out, payload, payload_len);
  sv.next_exp = h.next_exp;  // the maximum over every rack
  sv.min_window = h.window;  // the smallest over every rack
  // The rack's last contribution completed the round only if the rack completed the spine's; else
  // the spine's RESULT says whether a resend (of another rack) completed it.
  if (h.rank != job.spec.uplink->rank) {
    sv.completer = GS_RANK_ALL;
    sv.completed_by_resend = h.flags & GS_FLAG_RETX;
  }
  publish_result(thread, job, h.slot, version, a.r, a.now_ns);
}

}  // namespace gradswitch
