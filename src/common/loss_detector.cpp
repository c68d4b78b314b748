// The RACK-style loss detector with single probes and undo (see loss_detector.h).
#include "common/loss_detector.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace gradswitch {

namespace {

// Below this, timing on a general-purpose host (timer slack, wake-ups) is noise, not reordering.
constexpr int64_t kReorderBaseNs = 500'000;
constexpr unsigned kMaxReorderMult = 32;
// RFC 8985's reo_wnd_persist: RACK losses after which a widened window returns to one step.
constexpr unsigned kReorderPersist = 16;
// The learned timer floor halves after this long without a spurious timeout: stalls of a busy
// host recur within seconds; a path that got faster is trusted again soon after.
constexpr int64_t kFloorHalfLifeNs = 2'000'000'000;
// While the peer answers, a round that may carry this rank's lost data waits at most this many base
// timers between its resends. Load stays bounded: a scan with nothing newer delivered still sends
// one probe, and the backoff is exponential again once nothing was answered for rto_max.
constexpr int64_t kAliveBackoff = 2;
// A request to resend (a HELD body) sooner after the round's latest transmission than RACK would wait
// for its answer (min_rtt + the reordering window) may have crossed it (the other ranks' RACK fired
// with this rank's): ignored. At least this long.
constexpr int64_t kAskedGapNs = 100'000;

}  // namespace

TimerFloor::TimerFloor(int64_t rto_min_ns, int64_t rto_max_ns)
    : rto_min_(rto_min_ns), rto_max_(std::max(rto_max_ns, rto_min_ns)), ns_(rto_min_ns) {}

void TimerFloor::raise(int64_t wait_ns, int64_t now) {
  // At most a doubling per lesson: a stall that recurs raises the floor within a few resends, one
  // outlier (this host descheduled the worker while the answer waited in its socket) does not put
  // it at rto_max for seconds (seen under heavy loss on the testbed: the floor jumped to rto_max in
  // one answer, and every round of that rank's waited that long per try while the others held
  // theirs for it).
  const int64_t want = std::min(std::clamp(wait_ns + wait_ns / 4, rto_min_, rto_max_), 2 * ns_);
  if (want > ns_) ns_ = want;
  raised_ns_ = now;
}

void TimerFloor::decay(int64_t now) {
  if (ns_ > rto_min_ && now - raised_ns_ >= kFloorHalfLifeNs) {
    ns_ = std::max(rto_min_, ns_ / 2);
    raised_ns_ = now;
  }
}

LossDetector::LossDetector(int64_t rto_min_ns, int64_t rto_max_ns, std::shared_ptr<TimerFloor> floor)
    : rto_min_(rto_min_ns),
      rto_max_(std::max(rto_max_ns, rto_min_ns)),
      floor_(floor ? std::move(floor) : std::make_shared<TimerFloor>(rto_min_ns, rto_max_ns)) {}

int64_t LossDetector::reorder_window_ns() const {
  const int64_t base = std::max<int64_t>(rtt_.min_ns() / 4, kReorderBaseNs);
  const int64_t cap = std::max(static_cast<int64_t>(rtt_.srtt_ns()), base);
  return std::min(static_cast<int64_t>(reo_mult_) * base, cap);
}

void LossDetector::begin() {
  newest_delivered_tx_ns_ = 0;
  newest_delivered_order_ = 0;
  resend_answered_ = false;
}

void LossDetector::launch(RoundTimer& t, int64_t now) {
  floor_->decay(now);
  t.busy = true;
  t.held = false;
  t.cause = RetxCause::kNone;
  t.tries = 0;
  t.sent_ns = now;
  t.last_tx_ns = now;
  t.sent_order = t.last_tx_order = ++transmissions_;
  t.rto_ns = rtt_.initial_rto(floor_->ns(), rto_max_);
  t.deadline_ns = now + t.rto_ns;
}

void LossDetector::delivered(RoundTimer& t, int64_t now, bool after_recovery) {
  last_answer_ns_ = now;
  if (t.tries == 0 && !after_recovery) rtt_.sample(now - t.sent_ns);
  const int64_t tx = t.tries ? t.sent_ns : t.last_tx_ns;
  const uint64_t order = t.tries ? t.sent_order : t.last_tx_order;
  if (tx > newest_delivered_tx_ns_ || (tx == newest_delivered_tx_ns_ && order > newest_delivered_order_)) {
    newest_delivered_tx_ns_ = tx;
    newest_delivered_order_ = order;
  }
  // A resend answered within a round trip of it (not sooner than min_rtt: RFC 8985 6.2; not much
  // later: then a stalled peer answered the original) shows the path working at its send time.
  const int64_t since_resend = now - t.last_tx_ns;
  if (t.tries && !t.held && since_resend >= rtt_.min_ns() &&
      since_resend <= static_cast<int64_t>(rtt_.srtt_ns()) + reorder_window_ns() &&
      (!resend_answered_ || t.last_tx_ns > resend_answered_tx_ns_)) {
    resend_answered_ = true;
    resend_answered_tx_ns_ = t.last_tx_ns;
    resend_answered_at_ns_ = now;
  }
  t.busy = false;
}

bool LossDetector::held(RoundTimer& t, int64_t now) {
  if (!t.busy || t.held || t.tries == 0) return false;
  last_answer_ns_ = now;
  t.held = true;
  // The answer now waits for the other contributions: give it a full timer from here.
  t.deadline_ns = now + t.rto_ns;
  return true;
}

int64_t LossDetector::ask_gap_ns() const {
  const int64_t learned = floor_->learned() ? floor_->ns() : 0;
  return std::max({rtt_.min_ns() + reorder_window_ns(), kAskedGapNs, learned});
}

bool LossDetector::asked(RoundTimer& t, int64_t now) {
  floor_->decay(now);
  if (!t.busy || now - t.last_tx_ns < ask_gap_ns()) return false;
  last_answer_ns_ = now;
  t.held = false;
  mark_resent(t, now, RetxCause::kAsked);
  return true;
}

void LossDetector::spurious(RetxCause cause, int64_t rtt_ns, int64_t wait_ns, int64_t now) {
  if (cause == RetxCause::kRack) reordered(now);
  if (rtt_ns > 0) rtt_.sample(rtt_ns);
  if (wait_ns > 0 &&
      (cause == RetxCause::kTimeout || cause == RetxCause::kProbe || cause == RetxCause::kAsked))
    floor_->raise(wait_ns, now);
}

void LossDetector::reordered(int64_t now) {
  rack_losses_since_spurious_ = 0;
  if (now - reo_raised_ns_ >= static_cast<int64_t>(rtt_.srtt_ns())) {
    reo_mult_ = std::min(reo_mult_ + 1, kMaxReorderMult);
    reo_raised_ns_ = now;
  }
}

void LossDetector::mark_resent(RoundTimer& t, int64_t now, RetxCause cause) {
  t.tries++;
  t.cause = cause;
  t.last_tx_ns = now;
  t.last_tx_order = ++transmissions_;
  t.rto_ns = next_rto(t, now);
  t.deadline_ns = now + t.rto_ns;
  if (cause == RetxCause::kRack && reo_mult_ > 1 && ++rack_losses_since_spurious_ >= kReorderPersist) {
    reo_mult_ = 1;
    rack_losses_since_spurious_ = 0;
  }
}

void LossDetector::back_off(RoundTimer& t, int64_t now) const {
  t.rto_ns = next_rto(t, now);
  t.deadline_ns = now + t.rto_ns;
}

int64_t LossDetector::next_rto(const RoundTimer& t, int64_t now) const {
  int64_t rto = std::min(t.rto_ns * 2, rto_max_);
  if (last_answer_ns_ > 0 && now - last_answer_ns_ < rto_max_)
    rto = std::min(rto, kAliveBackoff * rtt_.initial_rto(floor_->ns(), rto_max_));
  return rto;
}

int64_t LossDetector::scan(RoundTimer* timers, size_t n, int64_t now, std::vector<unsigned>* resend,
                           size_t first, size_t stride) {
  floor_->decay(now);
  const int64_t reorder_ns = reorder_window_ns();
  const int64_t srtt = static_cast<int64_t>(rtt_.srtt_ns());
  // One probe: the expired round whose latest transmission is oldest (in a batch: sent first),
  // preferring rounds the peer has not said it holds (their data may be lost; a HELD round only
  // waits for its result). After each probe its round is the youngest, so probes rotate through the
  // unconfirmed rounds: every rank learns which of its own rounds the others wait for, whatever
  // order it sent them in.
  int probe = -1;
  for (size_t i = first; i < n; i += stride) {
    RoundTimer& t = timers[i];
    if (!t.busy) continue;
    const int64_t lost_at = rack_deadline(t, srtt, reorder_ns);
    const bool overtaken = lost_at <= now;
    const bool expired = t.deadline_ns <= now;
    if (overtaken || (expired && sent_before_newest_delivered(t))) {
      mark_resent(t, now, overtaken ? RetxCause::kRack : RetxCause::kTimeout);
      resend->push_back(static_cast<unsigned>(i));
    } else if (expired) {
      const RoundTimer* p = probe < 0 ? nullptr : &timers[probe];
      if (!p || (p->held && !t.held) ||
          (p->held == t.held && (t.last_tx_ns < p->last_tx_ns ||
                                 (t.last_tx_ns == p->last_tx_ns && t.last_tx_order < p->last_tx_order))))
        probe = static_cast<int>(i);
    }
  }
  if (probe >= 0) {
    mark_resent(timers[probe], now, RetxCause::kProbe);
    resend->push_back(static_cast<unsigned>(probe));
  }
  int64_t next = std::numeric_limits<int64_t>::max();
  for (size_t i = first; i < n; i += stride) {
    RoundTimer& t = timers[i];
    if (!t.busy) continue;
    if (t.deadline_ns <= now) back_off(t, now);  // due but not the probe
    next = std::min({next, t.deadline_ns, rack_deadline(t, srtt, reorder_ns)});
  }
  return next;
}

bool LossDetector::earlier_in_newest_batch(const RoundTimer& t) const {
  return t.last_tx_ns == newest_delivered_tx_ns_ && t.last_tx_order < newest_delivered_order_;
}

bool LossDetector::sent_before_newest_delivered(const RoundTimer& t) const {
  return t.last_tx_ns < newest_delivered_tx_ns_ || earlier_in_newest_batch(t);
}

int64_t LossDetector::rack_deadline(const RoundTimer& t, int64_t srtt, int64_t reorder_ns) const {
  if (t.held) return std::numeric_limits<int64_t>::max();
  int64_t at = std::numeric_limits<int64_t>::max();
  // Overtaken: a round sent more than the reordering window later was answered, or one sent after
  // it in the same batch. A batch goes out in order at one instant (a whole window at an allreduce's
  // start), and the other ranks send the same chunks in about the same order; without the order no
  // answer could show an earlier round of the batch lost, and only probes, one per timer, found it.
  if (t.last_tx_ns + reorder_ns < newest_delivered_tx_ns_ || earlier_in_newest_batch(t))
    at = t.last_tx_ns + srtt + reorder_ns;
  // Every round resent in the same batch as the answered resend counts as sent before it, also those
  // after it in the batch: resends go out in slot order, not in the order the others wait for them,
  // and together they should have come back together.
  if (resend_answered_ && t.last_tx_ns <= resend_answered_tx_ns_)
    at = std::min(at, resend_answered_at_ns_ + srtt + reorder_ns);
  return at;
}

}  // namespace gradswitch
