// The round-trip estimate (see rtt_estimator.h).
#include "common/rtt_estimator.h"

#include <algorithm>
#include <cmath>

namespace gradswitch {

void RttEstimator::sample(int64_t ns) {
  if (ns <= 0) ns = 1;
  double s = static_cast<double>(ns);
  if (srtt_ns_ <= 0) {
    srtt_ns_ = s;
    rttvar_ns_ = s / 2;
  } else {
    rttvar_ns_ = 0.75 * rttvar_ns_ + 0.25 * std::fabs(srtt_ns_ - s);
    srtt_ns_ = 0.875 * srtt_ns_ + 0.125 * s;
  }
  if (min_ns_ == 0 || ns < min_ns_) min_ns_ = ns;
}

int64_t RttEstimator::initial_rto(int64_t rto_min_ns, int64_t rto_max_ns) const {
  if (srtt_ns_ <= 0) return std::min(rto_min_ns, rto_max_ns);
  int64_t r = static_cast<int64_t>(srtt_ns_ + 4 * rttvar_ns_);
  return std::clamp(r, std::min(rto_min_ns, rto_max_ns), rto_max_ns);
}

}  // namespace gradswitch
