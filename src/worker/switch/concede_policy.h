// Which chunks a rank concedes in a job with bounded-time rounds (docs/protocol.md §3.1, "Concede";
// opt-in, Options::concede). A rank whose uplink is slower than the others' sets the pace of the
// whole stream: the adaptive window clocks every rank at the rate its DATA arrives, so no round is
// ever late enough for its deadline to close it. A concede (a DATA header without payload) lets the
// rank arrive at a round without its contribution, so the round closes at once without it; the rank
// still receives every sum.
//
// The signal is the completer that every multicast RESULT names (the rank whose arrival was last):
// a healthy rank completes about 1/N of the rounds, a rank whose uplink paces the job nearly all of
// them (its concessions' rounds too: they queue behind its DATA). The switch varies the order of a
// result's copies for this to hold (result_batch.h). A sample is kSample such rounds: the rounds of
// one GRO/GSO train share their completer, so a healthy rank completes whole runs in a row, and a
// sample must span many trains. A sample is "behind" when this rank completed more than the midpoint
// between 1/N and all of them. Conceding starts (half the chunks) after two samples in a row at three
// quarters of the way from 1/N to all (a straggler's first samples show 90-100%); then each sample
// behind cuts the share sent with data by 30% and each other one raises it by 10%, so the share
// hovers just below what the uplink carries. The floor keeps a chunk per block: its rounds carry the
// signal.
//
// The share applies per block of kBlock chunks: a run with data, the rest as concessions. Runs of
// one size keep the UDP GSO writes (and the switch's GRO trains) whole; chunks spread one by one cut
// every train, and the job's pace is the hosts' per-packet CPU as much as any link. Each allreduce
// starts its first block at a random place (restart()), so that from step to step every chunk of a
// tensor goes with data as often as any other: a caller that keeps what it conceded for the next
// step (Group::allreduce_async's `unsummed`, error feedback) sends it within about 1/keep steps.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/rng.h"

namespace gradswitch::worker {

class ConcedePolicy {
 public:
  static constexpr unsigned kSample = 512;      // completer-bearing RESULTs per decision: 16 trains of 32
  static constexpr unsigned kBlock = 64;        // chunks per block the share applies to
  static constexpr double kMinKeep = 1.0 / 64;  // the least share sent with data: a chunk per block
  static constexpr double kStart = 0.5, kCut = 0.7, kRaise = 1.1;

  // `adapts` false: never concedes, unless `fixed_keep` in [0, 1] gives a fixed share sent with data
  // (a test hook; negative: none). `seed` draws the blocks' starting places (restart()).
  ConcedePolicy(bool adapts, unsigned world, double fixed_keep = -1.0, uint64_t seed = 0)
      : adapts_(adapts && fixed_keep < 0),
        keep_(fixed_keep >= 0 ? std::min(fixed_keep, 1.0) : 1.0),
        behind_above_(kSample * (1.0 + 1.0 / std::max(world, 1u)) / 2),
        start_above_(kSample * (3.0 + 1.0 / std::max(world, 1u)) / 4),
        rng_(seed) {}

  // A multicast RESULT that names its completer (a round its deadline closed names none), its own
  // concessions' rounds included: they queue behind its DATA on a slow uplink.
  void on_completed(bool by_this_rank) {
    if (!adapts_) return;
    seen_ += 1;
    mine_ += by_this_rank;
    if (seen_ < kSample) return;
    const bool behind = mine_ > behind_above_, far_behind = mine_ > start_above_;
    if (!behind)
      keep_ = std::min(keep_ * kRaise, 1.0);
    else if (keep_ < 1.0)
      keep_ = std::max(keep_ * kCut, kMinKeep);
    else if (far_behind && was_far_behind_)
      keep_ = kStart;
    was_far_behind_ = far_behind;
    seen_ = mine_ = 0;
  }

  // The next chunk takes a random place in a fresh block (an allreduce's first: concede_next below).
  void restart() {
    if (keep_ >= 1.0) return;
    at_ = static_cast<unsigned>(splitmix64(rng_) % kBlock);
    with_data_ = block_share();
  }

  // Whether the next chunk this rank seals, of allreduce number `allreduce` (its sequence number),
  // goes as a concession. The first chunk sealed of each newer allreduce restarts: fixed32 seals
  // chunks in the order their exponent rounds return, not from chunk 0, and the last chunks of one
  // allreduce may follow the first of the next.
  bool concede_next(uint32_t allreduce) {
    if (!sealed_any_ || static_cast<int32_t>(allreduce - allreduce_) > 0) {
      sealed_any_ = true;
      allreduce_ = allreduce;
      restart();
    }
    return concede_next();
  }
  // The same within the current allreduce.
  bool concede_next() {
    if (at_ == 0) with_data_ = block_share();
    const bool concede = at_ >= with_data_;
    at_ = at_ + 1 == kBlock ? 0 : at_ + 1;
    return concede;
  }

  double keep() const { return keep_; }
  // While conceding, this policy paces the rank's uplink, not its window: see learn_from_result.
  bool conceding() const { return keep_ < 1.0; }

 private:
  unsigned block_share() const { return static_cast<unsigned>(keep_ * kBlock + 0.5); }

  bool adapts_;
  double keep_;
  // Completions per sample above which this rank is behind, and far enough behind to start conceding.
  double behind_above_, start_above_;
  uint64_t rng_;
  uint32_t allreduce_ = 0;  // the newest allreduce a chunk was sealed of
  bool sealed_any_ = false;
  unsigned at_ = 0, with_data_ = kBlock;  // the next chunk's place in its block; its chunks with data
  bool was_far_behind_ = false;           // the last sample's verdict: conceding starts after two in a row
  unsigned seen_ = 0, mine_ = 0;
};

}  // namespace gradswitch::worker
