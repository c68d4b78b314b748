// The worker's clock: CLOCK_MONOTONIC (std::chrono::steady_clock) in nanoseconds, the time base of
// every loss timer, timeout and timeline event on the worker side. One definition for all of them.
#pragma once

#include <chrono>
#include <cstdint>

namespace gradswitch {

inline int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// CLOCK_REALTIME minus CLOCK_MONOTONIC, now: adding it to a steady time gives the wall clock, which
// hosts with synchronised clocks share (the adaptive window's drains are aligned to it).
inline int64_t wall_minus_steady_ns() {
  const int64_t wall = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  return wall - steady_now_ns();
}

}  // namespace gradswitch
