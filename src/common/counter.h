// Counters with one writer (the thread that owns them) and any number of readers: the switch's
// engine and backends and the worker count this way.
#pragma once

#include <atomic>
#include <cstdint>

namespace gradswitch {

// A relaxed load and store is a plain add for the single writer (no locked instruction on the
// packet path), and readers never see a torn value.
inline void counter_add(std::atomic<uint64_t>& c, uint64_t by = 1) {
  c.store(c.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
}

}  // namespace gradswitch
