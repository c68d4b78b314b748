// The streaming allreduce through the switch (see switch_allreduce.h).
#include "worker/switch/switch_allreduce.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>

#include "common/clock.h"
#include "common/counter.h"
#include "common/fixed_point.h"
#include "common/header.h"
#include "gradswitch/wire.h"
#include "worker/errors.h"
#include "worker/log.h"
#include "worker/switch/switch_notice.h"
#include "worker/switch/timeout_diagnosis.h"

namespace gradswitch::worker {

namespace {

constexpr int64_t kNoticeCheckNs = 5'000'000;
constexpr int64_t kAbortRecheckNs = 50'000'000;  // between two STATUS checks of ABORT datagrams

int64_t now_ns() {
  return steady_now_ns();
}

// A chunk's DATA header; `flags` is the slot version, with GS_FLAG_LAST on the tensor's last chunk;
// `window` the rounds this rank allows in flight, which the RESULT tells the others if this DATA
// completes the round.
gs_header data_header(const PathContext& ctx, unsigned slot, uint8_t flags, uint8_t elem, uint16_t count,
                      uint32_t seq, uint32_t offset, int8_t next_exp, int8_t scale_exp, unsigned window) {
  return HeaderBuilder(GS_MSG_DATA, ctx.join->job_id, ctx.join->key)
      .rank(static_cast<uint16_t>(ctx.opt->rank))
      .slot(static_cast<uint16_t>(slot))
      .flags(flags)
      .elems(elem, count)
      .round(seq, offset)
      .exps(next_exp, scale_exp)
      .window(static_cast<uint16_t>(window));  // at most the pool: JoinInfo::slots is 16 bits
}

// Rounds in flight without the adaptive controller: a numeric window below the pool, else the pool.
unsigned fixed_window(const std::string& window, unsigned pool) {
  const unsigned n = window_rounds(window);
  return n && n < pool ? n : pool;
}

// The detector every switch thread's copy starts from: the copies share one timer floor (a stall
// of this host or the switch's fools one of them once, not each in turn).
LossDetector path_detector(const Options& opt) {
  const auto rto_min = static_cast<int64_t>(opt.rto_initial_s * 1e9);
  const auto rto_max = static_cast<int64_t>(opt.rto_max_s * 1e9);
  return LossDetector(rto_min, rto_max, std::make_shared<TimerFloor>(rto_min, rto_max));
}

}  // namespace

SwitchAllreduce::SwitchAllreduce(const PathContext& ctx, ControlClient* control)
    : ctx_(ctx),
      control_(control),
      window_(ctx.join->slots, ctx.join->payload_bytes),
      schedule_(ctx.join->slots),
      flight_(ctx.join->slots, nullptr),
      agreed_exp_(ctx.join->slots, GS_EXP_NONE),
      adaptive_(ctx.opt->window == "adaptive"),
      fixed_window_(fixed_window(ctx.opt->window, ctx.join->slots)),
      cc_(ctx.join->slots, static_cast<int64_t>(ctx.opt->target_delay_s * 1e9),
          WindowController::kInitialRounds, wall_minus_steady_ns()),
      concede_(ctx.opt->concede, ctx.opt->world, ctx.opt->concede_keep, ctx.opt->rank + 1),
      loss_(std::max<unsigned>(ctx.join->threads, 1), path_detector(*ctx.opt)),
      last_(2 * size_t{ctx.join->slots}),
      proofs_due_(kProofsDue),
      drops_(ctx.opt->drop_rate, ctx.opt->seed, ctx.opt->rank),
      in_(1024) {
  out_.reserve(ctx.join->slots + 64);
  queued_at_.assign(ctx.join->slots, kNotQueued);
  passed_.reserve(ctx.join->slots);
}

void SwitchAllreduce::prepare_bootstrap(unsigned slot, size_t c) {
  const AllreduceOp& op = *flight_[slot]->op;
  SlotRound& r = window_.round(slot);
  r.bootstrap = true;
  r.chunk = c;
  r.scale = GS_EXP_NONE;
  uint8_t v = window_.claim_version(slot);
  if (c + 1 == op.ch.chunks) v |= GS_FLAG_LAST;  // the exponent round of the last chunk
  window_.seal(slot,
               data_header(ctx_, slot, v, GS_ELEM_FIXED32, 0, op.seq, op.ch.offset(c), (*op.exps)[c],
                           GS_EXP_NONE, declared_window()),
               0);
  counter_add(ctx_.counters->bootstrap_rounds);
}

void SwitchAllreduce::prepare_chunk(unsigned slot, size_t c, int8_t agreed_exp) {
  const Flight& f = *flight_[slot];
  const AllreduceOp& op = *f.op;
  SlotRound& r = window_.round(slot);
  r.bootstrap = false;
  r.chunk = c;
  r.scale = GS_EXP_NONE;
  int8_t next_exp = GS_EXP_NONE;
  int scale = 0;
  if (op.ch.elem == GS_ELEM_FIXED32) {
    scale = scale_exponent(agreed_exp, ctx_.opt->world);
    r.scale = static_cast<int8_t>(scale);
    size_t after = schedule_.following(f, c);
    if (after != SIZE_MAX) next_exp = (*op.exps)[after];
  }
  // A concede (§3.1) is the chunk's header alone: this rank reaches the round without its values.
  const bool concede = concede_.concede_next(op.seq);
  size_t len = concede ? 0 : encode_chunk(op.ch, op.input(), c, scale, window_.payload(slot));
  uint8_t v = window_.claim_version(slot);
  if (c + 1 == op.ch.chunks) v |= GS_FLAG_LAST;  // lets the switch catch ranks whose lengths differ
  if (concede) {
    v |= GS_FLAG_CONCEDE;
    counter_add(ctx_.counters->conceded_rounds);
  }
  window_.seal(slot,
               data_header(ctx_, slot, v, op.ch.elem, op.ch.size(c), op.seq, op.ch.offset(c), next_exp,
                           r.scale, declared_window()),
               len);
}

bool SwitchAllreduce::start_slot(unsigned s, int64_t now) {
  size_t c = 0;
  Flight* f = schedule_.next(s, &c);
  if (!f) return false;  // its next chunk belongs to an allreduce not admitted yet
  flight_[s] = f;
  if (f->op->ch.elem == GS_ELEM_FIXED32 && schedule_.first_in_slot(c))
    prepare_bootstrap(s, c);
  else
    prepare_chunk(s, c, agreed_exp_[s]);  // fixed32: agreed by the slot's previous round
  launch(s, now);
  return true;
}

bool SwitchAllreduce::startable(uint64_t g) const {
  const unsigned s = static_cast<unsigned>(g % window_.slots());
  return g < schedule_.end() && schedule_.slot_next(s) == g && !window_.timer(s).busy;
}

// A window below the pool, adaptive or numeric (protocol.md §4.2): while fewer than `window` rounds are out,
// the lowest chunk that can start does (first those passed over while their slot was busy, then on from the
// scan), so a lost round holds only its own slot. The oldest chunk whose sum this rank lacks starts even past
// the window: every rank always sends the chunk the others may all be waiting for, so ranks whose windows
// differ (or shrank below the rounds already out) never wait on each other for good. Fixed (the whole pool)
// needs none of this: every slot always carries its next chunk.
void SwitchAllreduce::fill_window(int64_t now) {
  const unsigned limit = window_now(now);
  for (;;) {
    while (oldest_ < scan_ && schedule_.finished(oldest_)) ++oldest_;
    uint64_t g;
    if (!passed_.empty()) {
      g = passed_.front();
    } else {
      while (scan_ < schedule_.end() && !startable(scan_)) ++scan_;  // busy slots: back via passed_
      if (scan_ >= schedule_.end()) {
        window_limited_ = false;
        return;
      }
      g = scan_;
    }
    if (in_flight_ >= limit && g != oldest_) {
      window_limited_ = true;
      return;
    }
    if (!passed_.empty()) {
      std::pop_heap(passed_.begin(), passed_.end(), std::greater<>());
      passed_.pop_back();
    } else {
      ++scan_;
    }
    start_slot(static_cast<unsigned>(g % window_.slots()), now);
    ++in_flight_;
  }
}

void SwitchAllreduce::send(unsigned slot) {
  if (drops_.drop()) {
    counter_add(ctx_.counters->injected_drops);
    return;
  }
  const JoinInfo& j = *ctx_.join;
  const OutPacket p{window_.packet(slot), window_.round(slot).len,
                    static_cast<uint16_t>(j.data_port + slot % j.threads), ctx_.switch_ipv4_be};
  if (queued_at_[slot] != kNotQueued) {
    out_[queued_at_[slot]] = p;
    return;
  }
  queued_at_[slot] = static_cast<uint32_t>(out_.size());
  out_.push_back(p);
}

void SwitchAllreduce::clear_queue() {
  for (const OutPacket& p : out_) queued_at_[window_.slot_of(p.data)] = kNotQueued;
  out_.clear();
}

// Claims the slot's timer for a new round and queues its packet.
void SwitchAllreduce::launch(unsigned slot, int64_t now) {
  detector(slot).launch(window_.timer(slot), now);
  if (AllreduceTimes* t = flight_[slot]->op->times) t->sent(now);
  send(slot);
}

void SwitchAllreduce::send_queued() {
  if (out_.empty()) return;
  for (const OutPacket& p : out_) queued_at_[window_.slot_of(p.data)] = kNotQueued;
  send_counted(ctx_, &out_);
}

void SwitchAllreduce::receive(const InPacket& in, int64_t now, std::vector<AllreduceOp*>* finished) {
  gs_header h;
  if (!decode_job_header(in.data, in.len, ctx_.join->job_id, ctx_.join->key, &h)) {
    counter_add(ctx_.counters->ignored);
    return;
  }
  if (h.type == GS_MSG_ABORT && !schedule_.empty()) {
    abort_datagram(h, now);
  } else if ((h.type != GS_MSG_RESULT && h.type != GS_MSG_HELD) || h.slot >= window_.slots()) {
    counter_add(ctx_.counters->ignored);
  } else if (h.type == GS_MSG_HELD) {
    held(in, h, now);
  } else if (!current_round(h)) {
    late_answer(h, now);
    counter_add(ctx_.counters->ignored);
  } else {
    result(in, h, now, finished);
  }
}

// Whether `h` answers the round its slot is running now (its version, allreduce and offset).
bool SwitchAllreduce::current_round(const gs_header& h) const {
  const RoundTimer& t = window_.timer(h.slot);
  const SlotRound& r = window_.round(h.slot);
  return t.busy && (h.flags & GS_FLAG_VERSION) == (r.hdr.flags & GS_FLAG_VERSION) &&
         h.seq == flight_[h.slot]->op->seq && h.offset == r.hdr.offset;
}

// An ABORT datagram while allreduces run: only a hint, confirmed over the control connection.
void SwitchAllreduce::abort_datagram(const gs_header& h, int64_t now) {
  if (draining_) {  // the switch is going and refuses this round: it did not complete there
    if (h.slot < window_.slots() && window_.timer(h.slot).busy) refused_[h.slot] = 1;
    return;
  }
  // A hint to ask the control connection, at most once per kAbortRecheckNs: a flood of forged ones
  // costs a STATUS now and then, and a real abort that STATUS does not show yet (a data thread's,
  // relayed to the control plane within 100 ms) arrives as its EVENT line meanwhile.
  if (now >= abort_recheck_ns_) {
    confirm_abort(ctx_, control_, static_cast<uint8_t>(h.next_exp), h.rank, front_op(), 1.0);
    abort_recheck_ns_ = now_ns() + kAbortRecheckNs;
  }
  counter_add(ctx_.counters->unconfirmed_aborts);
  if (!warned_unconfirmed_) {
    warned_unconfirmed_ = true;
    log_line(LogLevel::kWarn, ctx_.opt->rank,
             ctx_.job_text + ": an ABORT datagram (reason " + std::to_string(h.next_exp) + ", rank " +
                 std::to_string(h.rank) +
                 ") that the switch's control connection does not confirm was ignored (forged? "
                 "docs/protocol.md section 4); such datagrams are counted in unconfirmed_aborts");
  }
}

// A HELD: its body names the round's contributors (protocol.md §3).
void SwitchAllreduce::held(const InPacket& in, const gs_header& h, int64_t now) {
  const unsigned slot = h.slot;
  RoundTimer& t = window_.timer(slot);
  const bool current = current_round(h);
  // Without this rank: another rank's resend found the round waiting for this rank's contribution,
  // which is resent now.
  if (in.len >= GS_HEADER_BYTES + GS_HELD_BODY_BYTES &&
      !(gs_held_contributors(in.data + GS_HEADER_BYTES) >> ctx_.opt->rank & 1)) {
    if (current && detector(slot).asked(t, now)) resend(slot, now);
    return;
  }
  // The switch holds this rank's contribution: the resend was not needed, the round waits for
  // other ranks. Not progress (the timeout still runs), only the end of a loss suspicion.
  counter_add(ctx_.counters->held_answers);
  if (!current) {
    late_answer(h, now);
  } else if (t.tries > 0) {  // each HELD answers one resend that found the contribution there
    spurious_resend(t.cause, t.last_tx_ns, now);
    detector(slot).held(t, now);
  }
}

// The RESULT of the slot's current round: checked against the round, timed, then applied.
void SwitchAllreduce::result(const InPacket& in, const gs_header& h, int64_t now,
                             std::vector<AllreduceOp*>* finished) {
  const unsigned slot = h.slot;
  const SlotRound& r = window_.round(slot);
  AllreduceOp& op = *flight_[slot]->op;
  // A PARTIAL RESULT (docs/protocol.md §3.1) carries its contributors after the elements.
  const size_t trailer = h.flags & GS_FLAG_PARTIAL ? GS_PARTIAL_TRAILER_BYTES : 0;
  if (h.count != r.hdr.count || (!r.bootstrap && h.elem_type != op.ch.elem) ||
      in.len < GS_HEADER_BYTES + gs_payload_bytes(op.ch.elem, h.count) + trailer ||
      (op.ch.elem == GS_ELEM_FIXED32 && !r.bootstrap && h.scale_exp != r.scale)) {
    counter_add(ctx_.counters->ignored);
    return;
  }
  if (h.flags & GS_FLAG_UNICAST) counter_add(ctx_.counters->unicast_results);
  learn_from_result(in, h, now);
  last_progress_ns_ = now;
  if (op.times) op.times->result(now);
  if (r.bootstrap) {        // the exponent round's result carries the agreed exponent of this chunk
    if (draining_) return;  // nothing new starts on a switch that is going
    prepare_chunk(slot, r.chunk, h.next_exp);
    launch(slot, now);
    return;
  }
  const uint8_t* payload = in.data + GS_HEADER_BYTES;
  const uint64_t contributors =
      trailer ? gs_held_contributors(payload + gs_payload_bytes(op.ch.elem, h.count)) : 0;
  // What the sum lacks of this rank (AllreduceOp::unsummed): its input, before the sum overwrites it,
  // less the estimate that a rescaled sum holds in its place.
  const bool kept = trailer && op.unsummed && !(contributors >> ctx_.opt->rank & 1);
  if (kept) keep_unsummed(op, r.chunk);
  if (op.base) decode_chunk(op.ch, payload, r.chunk, r.scale, op.base);
  if (trailer && partial_chunk(op, r.chunk, contributors) && kept) unsummed_less_estimate(op, r.chunk);
  if (op.done) (*op.done)[r.chunk] = 1;
  agreed_exp_[slot] = h.next_exp;  // fixed32: of the slot's next chunk in this allreduce
  round_done(slot, now, finished);
}

// What a delivered round tells the window controller and the loss detector.
void SwitchAllreduce::learn_from_result(const InPacket& in, const gs_header& h, int64_t now) {
  const unsigned slot = h.slot;
  RoundTimer& t = window_.timer(slot);
  // Only a round this rank completed, sent once, measures this rank's own path (window_controller.h);
  // one that original DATA completed carries the window the job runs at (protocol.md §4.2). A round a
  // resend completed may carry a window as old as the loss it recovered, which the job has moved on
  // from; a unicast answer one as old as its shadow copy.
  const bool multicast = !(h.flags & GS_FLAG_UNICAST);
  if (multicast && !(h.flags & GS_FLAG_RETX)) cc_.run_at(h.window);
  const bool completed_here = h.rank == ctx_.opt->rank;
  // Whose arrival came last, where no loss held the round and no deadline closed it (no completer):
  // the concede signal. A round closed by concessions names the arrival that closed it.
  if (multicast && !(h.flags & GS_FLAG_RETX) && h.rank != GS_RANK_ALL) concede_.on_completed(completed_here);
  // The path's round trip ends when the kernel received the result, not when this thread got to it:
  // the wait in between is the host's scheduling (docs/transport.md, "Which sample").
  const int64_t arrived = in.arrival_ns > t.sent_ns && in.arrival_ns <= now ? in.arrival_ns : now;
  // A conceding rank's own round trips hold the queue of the slow uplink that made it concede; its
  // window would cut them to the delay target and clock every rank at its pace (the job runs at the
  // smallest window declared) while its completions looked healthy: the concessions, not the window,
  // pace its uplink then, and the others' paths set the window.
  const bool own_path = t.tries == 0 && multicast && completed_here && !concede_.conceding();
  const int64_t own_rtt = own_path ? arrived - t.sent_ns : -1;
  const auto srtt = static_cast<int64_t>(detector(slot).rtt().srtt_ns());
  if (cc_.on_result(now, own_rtt, window_limited_, srtt) && adaptive_)
    counter_add(ctx_.counters->window_delay_cuts);
  // A RACK resend the switch held, whose round a late rank's original completed (no RETX): results
  // come back out of this rank's send order by more than the reordering window. Completed by a
  // resend, the round waited for another rank's loss: nothing to widen for.
  if (t.held && t.cause == RetxCause::kRack && !(h.flags & (GS_FLAG_UNICAST | GS_FLAG_RETX)))
    detector(slot).reordered(now);
  remember_delivered(slot, h, t, now);
  detector(slot).delivered(t, now, h.flags & GS_FLAG_RETX);
}

// A chunk's round is over: its allreduce may be finished, and the slot (or the window) goes on.
void SwitchAllreduce::round_done(unsigned slot, int64_t now, std::vector<AllreduceOp*>* finished) {
  Flight* f = flight_[slot];
  AllreduceOp* whole = f->op;
  if (schedule_.finish(slot, f)) {
    if (whole->times && adaptive_) {  // the window as the allreduce ends, for its log line and timeline
      whole->times->window_rounds = cc_.job_window();
      whole->times->base_rtt_ns = cc_.base_rtt_ns();
    }
    finished->push_back(whole);
  }
  if (draining_) return;  // nothing new starts on a switch that is going
  if (windowed()) {
    --in_flight_;
    if (uint64_t next = schedule_.slot_next(slot); next < scan_) {  // passed over while this round ran
      passed_.push_back(next);
      std::push_heap(passed_.begin(), passed_.end(), std::greater<>());
    }
    fill_window(now);
  } else {
    start_slot(slot, now);  // the whole pool: each slot goes on by itself, a lost round holds only its own
  }
}

// A chunk whose round closed at its deadline without every rank (docs/protocol.md §3.1): counted
// for the allreduce and, for float tensors, scaled from the sum of `contributors` to an estimate of
// every rank's (true: it was). Every rank computes the same factor from the same trailer, so the
// values stay identical; int32 sums stay as summed.
bool SwitchAllreduce::partial_chunk(AllreduceOp& op, size_t chunk, uint64_t contributors) {
  const unsigned world = ctx_.opt->world;
  const uint64_t all = world >= 64 ? ~uint64_t{0} : (uint64_t{1} << world) - 1;
  const auto present = static_cast<unsigned>(__builtin_popcountll(contributors & all));
  const unsigned missing = world - present;
  op.missed += missing;
  op.missing_ranks |= all & ~contributors;
  counter_add(ctx_.counters->partial_results);
  counter_add(ctx_.counters->missed_contributions, missing);
  if (!ctx_.opt->rescale || !op.base || present == 0 || missing == 0) return false;
  const size_t at = op.ch.offset(chunk), n = op.ch.size(chunk);
  if (op.ch.dtype == DType::kFloat32) {
    const float factor = static_cast<float>(world) / static_cast<float>(present);
    auto* x = reinterpret_cast<float*>(op.base) + at;
    for (size_t i = 0; i < n; ++i) x[i] *= factor;
  } else if (op.ch.dtype == DType::kFloat64) {
    const double factor = static_cast<double>(world) / static_cast<double>(present);
    auto* x = reinterpret_cast<double*>(op.base) + at;
    for (size_t i = 0; i < n; ++i) x[i] *= factor;
  } else {
    return false;
  }
  return true;
}

// The sum of `chunk` lacks this rank: its input, still in place (the sum is decoded after), is what
// the caller sends in a later step (AllreduceOp::unsummed).
void SwitchAllreduce::keep_unsummed(const AllreduceOp& op, size_t chunk) {
  const size_t at = op.ch.offset(chunk);
  std::memcpy(op.unsummed + at, reinterpret_cast<const float*>(op.input()) + at,
              op.ch.size(chunk) * sizeof(float));
}

// A rescaled partial sum counts each missing rank as the mean of those present (sum / world once
// rescaled): what it still lacks of this rank is its values less that estimate, so that what every
// step delivers plus what waits in the ranks' unsummed is every rank's values.
void SwitchAllreduce::unsummed_less_estimate(const AllreduceOp& op, size_t chunk) {
  const size_t at = op.ch.offset(chunk), n = op.ch.size(chunk);
  const auto world = static_cast<float>(ctx_.opt->world);
  const auto* sum = reinterpret_cast<const float*>(op.base) + at;
  float* u = op.unsummed + at;
  for (size_t i = 0; i < n; ++i) u[i] -= sum[i] / world;  // exact where the estimate is representable
}

void SwitchAllreduce::remember_delivered(unsigned slot, const gs_header& h, const RoundTimer& t,
                                         int64_t now) {
  DeliveredRound& d = last_[2 * slot + (h.flags & GS_FLAG_VERSION)];
  if (d.valid && d.retransmitted) {
    proofs_due_[proofs_due_next_] = d;
    proofs_due_next_ = (proofs_due_next_ + 1) % proofs_due_.size();
  }
  d.valid = true;
  d.slot = slot;
  d.retransmitted = t.tries > 0;
  d.multicast_seen = !(h.flags & GS_FLAG_UNICAST);
  d.completed_by_resend = d.multicast_seen && (h.flags & GS_FLAG_RETX);
  d.taught = t.held;  // a held round waited for another rank: nothing to learn about this path
  d.version = h.flags & GS_FLAG_VERSION;
  d.cause = t.cause;
  d.seq = h.seq;
  d.offset = h.offset;
  d.sent_ns = t.sent_ns;
  d.resent_ns = t.last_tx_ns;
  d.delivered_ns = now;
}

SwitchAllreduce::DeliveredRound* SwitchAllreduce::delivered_round(const gs_header& h) {
  const auto answers = [&](const DeliveredRound& d) {
    return d.valid && d.slot == h.slot && d.version == (h.flags & GS_FLAG_VERSION) && d.seq == h.seq &&
           d.offset == h.offset;
  };
  // The slot version's latest round (a network duplicate of its RESULT, the common case) needs no
  // search: proofs_due_ holds only older rounds, each of them resent.
  DeliveredRound& last = last_[2 * h.slot + (h.flags & GS_FLAG_VERSION)];
  if (answers(last)) return last.retransmitted ? &last : nullptr;
  for (DeliveredRound& d : proofs_due_)
    if (answers(d)) return &d;
  return nullptr;
}

// Each answer that proves one resend of a delivered round unneeded counts once: a HELD; a
// UNICAST+DSACK once the round's own RESULT is known to have arrived; and that RESULT arriving
// after the UNICAST answer that delivered the round (the original result was late, not lost).
// A UNICAST answer before the round's own RESULT was seen proves nothing: the RESULT may be lost.
void SwitchAllreduce::late_answer(const gs_header& h, int64_t now) {
  DeliveredRound* found = delivered_round(h);
  if (!found) return;
  DeliveredRound& d = *found;
  // What the answers measure. When a late original completed the round (its RESULT without RETX),
  // the original's round trip is how long this path, or the ranks it waited for, took: an RTT sample.
  // When a resend completed it, the round waited for another rank's loss recovery: no sample.
  // The timer's floor learns only the resend's own round trip (its send to the answer to it): a
  // stall of the switch or of the path delays that answer too. The original's round trip also holds
  // the wait for a rank that was late for its own reasons (under loss: its previous round in the
  // slot recovering a lost RESULT); learning it raised every rank's floor far above its own round
  // trip under loss (more so when it also learned from rounds completed by a resend: BENCHMARKS.md
  // §10), and a later timer helps no rank that waits for another.
  int64_t sample = 0, wait = 0;
  if (h.type == GS_MSG_RESULT && !(h.flags & GS_FLAG_UNICAST)) {  // after the UNICAST answer
    if (d.multicast_seen) return;                                 // a duplicate of it
    d.multicast_seen = true;
    d.completed_by_resend = h.flags & GS_FLAG_RETX;
    sample = now - d.sent_ns;
    wait = d.delivered_ns - d.resent_ns;
  } else if (h.type == GS_MSG_HELD) {
    // nothing to learn: the round waits for another rank
  } else if (d.multicast_seen && (h.flags & GS_FLAG_DSACK)) {
    sample = d.delivered_ns - d.sent_ns;
    wait = now - d.resent_ns;
  } else {
    return;
  }
  if (d.completed_by_resend) sample = 0;
  spurious_resend(d.cause, d.resent_ns, now);
  // Taught once; a RACK resend that raced another rank's recovery says nothing of reordering either.
  if (d.taught || (d.completed_by_resend && d.cause == RetxCause::kRack)) return;
  d.taught = true;
  detector(h.slot).spurious(d.cause, sample, wait, now);
}

// A resend was proven unneeded: counted, and a window cut its loss made is undone (a probe made none).
void SwitchAllreduce::spurious_resend(RetxCause cause, int64_t resent_ns, int64_t now) {
  counter_add(ctx_.counters->spurious_retransmissions);
  if (cause != RetxCause::kProbe && cc_.on_spurious(now, resent_ns) && adaptive_)
    counter_add(ctx_.counters->window_undos);
}

void SwitchAllreduce::resend(unsigned slot, int64_t now) {
  window_.mark_retransmission(slot);
  Counters& k = *ctx_.counters;
  counter_add(k.retransmissions);
  const RetxCause cause = window_.timer(slot).cause;
  counter_add(cause == RetxCause::kRack      ? k.retx_rack
              : cause == RetxCause::kTimeout ? k.retx_timeout
              : cause == RetxCause::kAsked   ? k.retx_asked
                                             : k.retx_probe);
  if (cause != RetxCause::kProbe && cc_.on_loss(now) && adaptive_)  // evidence of loss; a probe is none
    counter_add(k.window_loss_cuts);
  if (AllreduceTimes* t = flight_[slot]->op->times) t->retransmit(now, slot, window_.round(slot).chunk);
  send(slot);
}

int64_t SwitchAllreduce::check_timers(int64_t now) {
  int64_t next = std::numeric_limits<int64_t>::max();
  const unsigned T = static_cast<unsigned>(loss_.size());
  for (unsigned th = 0; th < T && th < window_.slots(); ++th) {
    resend_.clear();
    next = std::min(next, loss_[th].scan(window_.timers(), window_.slots(), now, &resend_, th, T));
    for (unsigned s : resend_) resend(s, now);
  }
  return next;
}

void SwitchAllreduce::admit(AllreduceOp* op) {
  int64_t now = now_ns();
  if (schedule_.empty()) {  // the stream starts (again): idle time is no lack of progress
    for (LossDetector& d : loss_) d.begin();
    last_progress_ns_ = last_timer_check_ = last_notice_check_ = now;
    wait_ns_ = 0;
  }
  schedule_.admit(op);
  const size_t queued = out_.size();
  if (windowed()) {
    fill_window(now);
  } else {
    for (unsigned s = 0; s < window_.slots(); ++s)
      if (!window_.timer(s).busy) start_slot(s, now);
  }
  if (ctx_.opt->shuffle_seed != 0) {  // test hook: these first sends in a permuted order
    std::mt19937_64 g(ctx_.opt->shuffle_seed * 0x9E3779B97F4A7C15ull + op->seq);
    std::shuffle(out_.begin() + static_cast<std::ptrdiff_t>(queued), out_.end(), g);
    for (uint32_t i = 0; i < out_.size(); ++i) queued_at_[window_.slot_of(out_[i].data)] = i;
  }
  send_queued();
}

bool SwitchAllreduce::owns(const uint8_t* p, uint32_t len) const {
  gs_header h;
  if (len < GS_HEADER_BYTES) return false;
  gs_header_decode(p, &h);
  return h.job_id == ctx_.join->job_id && h.key == ctx_.join->key;
}

void SwitchAllreduce::check_cancel() const {
  if (ctx_.cancel->load(std::memory_order_relaxed) && !schedule_.empty())
    throw Error("gradswitch: allreduce seq " + std::to_string(front_op().seq) + " cancelled: the group of " +
                ctx_.job_text + " was closed");
}

std::exception_ptr SwitchAllreduce::take(const InPacket* in, size_t n, int64_t now,
                                         std::vector<AllreduceOp*>* finished) {
  std::exception_ptr lost;
  for (size_t i = 0; i < n; ++i) {
    try {
      receive(in[i], now, finished);
    } catch (const SwitchLostError&) {  // the switch is going: the results behind it still count
      if (!lost) lost = std::current_exception();
    }
  }
  return lost;  // the rounds they started or resent go with service()'s resends, in one send
}

size_t SwitchAllreduce::receive_batch(int64_t wait_ns) {
  const size_t got = ctx_.transport->recv_batch(in_.data(), in_.size(), wait_ns);
  uint64_t bytes = 0;
  for (size_t i = 0; i < got; ++i) bytes += in_[i].len;
  counter_add(ctx_.counters->packets_received, got);
  counter_add(ctx_.counters->bytes_received, bytes);
  return got;
}

void SwitchAllreduce::step(std::vector<AllreduceOp*>* finished) {
  check_cancel();
  // Receive first and judge timers only once the socket is drained (or every rto_min while
  // results keep streaming): a worker that was descheduled for a while finds its results
  // queued, not lost, and must not retransmit the whole window. The rounds the results start and
  // the timers' resends leave in one send: where the host's CPU bounds the rate, time follows
  // system calls and wake-ups more than packets (BENCHMARKS.md §10, what bounds the lossy rows).
  const size_t got = receive_batch(wait_ns_);
  const int64_t now = now_ns();
  std::exception_ptr lost = take(in_.data(), got, now, finished);
  wait_ns_ = service(now, got == 0, lost, /*own_transport=*/true, finished);
}

int64_t SwitchAllreduce::service(int64_t now, bool quiet, std::exception_ptr lost, bool own_transport,
                                 std::vector<AllreduceOp*>* finished) {
  const int64_t timeout_ns = static_cast<int64_t>(ctx_.opt->timeout_s * 1e9);
  Transport& tx = *ctx_.transport;
  // The control connection: an abort or the switch going away ends the stream at once (the
  // transport's wait wakes up on it; while results stream, look every few ms).
  if (!lost && control_ && !schedule_.empty() && (quiet || now - last_notice_check_ >= kNoticeCheckNs)) {
    last_notice_check_ = now;
    if (SwitchNotice n = control_->poll_notice()) {
      try {
        throw_notice(ctx_, *control_, n, front_op(), /*started=*/true);
      } catch (...) {
        lost = std::current_exception();
      }
    }
  }
  if (lost) {
    clear_queue();  // nothing new goes to a switch that is going: settle_rounds asks for every round out
    if (own_transport) settle_rounds(now, finished);
    std::rethrow_exception(lost);
  }
  // Timers wait while more datagrams are probably queued (at most rto_min): they may answer them.
  const bool drain_first = tx.more_pending() && now - last_timer_check_ < loss_[0].rto_min_ns();
  if (schedule_.empty() || drain_first) {
    send_queued();
    return 0;
  }
  last_timer_check_ = now;
  int64_t next_deadline = std::min(check_timers(now), last_progress_ns_ + timeout_ns);
  send_queued();
  if (now - last_progress_ns_ >= timeout_ns) fail_timeout();
  return std::max<int64_t>(next_deadline - now, 0);
}

// The ranks must agree on which sums exist before the ring (algorithm auto) completes the rest:
// a rank whose RESULT of a round was lost, or is still on its way, when the switch went would
// otherwise start the ring at an earlier allreduce than the ranks that hold it, and they would wait
// for each other until the timeout. A stopping switch answers resends of the rounds it completed
// from its copies during its shutdown grace, and the others with ABORT (docs/protocol.md §1.3, §3):
// every round this rank has out is asked again, a few round trips apart, until each is answered
// either way, or the switch has been silent for a few round trips (it is gone), or 200 ms passed.
// Nothing new starts meanwhile. (A transport shared with other switches is not drained here: its
// datagrams may be theirs.)
void SwitchAllreduce::settle_rounds(int64_t now, std::vector<AllreduceOp*>* finished) {
  const double srtt = loss_[0].rtt().srtt_ns();
  const int64_t quiet_ns = std::clamp<int64_t>(static_cast<int64_t>(4 * srtt), 10'000'000, 50'000'000);
  const int64_t retry_ns = std::clamp<int64_t>(static_cast<int64_t>(2 * srtt), 2'000'000, 20'000'000);
  const int64_t until = now + 200'000'000;
  draining_ = true;
  refused_.assign(window_.slots(), 0);
  int64_t last_heard = now, next_ask = now;
  while (!schedule_.empty() && now < until && now - last_heard < quiet_ns) {
    if (now >= next_ask) {
      unsigned asked = 0;
      for (unsigned s = 0; s < window_.slots(); ++s) {
        if (!window_.timer(s).busy || refused_[s]) continue;
        window_.mark_retransmission(s);
        send(s);
        ++asked;
      }
      send_queued();
      if (asked == 0) break;  // every round out is answered: this rank holds what the switch summed
      next_ask = now + retry_ns;
    }
    const size_t got = receive_batch(std::min(next_ask, until) - now);
    now = now_ns();
    if (got == 0) continue;
    last_heard = now;
    take(in_.data(), got, now, finished);
    send_queued();
  }
}

void SwitchAllreduce::fail_timeout() {
  // The stuck round: the outstanding one with the lowest global chunk number.
  unsigned slot = 0;
  uint64_t best = UINT64_MAX;
  for (unsigned s = 0; s < window_.slots(); ++s)
    if (window_.timer(s).busy) {
      uint64_t g = schedule_.global(*flight_[s], window_.round(s).chunk);
      if (g < best) {
        best = g;
        slot = s;
      }
    }
  const SlotRound& r = window_.round(slot);
  StuckRound stuck;
  stuck.seq = flight_[slot]->op->seq;
  stuck.slot = slot;
  stuck.version = r.hdr.flags & GS_FLAG_VERSION;
  stuck.bootstrap = r.bootstrap;
  stuck.offset = r.hdr.offset;
  throw_switch_timeout(ctx_, control_, stuck);
}

}  // namespace gradswitch::worker
