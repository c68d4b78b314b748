// The worker's counters (Group::stats) and the drop-injection test hook, shared by the data
// paths (switch window, ring). Counters are written by the group's one background thread and
// read from any thread, hence relaxed atomics without read-modify-write.
#pragma once

#include <atomic>
#include <cstdint>

namespace gradswitch::worker {

struct Stats {
  uint64_t allreduces = 0;
  uint64_t packets_sent = 0, bytes_sent = 0;
  uint64_t packets_received = 0, bytes_received = 0;
  uint64_t retransmissions = 0;   // DATA packets resent after a timer fired
  uint64_t injected_drops = 0;    // DATA packets dropped by the drop_rate hook
  uint64_t ignored = 0;           // received datagrams matching no outstanding round (late duplicates, ...)
  uint64_t unicast_results = 0;   // results answering a retransmission
  uint64_t bootstrap_rounds = 0;  // fixed32 exponent rounds (count = 0)
  uint64_t ring_allreduces = 0;   // allreduces (or their rest, after a fallback) run on the ring
  uint64_t fallbacks = 0;         // 1 once the switch was lost (or unreachable) and the ring took over
  uint64_t fallback_held = 0;     // chunks of the allreduce in flight whose sums this rank held then
};

struct Counters {
  std::atomic<uint64_t> allreduces{0}, packets_sent{0}, bytes_sent{0}, packets_received{0}, bytes_received{0},
      retransmissions{0}, injected_drops{0}, ignored{0}, unicast_results{0}, bootstrap_rounds{0},
      ring_allreduces{0}, fallbacks{0}, fallback_held{0};

  static void bump(std::atomic<uint64_t>& a, uint64_t n = 1) {
    a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  Stats snapshot() const;
};

// Test hook: drops a fraction of outgoing data packets with a PRNG seeded from (seed, rank), so
// loss tests are reproducible.
class DropHook {
 public:
  DropHook(double rate, uint64_t seed, unsigned rank)
      : rate_(rate), state_(seed * 0x9E3779B97F4A7C15ull + rank + 1) {}
  // True when the next packet is to be dropped.
  bool drop();

 private:
  double rate_;
  uint64_t state_;
};

}  // namespace gradswitch::worker
