// The streaming allreduce through the switch (see switch_allreduce.h).
#include "worker/switch_allreduce.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <string>

#include "common/counter.h"
#include "common/fixed_point.h"
#include "common/header.h"
#include "gradswitch/wire.h"
#include "worker/errors.h"
#include "worker/switch_notice.h"
#include "worker/timeout_diagnosis.h"

namespace gradswitch::worker {

namespace {

constexpr int64_t kNoticeCheckNs = 5'000'000;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A chunk's DATA header; `flags` is the slot version, with GS_FLAG_LAST on the tensor's last chunk.
gs_header data_header(const PathContext& ctx, unsigned slot, uint8_t flags, uint8_t elem, uint16_t count,
                      uint32_t seq, uint32_t offset, int8_t next_exp, int8_t scale_exp) {
  return HeaderBuilder(GS_MSG_DATA, ctx.join->job_id, ctx.join->key)
      .rank(static_cast<uint16_t>(ctx.opt->rank))
      .slot(static_cast<uint16_t>(slot))
      .flags(flags)
      .elems(elem, count)
      .round(seq, offset)
      .exps(next_exp, scale_exp);
}

}  // namespace

// One allreduce in progress: chunk c uses slot c mod W.
struct SwitchAllreduce::Run {
  const AllreduceOp* op = nullptr;
  unsigned W = 0;
  bool fixed = false;
  unsigned outstanding = 0;
  int64_t last_progress_ns = 0;
};

SwitchAllreduce::SwitchAllreduce(const PathContext& ctx, ControlClient* control)
    : ctx_(ctx),
      control_(control),
      window_(ctx.join->slots, ctx.join->payload_bytes),
      loss_(static_cast<int64_t>(ctx.opt->rto_initial_s * 1e9),
            static_cast<int64_t>(ctx.opt->rto_max_s * 1e9)),
      drops_(ctx.opt->drop_rate, ctx.opt->seed, ctx.opt->rank) {
  out_.reserve(ctx.join->slots + 64);
}

void SwitchAllreduce::prepare_bootstrap(Run& run, unsigned slot) {
  const AllreduceOp& op = *run.op;
  SlotRound& r = window_.round(slot);
  r.bootstrap = true;
  r.chunk = slot;
  r.scale = GS_EXP_NONE;
  uint8_t v = window_.claim_version(slot);
  if (slot + 1 == op.ch.chunks) v |= GS_FLAG_LAST;  // the exponent round of the last chunk
  window_.seal(slot,
               data_header(ctx_, slot, v, GS_ELEM_FIXED32, 0, op.seq, op.ch.offset(slot), (*op.exps)[slot],
                           GS_EXP_NONE),
               0);
  counter_add(ctx_.counters->bootstrap_rounds);
}

void SwitchAllreduce::prepare_chunk(Run& run, unsigned slot, size_t c, int8_t agreed_exp) {
  const AllreduceOp& op = *run.op;
  SlotRound& r = window_.round(slot);
  r.bootstrap = false;
  r.chunk = c;
  r.scale = GS_EXP_NONE;
  int8_t next_exp = GS_EXP_NONE;
  int scale = 0;
  if (run.fixed) {
    scale = scale_exponent(agreed_exp, ctx_.opt->world);
    r.scale = static_cast<int8_t>(scale);
    next_exp = c + run.W < op.ch.chunks ? (*op.exps)[c + run.W] : static_cast<int8_t>(GS_EXP_NONE);
  }
  size_t len = encode_chunk(op.ch, op.input(), c, scale, window_.payload(slot));
  uint8_t v = window_.claim_version(slot);
  if (c + 1 == op.ch.chunks) v |= GS_FLAG_LAST;  // lets the switch catch ranks whose lengths differ
  window_.seal(
      slot, data_header(ctx_, slot, v, op.ch.elem, op.ch.size(c), op.seq, op.ch.offset(c), next_exp, r.scale),
      len);
}

void SwitchAllreduce::send(unsigned slot) {
  if (drops_.drop()) {
    counter_add(ctx_.counters->injected_drops);
    return;
  }
  const JoinInfo& j = *ctx_.join;
  out_.push_back(OutPacket{window_.packet(slot), window_.round(slot).len,
                           static_cast<uint16_t>(j.data_port + slot % j.threads)});
}

// Claims the slot's timer for a new round and queues its packet.
void SwitchAllreduce::launch(unsigned slot, int64_t now) {
  loss_.launch(window_.timer(slot), now);
  send(slot);
}

void SwitchAllreduce::flush() {
  if (out_.empty()) return;
  uint64_t bytes = 0;
  for (auto& p : out_) bytes += p.len;
  ctx_.transport->send_batch(out_.data(), out_.size());
  counter_add(ctx_.counters->packets_sent, out_.size());
  counter_add(ctx_.counters->bytes_sent, bytes);
  out_.clear();
}

void SwitchAllreduce::receive(Run& run, const uint8_t* p, uint32_t len, int64_t now) {
  Counters& k = *ctx_.counters;
  const AllreduceOp& op = *run.op;
  if (len < GS_HEADER_BYTES) {
    counter_add(k.ignored);
    return;
  }
  gs_header h;
  gs_header_decode(p, &h);
  if (h.magic != GS_MAGIC || h.version != GS_VERSION || h.job_id != ctx_.join->job_id ||
      h.key != ctx_.join->key) {
    counter_add(k.ignored);
    return;
  }
  if (h.type == GS_MSG_ABORT) throw_aborted(ctx_, control_, static_cast<uint8_t>(h.next_exp), h.rank, op);
  if (h.type != GS_MSG_RESULT || (h.rank != GS_RANK_ALL && h.rank != ctx_.opt->rank) || h.slot >= run.W) {
    counter_add(k.ignored);
    return;
  }
  const unsigned slot = h.slot;
  SlotRound& r = window_.round(slot);
  RoundTimer& t = window_.timer(slot);
  if (!t.busy || (h.flags & GS_FLAG_VERSION) != (r.hdr.flags & GS_FLAG_VERSION) || h.seq != op.seq ||
      h.offset != r.hdr.offset || h.count != r.hdr.count || (!r.bootstrap && h.elem_type != op.ch.elem) ||
      len < GS_HEADER_BYTES + static_cast<size_t>(h.count) * op.ch.elem_bytes ||
      (run.fixed && !r.bootstrap && h.scale_exp != r.scale)) {
    counter_add(k.ignored);
    return;
  }
  if (h.flags & GS_FLAG_UNICAST) counter_add(k.unicast_results);
  loss_.delivered(t, now);
  run.last_progress_ns = now;
  size_t next_chunk;
  if (r.bootstrap) {
    next_chunk = r.chunk;  // the exponent round's result carries the agreed exponent of this chunk
  } else {
    if (op.base) decode_chunk(op.ch, p + GS_HEADER_BYTES, r.chunk, r.scale, op.base);
    if (op.done) (*op.done)[r.chunk] = 1;
    next_chunk = r.chunk + run.W;
  }
  if (next_chunk < op.ch.chunks) {
    prepare_chunk(run, slot, next_chunk, h.next_exp);
    launch(slot, now);
  } else {
    run.outstanding--;
  }
}

int64_t SwitchAllreduce::check_timers(unsigned W, int64_t now) {
  resend_.clear();
  int64_t next = loss_.scan(window_.timers(), W, now, &resend_);
  for (unsigned s : resend_) {
    window_.mark_retransmission(s);
    counter_add(ctx_.counters->retransmissions);
    send(s);
  }
  return next;
}

void SwitchAllreduce::run(const AllreduceOp& op) {
  Run run;
  run.op = &op;
  run.W = static_cast<unsigned>(std::min<size_t>(window_.slots(), op.ch.chunks));
  run.fixed = op.ch.elem == GS_ELEM_FIXED32;
  loss_.begin();
  const int64_t timeout_ns = static_cast<int64_t>(ctx_.opt->timeout_s * 1e9);
  const int64_t rto_min = loss_.rto_min_ns();

  // The first window, optionally in a permuted order (test hook).
  std::vector<unsigned> order(run.W);
  for (unsigned s = 0; s < run.W; ++s) order[s] = s;
  if (ctx_.opt->shuffle_seed != 0) {
    std::mt19937_64 g(ctx_.opt->shuffle_seed * 0x9E3779B97F4A7C15ull + op.seq);
    std::shuffle(order.begin(), order.end(), g);
  }
  int64_t now = now_ns();
  for (unsigned s : order) {
    if (run.fixed)
      prepare_bootstrap(run, s);
    else
      prepare_chunk(run, s, s, GS_EXP_NONE);
    launch(s, now);
  }
  run.outstanding = run.W;
  run.last_progress_ns = now;
  flush();

  std::vector<InPacket> in(1024);
  Transport& tx = *ctx_.transport;
  // Receive first and judge timers only once the socket is drained (or every rto_min while
  // results keep streaming): a worker that was descheduled for a while finds its results
  // queued, not lost, and must not retransmit the whole window.
  int64_t wait_ns = 0;
  int64_t last_timer_check = now, last_notice_check = now;
  while (run.outstanding > 0) {
    if (ctx_.cancel->load(std::memory_order_relaxed))
      throw Error("gradswitch: allreduce seq " + std::to_string(op.seq) + " cancelled: the group of " +
                  ctx_.job_text + " was closed");
    size_t got = tx.recv_batch(in.data(), in.size(), wait_ns);
    now = now_ns();
    // The control connection: an abort or the switch going away ends this allreduce at once. The
    // transport's wait wakes up when it has input; while results stream, look every few ms.
    if (control_ && (got == 0 || now - last_notice_check >= kNoticeCheckNs)) {
      last_notice_check = now;
      if (SwitchNotice n = control_->poll_notice()) throw_notice(ctx_, *control_, n, op, /*started=*/true);
    }
    uint64_t rbytes = 0;
    for (size_t i = 0; i < got; ++i) {
      rbytes += in[i].len;
      receive(run, in[i].data, in[i].len, now);
    }
    counter_add(ctx_.counters->packets_received, got);
    counter_add(ctx_.counters->bytes_received, rbytes);
    flush();
    if (run.outstanding == 0) break;
    if (tx.more_pending() && now - last_timer_check < rto_min) {
      wait_ns = 0;  // more datagrams are probably queued
      continue;
    }
    last_timer_check = now;
    int64_t next_deadline = std::min(check_timers(run.W, now), run.last_progress_ns + timeout_ns);
    flush();
    if (now - run.last_progress_ns >= timeout_ns) fail_timeout(run);
    wait_ns = std::max<int64_t>(next_deadline - now, 0);
  }
}

void SwitchAllreduce::fail_timeout(const Run& run) {
  // The stuck round: the outstanding slot with the lowest chunk.
  unsigned slot = 0;
  size_t best = SIZE_MAX;
  for (unsigned s = 0; s < run.W; ++s)
    if (window_.timer(s).busy && window_.round(s).chunk < best) {
      best = window_.round(s).chunk;
      slot = s;
    }
  const SlotRound& r = window_.round(slot);
  StuckRound stuck;
  stuck.seq = run.op->seq;
  stuck.slot = slot;
  stuck.version = r.hdr.flags & GS_FLAG_VERSION;
  stuck.bootstrap = r.bootstrap;
  stuck.offset = r.hdr.offset;
  throw_switch_timeout(ctx_, control_, stuck);
}

}  // namespace gradswitch::worker
