// The project's one clock: CLOCK_MONOTONIC (std::chrono::steady_clock) in nanoseconds, the time base of
// every loss timer, timeout and timeline event on the worker, and of the switch's ingest() now_ns, job
// activity and control-plane deadlines. One definition for all of them.
#pragma once

#include <chrono>
#include <cstdint>

namespace gradswitch {

inline int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The same clock unsigned, as the switch's engine and control plane keep their times.
inline uint64_t monotonic_ns() {
  return static_cast<uint64_t>(steady_now_ns());
}

// CLOCK_REALTIME (std::chrono::system_clock) in nanoseconds since the epoch: the clock that hosts
// with synchronised clocks share (timeline files record it; the adaptive window's drains align to it).
inline int64_t wall_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The wall clock minus the steady clock, now: adding it to a steady time gives the wall clock.
inline int64_t wall_minus_steady_ns() {
  return wall_now_ns() - steady_now_ns();
}

}  // namespace gradswitch
