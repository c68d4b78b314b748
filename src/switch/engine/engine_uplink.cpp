// A leaf switch's side of two-level aggregation (docs/protocol.md §8): a round complete in the rack
// goes up to the spine as one rank's DATA, and the spine's RESULT comes back down to the rack's
// members as the round's result and shadow copy. Like the rest of the engine: no I/O, no clock, no
// allocation; the loss timers of the packets that went up live in the I/O side (src/switch/uplink).
#include <cstring>

#include "common/counter.h"
#include "common/header.h"
#include "common/kernels.h"
#include "switch/engine/engine.h"
#include "switch/engine/job.h"

namespace gradswitch {

namespace {

// Where a round's packet to the spine starts: the result buffer (its sum is the payload in place),
// or for 16-bit types the header room before the fp32 accumulator.
uint8_t* uplink_packet(SlotVersion& sv) {
  return is_16bit(sv.elem_type) ? reinterpret_cast<uint8_t*>(sv.accum) - GS_HEADER_BYTES : sv.result;
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

IngestResult Engine::send_up(unsigned thread, Job& job, uint16_t slot, uint8_t version, IngestResult& r) {
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
  r.len = static_cast<uint32_t>(GS_HEADER_BYTES +
                                size_t{sv.count} * gs_elem_size(uplink_elem_type(sv.elem_type)));
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

IngestResult Engine::ingest_uplink(unsigned thread, const uint8_t* packet, size_t len, const Endpoint& source,
                                   uint64_t now_ns) {
  ThreadState& ts = threads_[thread];
  IngestResult r;
  counter_add(ts.totals.pkts_in);
  counter_add(ts.totals.bytes_in, len);
  JobThreadState* js = nullptr;
  auto drop = [&](DropReason why) {
    ts.totals.drop(why);
    if (js) js->counters.drop(why);
    r.kind = IngestResult::kDropped;
    r.reason = why;
    return r;
  };
  if (len < GS_HEADER_BYTES) return drop(DropReason::kShortPacket);
  gs_header h;
  gs_header_decode(packet, &h);
  if (h.magic != GS_MAGIC) return drop(DropReason::kBadMagic);
  if (h.version != GS_VERSION) return drop(DropReason::kBadVersion);
  if (h.type != GS_MSG_RESULT && h.type != GS_MSG_ABORT && h.type != GS_MSG_HELD)
    return drop(DropReason::kBadType);
  Job* job = find_uplink_job(h.job_id);
  if (!job) return drop(DropReason::kUnknownJob);
  const JobSpec& spec = job->spec;
  const UplinkSpec& up = *spec.uplink;
  r.job_id = job->id;
  r.job_index = job->index;
  js = &job->per_thread[thread];
  counter_add(js->counters.pkts_in);
  counter_add(js->counters.bytes_in, len);
  if (h.key != up.key) return drop(DropReason::kWrongKey);
  bool from_spine = false;
  for (const Endpoint& e : up.data_threads)
    from_spine |= e.ipv4_be == source.ipv4_be && e.port_be == source.port_be;
  if (!from_spine) return drop(DropReason::kBadSource);
  js->last_activity_ns.store(now_ns, std::memory_order_relaxed);
  if (h.type == GS_MSG_HELD) {
    // The spine holds the rack's resent partial sum: the round waits for other racks. The leaf's
    // own resend timer keeps running (the spine's RESULT may still be lost).
    r.kind = IngestResult::kAbsorbed;
    return r;
  }

  if (h.type == GS_MSG_ABORT) {
    // The spine ended its job: so ends the rack's, and every member learns it now (with the reason
    // of whichever abort came first, when the rack's job had ended already).
    job->try_abort(GS_ABORT_UPLINK, GS_RANK_ALL, nullptr, static_cast<uint8_t>(h.next_exp), h.rank);
    HeaderBuilder(GS_MSG_ABORT, job->id, spec.key)
        .rank(job->abort_rank)
        .slot(h.slot)
        .round(h.seq, h.offset)
        .exps(static_cast<int8_t>(job->abort_reason), 0)
        .encode(ts.abort_packet);
    drop(DropReason::kJobAborted);
    r.kind = IngestResult::kSend;
    r.dest_rank = GS_RANK_ALL;
    r.data = ts.abort_packet;
    r.len = GS_HEADER_BYTES;
    r.endpoints = spec.endpoints.data();
    r.world = job->member_count;
    r.type = GS_MSG_ABORT;
    r.seq = h.seq;
    r.slot = h.slot;
    return r;
  }

  if (h.slot >= spec.slots) return drop(DropReason::kSlotOutOfRange);
  if (thread_of_slot(h.slot) != thread) return drop(DropReason::kWrongThread);
  const uint8_t version = h.flags & GS_FLAG_VERSION;
  SlotVersion& sv = job->slots[h.slot].version[version];
  // Only the round that waits for it: anything else is a second answer (the spine answered a
  // resend and the multicast both) or an old one.
  if (sv.state.load(std::memory_order_relaxed) != RoundState::kUplink ||
      h.seq != sv.seq.load(std::memory_order_relaxed) ||
      h.offset != sv.offset.load(std::memory_order_relaxed))
    return drop(DropReason::kUplinkStale);
  const uint8_t elem = uplink_elem_type(sv.elem_type);
  const size_t elem_size = gs_elem_size(elem);
  if (h.elem_type != elem || h.count != sv.count || len != GS_HEADER_BYTES + size_t{h.count} * elem_size ||
      (elem == GS_ELEM_FIXED32 && h.scale_exp != sv.scale_exp))
    return drop(DropReason::kBadLength);

  const uint8_t* payload = packet + GS_HEADER_BYTES;
  const size_t payload_len = size_t{h.count} * elem_size;
  if (reinterpret_cast<uintptr_t>(payload) % elem_size != 0) {
    std::memcpy(ts.aligned_payload, payload, payload_len);
    payload = ts.aligned_payload;
  }
  uint8_t* out = sv.result + GS_HEADER_BYTES;
  const Kernels& k = kernels();
  if (sv.elem_type == GS_ELEM_FLOAT16)
    k.f32_to_f16(reinterpret_cast<uint16_t*>(out), reinterpret_cast<const float*>(payload), h.count);
  else if (sv.elem_type == GS_ELEM_BFLOAT16)
    k.f32_to_bf16(reinterpret_cast<uint16_t*>(out), reinterpret_cast<const float*>(payload), h.count);
  else
    std::memcpy(out, payload, payload_len);
  sv.next_exp = h.next_exp;  // the maximum over every rack
  sv.min_window = h.window;  // the smallest over every rack
  // The rack's last contribution completed the round only if the rack completed the spine's; else
  // the spine's RESULT says whether a resend (of another rack) completed it.
  if (h.rank != up.rank) {
    sv.completer = GS_RANK_ALL;
    sv.completed_by_resend = h.flags & GS_FLAG_RETX;
  }
  return publish_result(thread, *job, h.slot, version, r, now_ns);
}

}  // namespace gradswitch
