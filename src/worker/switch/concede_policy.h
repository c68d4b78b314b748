// Which chunks a rank concedes in a job with bounded-time rounds (docs/protocol.md §3.1, "Concede";
// opt-in, Options::concede). A rank whose uplink is slower than the others' sets the pace of the
// whole stream: the adaptive window clocks every rank at the rate its DATA arrives, so no round is
// ever late enough for its deadline to close it. A concede (a DATA header without payload) lets the
// rank arrive at a round without its contribution, so the round closes at once without it; the rank
// still receives every sum, and every rank rescales the chunks it lacks alike.
//
// The signal is the completer that every multicast RESULT names (the rank whose arrival was last):
// a healthy rank completes about 1/N of the rounds, a rank whose uplink paces the job nearly all of
// them (the rounds it concedes too: a concession closes its round, and it queues behind the rank's
// DATA). The switch must vary the order of a result's copies for this to hold (result_batch.h).
// A sample of kSample such rounds is "behind" when this rank completed more than the midpoint
// between 1/N and all of them. A rank that sends every chunk with data starts conceding half of them
// after two samples in a row in which it completed three quarters of the way from 1/N to all of them
// (81% of 4 ranks; a straggler's first samples show 90-100%, digits' small steps less than the
// MLP's; a healthy rank's runs of trains, below, reach the midpoint now and then). Once
// conceding, each sample behind cuts the share sent with data by 30% and each other one raises it by
// 10%, so the share hovers just below what its uplink carries (a floor keeps a chunk per block).
// A sample spans many GRO/GSO trains: the rounds of one train share their completer (the rank whose
// train the switch took last), so a healthy rank completes whole runs of rounds in a row; a sample of
// 16 rounds (tried first) mistook such a run for a straggler.
// The share applies per block of kBlock chunks in the order they are sealed: the block's first
// chunks go with data, the rest as concessions. Runs of one size keep the UDP GSO writes (and the
// switch's GRO trains) whole; chunks spread one by one among concessions cut every train at each
// change of size, and on the testbed the job's pace is the hosts' per-packet CPU as much as any link
// (1.37-1.66x of the no-straggler iteration spread, 1.06-1.13x in blocks).
#pragma once

#include <algorithm>
#include <cstdint>

namespace gradswitch::worker {

class ConcedePolicy {
 public:
  static constexpr unsigned kSample = 512;      // completer-bearing RESULTs per decision: 16 trains of 32
  static constexpr unsigned kBlock = 64;        // chunks per block the share applies to
  static constexpr double kMinKeep = 1.0 / 64;  // the least share sent with data: a chunk per block
  static constexpr double kStart = 0.5, kCut = 0.7, kRaise = 1.1;

  // `enabled` false: never concedes. `fixed_keep` in [0, 1]: a fixed share sent with data instead of
  // the policy (a test hook; negative: the policy).
  ConcedePolicy(bool enabled, unsigned world, double fixed_keep = -1.0)
      : enabled_(enabled || fixed_keep >= 0),
        fixed_(fixed_keep >= 0),
        keep_(fixed_keep >= 0 ? std::min(fixed_keep, 1.0) : 1.0),
        behind_above_(kSample * (1.0 + 1.0 / std::max(world, 1u)) / 2),
        start_above_(kSample * (3.0 + 1.0 / std::max(world, 1u)) / 4) {}

  // A multicast RESULT that names its completer (a round its deadline closed names none), its own
  // concessions' rounds included: they queue behind its DATA on a slow uplink.
  void on_completed(bool by_this_rank) {
    if (!enabled_ || fixed_) return;
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

  // Whether the next chunk this rank seals goes as a concession.
  bool concede_next() {
    if (!enabled_) return false;
    if (at_ == 0) with_data_ = static_cast<unsigned>(keep_ * kBlock + 0.5);  // the block's share
    const bool concede = at_ >= with_data_;
    at_ = at_ + 1 == kBlock ? 0 : at_ + 1;
    return concede;
  }

  double keep() const { return keep_; }
  // While conceding, this policy paces the rank's uplink, not its window: see learn_from_result.
  bool conceding() const { return keep_ < 1.0; }

 private:
  bool enabled_, fixed_;
  double keep_;
  // Completions per sample above which this rank is behind, and far enough behind to start conceding.
  double behind_above_, start_above_;
  unsigned at_ = 0, with_data_ = kBlock;  // the next chunk's place in its block; its chunks with data
  bool was_far_behind_ = false;           // the last sample's verdict: conceding starts after two in a row
  unsigned seen_ = 0, mine_ = 0;
};

}  // namespace gradswitch::worker
