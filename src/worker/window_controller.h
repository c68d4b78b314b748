// How many rounds a worker keeps in flight (docs/protocol.md section 4.2; the reasoning is in
// docs/transport.md). A delay-based AIMD controller in the manner of Swift: the window grows by one
// round per round trip (doubling while it starts) as long as the queue this rank's own packets
// meet stays below a target, and shrinks in proportion to the excess when it does not. Two things
// are particular to an allreduce:
//   - A round's round trip includes waiting for the slowest rank. Only rounds this rank completed
//     (the RESULT's `completer`) measure its own path; the others say when the job went on, not
//     how full the path is, and are not used as delay (a window that shrank because a peer is
//     slow would slow every rank down in turn).
//   - Host scheduling makes single samples noisy: the decision uses the smallest own round trip of
//     each round-trip period (a standing queue persists through a period; a descheduled thread
//     inflates some samples, not all), against the smallest seen over the last 10 to 20 s.
// Loss cuts the window only with a queue: random loss on a link that is not full (the testbed's,
// a bad cable) is recovered by resending, not by sending slower. A cut for a loss that the peer
// later proves spurious (DSACK) is undone. The window is at most the slot pool: the pool is a cap.
#pragma once

#include <cstdint>

namespace gradswitch::worker {

class WindowController {
 public:
  // `cap`: the slot pool. `target_queue_ns`: the queueing delay tolerated above the base round trip.
  WindowController(unsigned cap, int64_t target_queue_ns, unsigned initial = 16);

  // Rounds allowed in flight: 1 .. cap.
  unsigned window() const;
  double cwnd() const { return cwnd_; }
  bool slow_start() const { return slow_start_; }
  int64_t base_rtt_ns() const;  // 0 before any own sample
  int64_t target_queue_ns() const { return target_ns_; }

  // A round's result arrived. `own_rtt_ns`: its round trip when this rank completed it and sent it
  // once, else -1. `window_limited`: the window, not the data, limited the rounds in flight (a
  // window is only grown when it was used). `srtt_ns`: the smoothed round trip (the period).
  void on_result(int64_t now, int64_t own_rtt_ns, bool window_limited, int64_t srtt_ns);
  // A round was resent on evidence of loss (RACK or a timer with a later round answered).
  void on_loss(int64_t now);
  // A resend was proven spurious: a cut it caused is undone.
  void on_spurious(int64_t now);

 private:
  void end_period();
  void note_base(int64_t rtt, int64_t now);

  unsigned cap_;
  int64_t target_ns_;
  double cwnd_;
  bool slow_start_ = true;
  // The current round-trip period.
  int64_t period_start_ = 0, period_len_ = 0;
  int64_t period_min_rtt_ = -1;  // smallest own round trip in it, -1 for none
  bool period_limited_ = false;
  // Windowed minimum of own round trips: the minimum of the current and the previous 10 s.
  int64_t base_cur_ = -1, base_prev_ = -1, base_epoch_ = 0;
  // Undo: the window before the latest loss cut, and when it was cut.
  double before_cut_ = 0;
  int64_t cut_at_ = -1;
};

}  // namespace gradswitch::worker
