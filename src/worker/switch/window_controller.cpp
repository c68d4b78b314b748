// The delay-based window controller (see window_controller.h).
#include "worker/switch/window_controller.h"

#include <algorithm>
#include <cmath>

namespace gradswitch::worker {

namespace {

constexpr double kBeta = 0.8;    // Swift's multiplicative-decrease gain on the excess delay
constexpr double kMaxCut = 0.5;  // at most halve the window per period
constexpr double kIncrease = 1;  // rounds added per period once past the start
constexpr int64_t kMinPeriodNs = 100'000;
constexpr int64_t kBaseWindowNs = 10'000'000'000;  // the base round trip is the minimum of 10-20 s
constexpr int64_t kMinDrainNs = 1'000'000;
// Swift's flow-based scaling of the target: a window of one round tolerates kScaleRange x target
// more queue than a window of kScaleMaxRounds or more, in proportion to 1/sqrt(window) between them.
constexpr double kScaleRange = 2;
constexpr double kScaleMaxRounds = 256;

}  // namespace

WindowController::WindowController(unsigned cap, int64_t target_queue_ns, unsigned initial,
                                   int64_t wall_minus_steady_ns)
    : cap_(std::max(cap, 1u)),
      target_ns_(target_queue_ns),
      wall_offset_ns_(wall_minus_steady_ns),
      cwnd_(std::clamp<double>(initial, 1, std::max(cap, 1u))) {}

unsigned WindowController::window() const {
  return static_cast<unsigned>(std::clamp<double>(std::floor(cwnd_), 1, cap_));
}

int64_t WindowController::drain_ns() const {
  // Twice the target: the queue at the target empties in the first half, the second measures it
  // empty; at least 1 ms, for clocks that disagree by a fraction of it and for the round trips
  // that must come back in it.
  return std::max<int64_t>(2 * target_ns_, kMinDrainNs);
}

bool WindowController::draining(int64_t now) const {
  return (now + wall_offset_ns_) % kDrainEveryNs < drain_ns();  // wall-clock times are positive
}

int64_t WindowController::base_rtt_ns() const {
  if (base_cur_ < 0) return std::max<int64_t>(base_prev_, 0);
  if (base_prev_ < 0) return base_cur_;
  return std::min(base_cur_, base_prev_);
}

void WindowController::note_base(int64_t rtt, int64_t now) {
  if (base_epoch_ == 0) base_epoch_ = now;
  if (now - base_epoch_ >= kBaseWindowNs) {
    base_prev_ = base_cur_;
    base_cur_ = -1;
    base_epoch_ = now;
  }
  if (base_cur_ < 0 || rtt < base_cur_) base_cur_ = rtt;
}

void WindowController::start_period(int64_t now, int64_t srtt_ns) {
  period_start_ = now;
  period_len_ = std::max(srtt_ns, kMinPeriodNs);
  period_min_rtt_ = -1;
  period_limited_ = false;
  period_drained_ = false;
}

bool WindowController::on_result(int64_t now, int64_t own_rtt_ns, bool window_limited, int64_t srtt_ns) {
  if (period_start_ == 0) start_period(now, srtt_ns);
  if (own_rtt_ns > 0) {
    note_base(own_rtt_ns, now);
    if (period_min_rtt_ < 0 || own_rtt_ns < period_min_rtt_) period_min_rtt_ = own_rtt_ns;
  }
  period_limited_ |= window_limited;
  // A drain held the window down: its round trips feed the base only, and the window neither grows
  // (the drain, not the window, limited) nor shrinks (the queue it saw was built before it).
  period_drained_ |= draining(now);
  if (now - period_start_ < period_len_) return false;
  const bool cut = !period_drained_ && end_period();
  start_period(now, srtt_ns);
  return cut;
}

int64_t WindowController::tolerated_queue_ns() const {
  // With one tolerance for every window, AIMD on delay shares a queue by the ranks' estimates of
  // the base: the rank with the lowest estimate sees the most queue, cuts while the others grow,
  // and nothing brings the windows back together (on the testbed a job whose limiting rank's base
  // was a little below the others' ran markedly slower: BENCHMARKS.md §10). A tolerance that falls as
  // the window grows lets the smaller window grow where the larger one is cut.
  const double lo = 1 / std::sqrt(kScaleMaxRounds);
  const double scale = std::clamp((1 / std::sqrt(std::max(cwnd_, 1.0)) - lo) / (1 - lo), 0.0, 1.0);
  return target_ns_ + static_cast<int64_t>(kScaleRange * scale * static_cast<double>(target_ns_));
}

int64_t WindowController::excess_queue_ns() const {
  const int64_t base = base_rtt_ns();
  if (period_min_rtt_ <= 0 || base <= 0) return 0;
  return std::max<int64_t>(period_min_rtt_ - base - tolerated_queue_ns(), 0);
}

bool WindowController::end_period() {
  if (const int64_t excess = excess_queue_ns(); excess > 0) {
    const double share = static_cast<double>(excess) / static_cast<double>(period_min_rtt_);
    cwnd_ = std::max(1.0, cwnd_ * std::max(1 - kBeta * share, 1 - kMaxCut));
    slow_start_ = false;
    return true;
  }
  // Grow only a window that limited the period (not the data). A rank that measured no round trip
  // of its own grows too: it runs the job's window, which the rank that completes the rounds keeps
  // at or below its own, and run_at() keeps this one within two rounds of the job's (a rank that held
  // instead could keep the job's window low for good, its rounds never the last to arrive).
  // In slow start the window doubles once the job's has caught up with it: doubling again before
  // the others' DATA declared the last doubling would leave the job's window a doubling behind, and
  // run_at() take that for a cut.
  if (!period_limited_) return false;
  if (!slow_start_)
    cwnd_ = std::min<double>(cap_, cwnd_ + kIncrease);
  else if (job_ == 0 || job_ >= window())
    cwnd_ = std::min<double>(cap_, cwnd_ * 2);
  return false;
}

bool WindowController::undo_open(int64_t now) {
  if (cut_at_ >= 0 && now - cut_at_ > 4 * period_len_) cut_at_ = -1;  // the cut had other reasons too
  return cut_at_ >= 0;
}

bool WindowController::on_loss(int64_t now) {
  if (undo_open(now)) ++unproven_since_cut_;  // to be proven spurious too before the cut is undone
  // Only a loss behind a queue the delay rule is not holding is congestion; one cut per period. The
  // rule holds the queue near its tolerance, so that under random loss nearly every period had both
  // a loss and a queue above the tolerance, and halved: the loss cuts outnumbered the delay rule's and
  // held the window well below its lossless size (BENCHMARKS.md §10).
  if ((cut_at_ >= 0 && now - cut_at_ < period_len_) || excess_queue_ns() <= target_ns_) return false;
  before_cut_ = cwnd_;
  cut_at_ = now;
  unproven_since_cut_ = 1;
  cwnd_ = std::max(1.0, cwnd_ * (1 - kMaxCut));
  slow_start_ = false;
  return true;
}

void WindowController::run_at(unsigned job_window) {
  if (job_window == 0) return;
  job_ = std::min(job_window, cap_);
  // The job's window lags this rank's by a round trip: a window declared before this rank's latest
  // steps (two growths, or a doubling in slow start) is not a cut. Lower by more, another rank cut.
  const double step_above = slow_start_ ? job_ : 2 * kIncrease;
  if (cwnd_ > job_ + step_above) {
    cwnd_ = job_ + step_above;
    slow_start_ = false;  // another rank's window left slow start: the job's did
  }
}

bool WindowController::on_spurious(int64_t now, int64_t resent_ns) {
  if (!undo_open(now) || resent_ns < cut_at_) return false;  // no cut, or a resend from before it
  // At least 1 while a cut is open (its own resend): the last proof undoes it.
  if (--unproven_since_cut_ > 0) return false;
  cwnd_ = std::max(cwnd_, before_cut_);
  cut_at_ = -1;
  return true;
}

}  // namespace gradswitch::worker
