// Which chunks a rank concedes in a job with bounded-time rounds (docs/protocol.md §3.1, "Concede";
// opt-in, Options::concede). A rank whose uplink is slower than the others' sets the pace of the
// whole stream: the adaptive window clocks every rank at the rate its DATA arrives, so no round is
// ever late enough for its deadline to close it. A concede (a DATA header without payload) lets the
// rank arrive at a round without its contribution, so the round closes at once without it; the rank
// still receives every sum, and every rank rescales the chunks it lacks alike.
//
// The signal is the completer that every multicast RESULT names (the rank whose DATA arrived last):
// a healthy rank completes about 1/N of the rounds it contributes to, a rank whose uplink paces the
// job nearly all of them. Per sample of kSample such results, the share of chunks this rank sends
// with data is cut by half while it completes more than the midpoint between 1/N and all of them, and
// raised by a tenth otherwise (a floor keeps a few rounds with data: they carry the signal). Conceded
// chunks are spread evenly over the stream (an accumulator, no randomness), so every part of the
// tensor keeps most of this rank's contributions when the share is high.
#pragma once

#include <algorithm>
#include <cstdint>

namespace gradswitch::worker {

class ConcedePolicy {
 public:
  static constexpr unsigned kSample = 16;       // completer-bearing RESULTs per decision
  static constexpr double kMinKeep = 1.0 / 64;  // the least share sent with data
  static constexpr double kCut = 0.5, kRaise = 1.1;

  // `enabled` false: never concedes. `fixed_keep` in [0, 1]: a fixed share sent with data instead of
  // the policy (a test hook; negative: the policy).
  ConcedePolicy(bool enabled, unsigned world, double fixed_keep = -1.0)
      : enabled_(enabled || fixed_keep >= 0),
        fixed_(fixed_keep >= 0),
        keep_(fixed_keep >= 0 ? std::min(fixed_keep, 1.0) : 1.0),
        behind_above_(kSample * (1.0 + 1.0 / std::max(world, 1u)) / 2) {}

  // A multicast RESULT that names its completer (not PARTIAL: a round closed without a completer
  // says nothing of whose DATA was last).
  void on_completed(bool by_this_rank) {
    if (!enabled_ || fixed_) return;
    seen_ += 1;
    mine_ += by_this_rank;
    if (seen_ < kSample) return;
    keep_ = mine_ > behind_above_ ? std::max(keep_ * kCut, kMinKeep) : std::min(keep_ * kRaise, 1.0);
    seen_ = mine_ = 0;
  }

  // Whether the next chunk this rank seals goes as a concede.
  bool concede_next() {
    if (!enabled_) return false;
    debt_ += 1.0 - keep_;
    if (debt_ < 1.0) return false;
    debt_ -= 1.0;
    return true;
  }

  double keep() const { return keep_; }

 private:
  bool enabled_, fixed_;
  double keep_;
  double behind_above_;  // completions per sample above which this rank's path paces the job
  double debt_ = 0;      // conceded chunks owed to the share so far
  unsigned seen_ = 0, mine_ = 0;
};

}  // namespace gradswitch::worker
