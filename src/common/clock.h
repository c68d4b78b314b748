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

}  // namespace gradswitch
