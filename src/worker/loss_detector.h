// Loss detection for rounds in flight (docs/protocol.md section 4): RTT estimation, RACK-style
// "a later round came back first" (RFC 8985), and single probes when timers expire with nothing
// newer delivered. It knows only send times and deliveries, never packets, so the switch's window
// and the ring use it alike, and tests drive it with a hand-made clock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradswitch::worker {

// Smoothed round-trip time and its variation (RFC 6298 gains).
class RttEstimator {
 public:
  void sample(int64_t ns);
  bool has_sample() const { return srtt_ns_ > 0; }
  double srtt_ns() const { return srtt_ns_; }
  double rttvar_ns() const { return rttvar_ns_; }
  // A new round's first timeout: srtt + 4 rttvar within [rto_min, rto_max]; rto_min before any sample.
  int64_t initial_rto(int64_t rto_min_ns, int64_t rto_max_ns) const;

 private:
  double srtt_ns_ = 0, rttvar_ns_ = 0;
};

// The timing of one round in flight (a slot's outstanding packet).
struct RoundTimer {
  bool busy = false;
  uint32_t tries = 0;      // retransmissions so far
  int64_t sent_ns = 0;     // first transmission
  int64_t last_tx_ns = 0;  // latest (re)transmission
  int64_t rto_ns = 0, deadline_ns = 0;
};

class LossDetector {
 public:
  // Timers start at the RTT estimate within [rto_min, rto_max] and double per expiry up to rto_max.
  LossDetector(int64_t rto_min_ns, int64_t rto_max_ns);

  const RttEstimator& rtt() const { return rtt_; }
  int64_t rto_min_ns() const { return rto_min_; }

  // A new allreduce begins: forgets which rounds were delivered (the RTT estimate stays).
  void begin();
  // A round is sent for the first time.
  void launch(RoundTimer& t, int64_t now);
  // A round's answer arrived: an RTT sample when it was never resent (Karn), and the newest
  // send time delivered so far (RACK).
  void delivered(RoundTimer& t, int64_t now);

  // Decides which busy rounds of `timers` to resend at `now`. A round is resent when a round sent
  // after its latest transmission has been delivered and srtt + a reordering window have passed
  // (it was overtaken: probably lost), or when its timer expired and such a later round was
  // delivered. When timers expire with nothing later delivered (a slow peer, or everything lost)
  // only the oldest of them is resent, as a probe; the others back off without sending. Indices
  // of the rounds to resend are appended to `*resend` in index order, the probe last; each is
  // already marked as retransmitted (tries, backed-off timer). Returns the earliest deadline of
  // the busy rounds after the scan (INT64_MAX when none is busy). Only the timers first,
  // first + stride, ... below n are this detector's (the ring keeps one detector per position).
  int64_t scan(RoundTimer* timers, size_t n, int64_t now, std::vector<unsigned>* resend, size_t first = 0,
               size_t stride = 1);

 private:
  void mark_resent(RoundTimer& t, int64_t now) const;
  void back_off(RoundTimer& t, int64_t now) const;

  int64_t rto_min_, rto_max_;
  RttEstimator rtt_;
  // Send time of the most recently sent round whose answer has arrived: a busy round transmitted
  // before it is probably lost, since answers come back in about send order.
  int64_t newest_delivered_tx_ns_ = 0;
};

}  // namespace gradswitch::worker
