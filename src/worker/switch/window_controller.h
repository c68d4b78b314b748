// How many rounds a worker keeps in flight (docs/protocol.md section 4.2; the reasoning is in
// docs/transport.md). A delay-based AIMD controller in the manner of Swift: the window grows by one
// round per round trip (doubling while it starts) as long as the queue this rank's own packets
// meet stays below what it tolerates, and shrinks in proportion to the excess when it does not. As
// in Swift, the tolerance is the target at large windows and grows as the window shrinks (to 3 x
// the target at one round), so that ranks sharing a queue converge to equal windows even when
// their estimates of the base round trip disagree. Four things are particular to an allreduce:
//   - A round's round trip includes waiting for the slowest rank. Only rounds this rank completed
//     (the RESULT's `rank`, its completer) measure its own path; the others say when the job went on,
//     not how full the path is, and are not used as delay (a window that shrank because a peer is
//     slow would slow every rank down in turn).
//   - A job's ranks run one window, the smallest of theirs: every DATA declares its sender's window,
//     the RESULT carries the smallest its round's DATA declared (the switch takes it), and every rank
//     allows in flight that window on a coarse grid (on_grid()). Each rank's own window changes only
//     by its own decisions, so that no rank's growth is undone by a window a peer declared before it
//     learned of it; it stays within two rounds of the job's (a doubling in slow start: run_at()), so
//     that a cut anywhere is a cut of every rank's within a round trip. A rank whose window is above the
//     job's grows it without harm (it runs the job's): the rank whose path is fullest, which completes the
//     rounds and measures the queue, decides.
//   - Host scheduling makes single samples noisy: the decision uses the smallest own round trip of
//     each round-trip period (a standing queue persists through a period; a descheduled thread
//     inflates some samples, not all), against the smallest seen over the last 10 to 20 s.
//   - The base round trip must be the same for every rank that shares a queue: a rank that started
//     while another's queue stood takes that queue for its base, tolerates more queue than the
//     others, and its window settles higher while theirs shrink (the latecomer advantage of delay-based
//     control; measured: BENCHMARKS.md §10). So, as BBR's ProbeRTT, every rank drains: for a
//     short while every second it keeps at most kDrainRounds in flight, the queue that the ranks built
//     empties, and the round trips measured then are the path's. The drains are aligned to the wall
//     clock, so the ranks of every job on hosts whose clocks agree drain at once without a word: one
//     job's standing queue cannot hide behind another's drain. The drains bring the bases close,
//     not equal: the tolerance that falls with the window keeps what is left from deciding shares.
// Loss cuts the window only behind a queue that the delay rule is not holding (more than a target
// above what it tolerates: a burst, a job that joined): random loss on a link that is not full (the
// testbed's, a bad cable) is recovered by resending, not by sending slower, also while the delay rule
// holds a queue at its tolerance. A cut is undone when the peer proves every resend since it
// spurious (DSACK). The window is at most the slot pool: the pool is a cap.
#pragma once

#include <algorithm>
#include <cstdint>

namespace gradswitch::worker {

class WindowController {
 public:
  static constexpr unsigned kInitialRounds = 16;           // the window before any round trip
  static constexpr unsigned kDrainRounds = 2;              // rounds in flight during a drain
  static constexpr int64_t kDrainEveryNs = 1'000'000'000;  // a drain starts at every whole second

  // `cap`: the slot pool. `target_queue_ns`: the queueing delay tolerated above the base round trip.
  // `wall_minus_steady_ns`: what turns the steady times given to it into the wall clock (clock.h).
  WindowController(unsigned cap, int64_t target_queue_ns, unsigned initial = kInitialRounds,
                   int64_t wall_minus_steady_ns = 0);

  // This rank's congestion window, which its DATA declare: 1 .. cap.
  unsigned window() const;
  // The job's window: the smallest of this rank's and the latest a RESULT carried.
  unsigned job_window() const { return job_ ? std::min(window(), job_) : window(); }
  // Rounds allowed in flight at `now`: the job's window on the grid, or at most kDrainRounds during
  // a drain.
  unsigned allowed(int64_t now) const {
    return draining(now) ? std::min(job_window(), kDrainRounds) : on_grid(job_window());
  }
  // The largest number of rounds not above `w` on a grid of four steps per power of two (8, 10, 12,
  // 14, 16, 20, ..., 64, 80, 96, 112, 128, 160, ...); below 8, `w`. Every rank of a job reads the same
  // RESULTs, but a rank's own window may be the smallest for a while after it changed it; on the grid
  // the ranks allow the same number nearly always, and every rank answers the same RESULTs with the
  // same rounds: the job's packets keep their trains (docs/transport.md).
  static unsigned on_grid(unsigned w) {
    if (w < 8) return w;
    const unsigned step = (1u << (31 - __builtin_clz(w))) / 4;  // a quarter of the power of two below
    return w / step * step;
  }
  // A RESULT carried `job_window`, the smallest window its round's DATA declared (0: none, ignored):
  // the job runs at it, and this rank's own window comes down to within two steps of it (twice it
  // in slow start): ranks whose windows differ, or change at different moments, break the job's packets
  // into more, smaller trains, each a wake-up and a system call on every host, and a rank with more
  // only runs ahead (docs/transport.md).
  void run_at(unsigned job_window);
  // Whether `now` is in a drain: the first drain_ns() of every kDrainEveryNs of the wall clock.
  bool draining(int64_t now) const;
  // How long a drain lasts: long enough for a queue at the target to empty and be measured empty.
  int64_t drain_ns() const;
  double cwnd() const { return cwnd_; }
  bool slow_start() const { return slow_start_; }
  int64_t base_rtt_ns() const;  // 0 before any own sample
  int64_t target_queue_ns() const { return target_ns_; }
  // The queueing delay tolerated at the current window: the target, plus up to 2 x the target as
  // the window falls from 256 rounds to 1 (Swift's flow scaling: a job with the smaller window
  // grows, one with the larger backs off first, so jobs converge to equal windows).
  int64_t tolerated_queue_ns() const;

  // A round's result arrived. `own_rtt_ns`: its round trip when this rank completed it and sent it
  // once, else -1. `window_limited`: the window, not the data, limited the rounds in flight (a
  // window is only grown when it was used). `srtt_ns`: the smoothed round trip (the period).
  // Returns whether it ended a period with a cut for queueing delay (the worker counts them).
  bool on_result(int64_t now, int64_t own_rtt_ns, bool window_limited, int64_t srtt_ns);
  // A round was resent at `now` on evidence of loss (RACK, a timer with a later round answered, or
  // the peer's request): the window halves, once per period, when this period's queue is more than
  // the target above the tolerance. Returns whether it did.
  bool on_loss(int64_t now);
  // A resend sent at `resent_ns` on evidence of loss was proven spurious. A cut is undone when every
  // resend since it (the one that made it included) was, within 4 periods of it, as Linux undoes a
  // recovery on DSACK: one spurious resend does not undo a cut that a real loss also made (under
  // random loss many resends are spurious, the other ranks' resends of a round one rank lost).
  // Returns whether it undid one.
  bool on_spurious(int64_t now, int64_t resent_ns);

 private:
  // The queue this period's smallest own round trip met above what the window tolerates; 0 when
  // it met no more, or nothing was measured yet. Both the delay cut and a loss's cut need one.
  int64_t excess_queue_ns() const;
  bool end_period();  // whether it cut for delay
  // Whether a loss cut may still be undone (within 4 periods of it); forgets one that may not.
  bool undo_open(int64_t now);
  void start_period(int64_t now, int64_t srtt_ns);
  void note_base(int64_t rtt, int64_t now);

  unsigned cap_;
  unsigned job_ = 0;  // the latest RESULT's window, 0 before any
  int64_t target_ns_;
  int64_t wall_offset_ns_;
  double cwnd_;
  bool slow_start_ = true;
  // The current round-trip period.
  int64_t period_start_ = 0, period_len_ = 0;
  int64_t period_min_rtt_ = -1;  // smallest own round trip in it, -1 for none
  bool period_limited_ = false;
  bool period_drained_ = false;  // the period overlapped a drain: its round trips are no queue signal
  // Windowed minimum of own round trips: the minimum of the current and the previous 10 s.
  int64_t base_cur_ = -1, base_prev_ = -1, base_epoch_ = 0;
  // Undo: the window before the latest loss cut, when it was cut (-1: none to undo), and how many
  // resends since then are not proven spurious yet.
  double before_cut_ = 0;
  int64_t cut_at_ = -1;
  unsigned unproven_since_cut_ = 0;
};

}  // namespace gradswitch::worker
