// Loss detection for rounds in flight (docs/protocol.md section 4): RTT estimation, RACK-style
// "a later round came back first" (RFC 8985) with an adaptive reordering window, single probes
// when timers expire with nothing newer delivered, and the undo side: a retransmission that the
// peer proves unnecessary (DSACK, HELD, or the original answer arriving late) widens the
// reordering window or raises the timer's floor, so the same delay does not fool it twice. It
// knows only send times and deliveries, never packets, so the switch's window and the ring use it
// alike, a leaf switch's uplink (src/switch/uplink) too, and tests drive it with a hand-made clock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/rtt_estimator.h"

namespace gradswitch {

// The timer's floor learned from stalls: a resend proven spurious after a timeout, probe or request
// raises it to 1.25x the resend's own round trip (at most a doubling per lesson); it halves after
// every 2 s without a lesson. What stalls is a host (this one, or the switch's, descheduling the
// thread that answers) or the path, not one detector's share of the rounds: the switch path's
// detectors (one per switch thread) share one floor, so a stall that fooled one of them does not
// fool the others next time.
class TimerFloor {
 public:
  TimerFloor(int64_t rto_min_ns, int64_t rto_max_ns);
  int64_t ns() const { return ns_; }
  bool learned() const { return ns_ > rto_min_; }
  void raise(int64_t wait_ns, int64_t now);
  void decay(int64_t now);

 private:
  int64_t rto_min_, rto_max_;
  int64_t ns_;
  int64_t raised_ns_ = 0;
};

// Why a round's latest retransmission was sent.
enum class RetxCause : uint8_t {
  kNone,     // never retransmitted
  kRack,     // a round sent after it was delivered first, and the reordering window passed
  kTimeout,  // its timer expired and a later round had been delivered
  kProbe,    // timers expired with nothing later delivered: the oldest round, resent alone
  kAsked,    // the peer said the round lacks this sender's data (a HELD whose body leaves it out)
};

// The timing of one round in flight (a slot's outstanding packet).
struct RoundTimer {
  bool busy = false;
  bool held = false;  // the peer said it holds this round's data (HELD): only its answer is awaited
  RetxCause cause = RetxCause::kNone;
  uint32_t tries = 0;      // retransmissions so far
  int64_t sent_ns = 0;     // first transmission
  int64_t last_tx_ns = 0;  // latest (re)transmission
  // The detector's count of transmissions at the first and the latest one: the order of rounds
  // sent at the same instant (one batch), as RFC 8985 orders segments by sequence.
  uint64_t sent_order = 0, last_tx_order = 0;
  int64_t rto_ns = 0, deadline_ns = 0;
};

class LossDetector {
 public:
  // Timers start at the RTT estimate within [rto_min, rto_max] and double per expiry up to rto_max;
  // while the peer answers, a round's timer doubles only once (its losses are bad luck, not a dead
  // path: at 10% loss a round that needs five tries is common in an allreduce of 10,000 rounds, and
  // exponential backoff made its wait the allreduce's tail).
  // `floor`: a floor shared with other detectors of the same path (nullptr: a floor of its own).
  // A copy shares its original's floor.
  LossDetector(int64_t rto_min_ns, int64_t rto_max_ns, std::shared_ptr<TimerFloor> floor = nullptr);

  const RttEstimator& rtt() const { return rtt_; }
  int64_t rto_min_ns() const { return rto_min_; }
  // The timer's learned floor (>= rto_min): raised by timeouts and requests proven spurious, halved after
  // every 2 s without one (TimerFloor).
  int64_t rto_floor_ns() const { return floor_->ns(); }
  // RACK's reordering window: mult x max(min_rtt / 4, 0.5 ms), at most max(srtt, that base).
  int64_t reorder_window_ns() const;
  unsigned reorder_mult() const { return reo_mult_; }

  // A new allreduce begins: forgets which rounds were delivered (the estimates stay).
  void begin();
  // A round is sent for the first time.
  void launch(RoundTimer& t, int64_t now);
  // A round's answer arrived. RTT sample when it was never resent (Karn). RACK counts a resent
  // round at its first transmission (the answer may be the original's); but when a resend not held
  // by the peer is answered at least min_rtt after it was sent (RFC 8985 6.2) and within a round
  // trip, the path delivered at that resend's time: rounds sent before it (or with it) whose answers
  // do not follow within srtt + the reordering window are lost (a lost tail recovers after one
  // timeout, not after one probe per doubled timeout). `after_recovery`: a resend completed the round
  // (its RESULT carries RETX), so even a round sent once gives no RTT sample: its answer waited for
  // another rank's loss recovery, which is not this path's round trip.
  void delivered(RoundTimer& t, int64_t now, bool after_recovery = false);
  // The peer holds the round's data (HELD) while it is in flight: its latest retransmission was
  // spurious. Returns true the first time (the caller counts it). The round leaves RACK (it is not
  // lost; its answer waits for other ranks) and keeps a timer for the answer itself. Nothing is
  // learned yet: the round waits either for a rank that is late (results come back out of this
  // rank's send order: reordering, see `reordered`) or for one whose DATA was lost (its resend
  // will complete the round); its RESULT tells which. The timer's floor never learns from it.
  bool held(RoundTimer& t, int64_t now);
  // The peer says the round lacks this sender's data: it is resent now (the caller sends it) unless
  // it was sent within ask_gap_ns(): the request may have crossed that packet. Not srtt: in an
  // allreduce it holds the waits for the slowest rank (100 ms and more where a peer's window is
  // small), and a rank asked for a stuck round must not wait that long between tries. (The switch
  // asks only for rounds open 20 ms.)
  // Returns whether to send.
  bool asked(RoundTimer& t, int64_t now);
  // How recently sent a round must be for a request to resend it to be taken as crossing it: RACK's
  // wait for an answer (min_rtt + the reordering window, at least 100 us), or the timer's floor once
  // a stall raised it. On a path whose answers to this rank come late (a stalled host or link) the
  // requests come as late, after the DATA they ask for went out.
  int64_t ask_gap_ns() const;
  // A round resent by RACK turned out to have been only late, or to have waited for a late rank:
  // the reordering window widens (RFC 8985 6.2: one step per round trip, at most 32 steps).
  void reordered(int64_t now);
  // A delivered round's retransmission turned out spurious after the fact: the original answer
  // arrived after the answer to the retransmission, or the retransmission was answered from the
  // peer's copy (DSACK) after the original answer had arrived. `rtt_ns` (0: none) is an RTT sample;
  // after a timeout, probe or request, `wait_ns` (0: none), the resend's own round trip, raises the
  // timer's floor to 1.25x it (at most a doubling per lesson): the path or the peer stalled for that
  // long (a request proven stale came that late).
  void spurious(RetxCause cause, int64_t rtt_ns, int64_t wait_ns, int64_t now);

  // Decides which busy rounds of `timers` to resend at `now`. A round is resent when a round sent
  // after its latest transmission has been delivered and srtt + the reordering window have passed
  // (it was overtaken: probably lost; not for held rounds), or when its timer expired and such a
  // later round was delivered. When timers expire with nothing later delivered (a slow peer, or
  // everything lost) only one of them is resent, as a probe: the one sent longest ago, preferring
  // rounds not held; the others back off without sending. Indices of the rounds to resend are appended to
  // `*resend` in index order, the probe last; each is already marked as retransmitted (tries, cause,
  // backed-off timer). Returns the earliest deadline of the busy rounds after the scan (INT64_MAX when none
  // is busy). Only the timers first, first + stride, ... below n are this detector's (the ring keeps one
  // detector per position; the switch path one per switch thread, whose results keep their order).
  int64_t scan(RoundTimer* timers, size_t n, int64_t now, std::vector<unsigned>* resend, size_t first = 0,
               size_t stride = 1);

 private:
  // When RACK declares `t` lost (a later transmission was answered and the wait for reordering
  // passed); INT64_MAX while nothing says so.
  int64_t rack_deadline(const RoundTimer& t, int64_t srtt, int64_t reorder_ns) const;
  // Whether `t`'s latest transmission went before that of the newest delivered round: earlier, or
  // in the same batch and earlier in it (the latter alone: earlier_in_newest_batch).
  bool sent_before_newest_delivered(const RoundTimer& t) const;
  bool earlier_in_newest_batch(const RoundTimer& t) const;
  void mark_resent(RoundTimer& t, int64_t now, RetxCause cause);
  void back_off(RoundTimer& t, int64_t now) const;
  // The round's next timer after an expiry: twice the last, at most rto_max; while answers flow
  // (one arrived within rto_max), at most kAliveBackoff x the base timer.
  int64_t next_rto(const RoundTimer& t, int64_t now) const;

  int64_t rto_min_, rto_max_;
  RttEstimator rtt_;
  // When the peer last answered anything (a result or HELD): the path was alive then.
  int64_t last_answer_ns_ = 0;
  // Send time (and order) of the most recently sent round whose answer has arrived: a busy round
  // transmitted before it is probably lost, since answers come back in about send order.
  int64_t newest_delivered_tx_ns_ = 0;
  uint64_t newest_delivered_order_ = 0;
  uint64_t transmissions_ = 0;  // numbers the transmissions (RoundTimer's orders)
  // The latest resend (not held) whose answer arrived, and when: the path was alive then.
  bool resend_answered_ = false;
  int64_t resend_answered_tx_ns_ = 0;
  int64_t resend_answered_at_ns_ = 0;
  // RFC 8985 section 6.2: the reordering window grows by one step per round trip in which a
  // RACK retransmission proved spurious, and returns to one step after 16 RACK losses without.
  unsigned reo_mult_ = 1;
  unsigned rack_losses_since_spurious_ = 0;
  int64_t reo_raised_ns_ = 0;
  // Timer floor learned from spurious timeouts (scheduling stalls of the peer or of this host);
  // shared with the detectors given the same one, and with this one's copies.
  std::shared_ptr<TimerFloor> floor_;
};

}  // namespace gradswitch
