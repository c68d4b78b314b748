// Counter snapshots and the drop hook (see counters.h).
#include "worker/counters.h"

namespace gradswitch::worker {

Stats Counters::snapshot() const {
  auto r = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  Stats s;
  s.allreduces = r(allreduces);
  s.packets_sent = r(packets_sent);
  s.bytes_sent = r(bytes_sent);
  s.packets_received = r(packets_received);
  s.bytes_received = r(bytes_received);
  s.retransmissions = r(retransmissions);
  s.injected_drops = r(injected_drops);
  s.ignored = r(ignored);
  s.unicast_results = r(unicast_results);
  s.bootstrap_rounds = r(bootstrap_rounds);
  s.ring_allreduces = r(ring_allreduces);
  s.fallbacks = r(fallbacks);
  s.fallback_held = r(fallback_held);
  return s;
}

bool DropHook::drop() {
  if (rate_ <= 0) return false;
  // splitmix64
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1p-53 < rate_;
}

}  // namespace gradswitch::worker
