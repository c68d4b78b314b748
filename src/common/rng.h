// Loss injection for tests and benchmarks (--drop-rate / --seed of the switch's backends, the
// worker's drop_rate hook): one small deterministic PRNG, so that a seed means the same everywhere
// and a loss test is reproducible. Not for secrets (the control plane draws those from getrandom).
#pragma once

#include <cstdint>

namespace gradswitch {

// SplitMix64 (Steele, Lea, Flood 2014): a 64-bit state advanced by a constant, then mixed.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Drops a fraction `rate` (0..1) of what it is asked about. `stream` separates the injectors that
// share a seed (a switch thread, a worker rank), so that they do not drop in lockstep.
class LossInjector {
 public:
  LossInjector() = default;
  LossInjector(double rate, uint64_t seed, uint64_t stream)
      : state_(seed ^ (0x5851F42D4C957F2Dull * (stream + 1))),
        threshold_(rate >= 1.0  ? UINT64_MAX
                   : rate > 0.0 ? static_cast<uint64_t>(rate * 18446744073709551616.0)
                                : 0) {}
  bool active() const { return threshold_ != 0; }
  // True when the next packet is to be dropped.
  bool drop() { return threshold_ != 0 && (threshold_ == UINT64_MAX || splitmix64(state_) < threshold_); }

 private:
  uint64_t state_ = 0;
  uint64_t threshold_ = 0;  // drop when the next output is below it; UINT64_MAX: always
};

}  // namespace gradswitch
