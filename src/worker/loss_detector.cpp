// RTT estimation and the RACK-style loss detector with single probes (see loss_detector.h).
#include "worker/loss_detector.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace gradswitch::worker {

void RttEstimator::sample(int64_t ns) {
  double s = static_cast<double>(ns);
  if (srtt_ns_ <= 0) {
    srtt_ns_ = s;
    rttvar_ns_ = s / 2;
  } else {
    rttvar_ns_ = 0.75 * rttvar_ns_ + 0.25 * std::fabs(srtt_ns_ - s);
    srtt_ns_ = 0.875 * srtt_ns_ + 0.125 * s;
  }
}

int64_t RttEstimator::initial_rto(int64_t rto_min_ns, int64_t rto_max_ns) const {
  if (srtt_ns_ <= 0) return rto_min_ns;
  int64_t r = static_cast<int64_t>(srtt_ns_ + 4 * rttvar_ns_);
  return std::clamp(r, rto_min_ns, rto_max_ns);
}

LossDetector::LossDetector(int64_t rto_min_ns, int64_t rto_max_ns)
    : rto_min_(rto_min_ns), rto_max_(std::max(rto_max_ns, rto_min_ns)) {}

void LossDetector::begin() {
  newest_delivered_tx_ns_ = 0;
}

void LossDetector::launch(RoundTimer& t, int64_t now) {
  t.busy = true;
  t.tries = 0;
  t.sent_ns = now;
  t.last_tx_ns = now;
  t.rto_ns = rtt_.initial_rto(rto_min_, rto_max_);
  t.deadline_ns = now + t.rto_ns;
}

void LossDetector::delivered(RoundTimer& t, int64_t now) {
  if (t.tries == 0) rtt_.sample(now - t.sent_ns);
  newest_delivered_tx_ns_ = std::max(newest_delivered_tx_ns_, t.last_tx_ns);
  t.busy = false;
}

void LossDetector::mark_resent(RoundTimer& t, int64_t now) const {
  t.tries++;
  t.last_tx_ns = now;
  t.rto_ns = std::min(t.rto_ns * 2, rto_max_);
  t.deadline_ns = now + t.rto_ns;
}

void LossDetector::back_off(RoundTimer& t, int64_t now) const {
  t.rto_ns = std::min(t.rto_ns * 2, rto_max_);
  t.deadline_ns = now + t.rto_ns;
}

int64_t LossDetector::scan(RoundTimer* timers, size_t n, int64_t now, std::vector<unsigned>* resend,
                           size_t first, size_t stride) {
  const int64_t reorder_ns = std::max<int64_t>(static_cast<int64_t>(rtt_.srtt_ns() / 4), 500'000);
  const int64_t srtt = static_cast<int64_t>(rtt_.srtt_ns());
  int probe = -1;
  for (size_t i = first; i < n; i += stride) {
    RoundTimer& t = timers[i];
    if (!t.busy) continue;
    const bool overtaken =
        t.last_tx_ns + reorder_ns < newest_delivered_tx_ns_ && now - t.last_tx_ns >= srtt + reorder_ns;
    if (overtaken || (t.deadline_ns <= now && t.last_tx_ns < newest_delivered_tx_ns_)) {
      mark_resent(t, now);
      resend->push_back(static_cast<unsigned>(i));
    } else if (t.deadline_ns <= now) {
      if (probe < 0 || t.last_tx_ns < timers[probe].last_tx_ns) probe = static_cast<int>(i);
    }
  }
  if (probe >= 0) {
    mark_resent(timers[probe], now);
    resend->push_back(static_cast<unsigned>(probe));
  }
  int64_t next = std::numeric_limits<int64_t>::max();
  for (size_t i = first; i < n; i += stride) {
    RoundTimer& t = timers[i];
    if (!t.busy) continue;
    if (t.deadline_ns <= now) back_off(t, now);  // due but not the probe
    next = std::min(next, t.deadline_ns);
  }
  return next;
}

}  // namespace gradswitch::worker
