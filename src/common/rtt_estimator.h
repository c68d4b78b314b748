// A round trip's smoothed estimate, its variation and its lowest sample (RFC 6298), from which a
// round's first timer follows: what the loss detector (loss_detector.h) times its rounds by, on a
// worker's path to the switch or its ring neighbours and on a leaf switch's uplink alike.
#pragma once

#include <cstdint>

namespace gradswitch {

// Smoothed round-trip time and its variation (RFC 6298 gains), and the lowest sample seen.
class RttEstimator {
 public:
  void sample(int64_t ns);
  bool has_sample() const { return srtt_ns_ > 0; }
  double srtt_ns() const { return srtt_ns_; }
  double rttvar_ns() const { return rttvar_ns_; }
  int64_t min_ns() const { return min_ns_; }  // 0 before any sample
  // A new round's first timeout: srtt + 4 rttvar within [rto_min, rto_max]; rto_min before any sample.
  int64_t initial_rto(int64_t rto_min_ns, int64_t rto_max_ns) const;

 private:
  double srtt_ns_ = 0, rttvar_ns_ = 0;
  int64_t min_ns_ = 0;
};

}  // namespace gradswitch
