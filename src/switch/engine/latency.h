// How long rounds and allreduces take as the switch sees them, as histograms the metrics endpoint
// exports (gradswitch_round_duration_seconds, gradswitch_allreduce_duration_seconds). Like the
// counters, each histogram has one writer (a data thread) and any number of readers; recording is
// a few compares and two relaxed adds, done once per completed round, never per packet.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/counter.h"
#include "common/seq.h"

namespace gradswitch {

// Upper bounds of the buckets, in nanoseconds: 1 µs to 10 s in 1-2.5-5 steps. One more bucket
// counts what is slower.
inline constexpr std::array<uint64_t, 22> kLatencyBoundsNs = {
    1'000,         2'500,         5'000,         10'000,        25'000,      50'000,
    100'000,       250'000,       500'000,       1'000'000,     2'500'000,   5'000'000,
    10'000'000,    25'000'000,    50'000'000,    100'000'000,   250'000'000, 500'000'000,
    1'000'000'000, 2'500'000'000, 5'000'000'000, 10'000'000'000};
inline constexpr size_t kLatencyBuckets = kLatencyBoundsNs.size() + 1;

struct LatencyValues {
  std::array<uint64_t, kLatencyBuckets> counts{};  // not cumulative; the last one is above every bound
  uint64_t sum_ns = 0;
  LatencyValues& operator+=(const LatencyValues& o) {
    for (size_t i = 0; i < kLatencyBuckets; ++i) counts[i] += o.counts[i];
    sum_ns += o.sum_ns;
    return *this;
  }
  uint64_t count() const {
    uint64_t n = 0;
    for (uint64_t c : counts) n += c;
    return n;
  }
};

class LatencyHistogram {
 public:
  void observe(uint64_t ns) {
    const size_t b = static_cast<size_t>(
        std::lower_bound(kLatencyBoundsNs.begin(), kLatencyBoundsNs.end(), ns) - kLatencyBoundsNs.begin());
    counter_add(counts_[b]);
    counter_add(sum_ns_, ns);
  }
  LatencyValues read() const {
    LatencyValues v;
    for (size_t i = 0; i < kLatencyBuckets; ++i) v.counts[i] = counts_[i].load(std::memory_order_relaxed);
    v.sum_ns = sum_ns_.load(std::memory_order_relaxed);
    return v;
  }

 private:
  std::array<std::atomic<uint64_t>, kLatencyBuckets> counts_{};
  std::atomic<uint64_t> sum_ns_{0};
};

// The start of the allreduces a data thread is seeing, so that the completion of an allreduce's
// last chunk can be timed from its first packet. Allreduces stream back to back (a worker keeps up
// to 16 in flight), so the latest kSlots seqs are kept, each in the entry seq % kSlots. Owned by one
// data thread (plain fields).
class AllreduceClock {
 public:
  static constexpr size_t kSlots = 32;
  // A DATA packet of allreduce `seq` arrived at `now_ns`. An entry is taken over by a newer seq
  // only: late packets of an older allreduce (or of one already timed) change nothing.
  void seen(uint32_t seq, uint64_t now_ns) {
    Entry& e = entries_[seq % kSlots];
    if (!e.used || seq_after(seq, e.seq)) e = {seq, now_ns, true, true};
  }
  // The last chunk of `seq` completed: its duration, or 0 when its start was not seen here (or it
  // was already timed).
  uint64_t finish(uint32_t seq, uint64_t now_ns) {
    Entry& e = entries_[seq % kSlots];
    if (!e.valid || e.seq != seq) return 0;
    e.valid = false;
    return now_ns > e.first_ns ? now_ns - e.first_ns : 1;
  }

 private:
  struct Entry {
    uint32_t seq = 0;
    uint64_t first_ns = 0;
    bool valid = false;  // started and not yet timed
    bool used = false;
  };
  std::array<Entry, kSlots> entries_{};
};

}  // namespace gradswitch
