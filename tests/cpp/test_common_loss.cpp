// The loss detector and its RTT estimator (src/common, shared by the worker's rounds and a leaf
// switch's uplink) on a hand-made clock: RFC 6298 estimation, the RACK rule, probes, backoff and
// Karn's rule, the shared stall floor, and the reordering window (docs/transport.md).
#include <cmath>
#include <vector>

#include "common/loss_detector.h"
#include "common/rtt_estimator.h"
#include "harness.h"

using namespace gradswitch;

namespace {
constexpr int64_t kMs = 1'000'000;
}

TEST(loss_scan_with_stride_touches_only_its_rounds) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(6);
  for (auto& x : t) d.launch(x, 0);
  std::vector<unsigned> re;
  d.scan(t.data(), t.size(), 10 * kMs, &re, 1, 3);  // rounds 1 and 4
  CHECK(re.size() == 1 && (re[0] == 1 || re[0] == 4));
  for (unsigned i : {0u, 2u, 3u, 5u}) CHECK_EQ(t[i].deadline_ns, 4 * kMs);  // untouched
}

TEST(rtt_estimator_rfc6298) {
  RttEstimator r;
  CHECK(!r.has_sample());
  CHECK_EQ(r.initial_rto(4 * kMs, 200 * kMs), 4 * kMs);
  r.sample(10 * kMs);
  CHECK(r.srtt_ns() == 10.0 * kMs);
  CHECK(r.rttvar_ns() == 5.0 * kMs);
  CHECK_EQ(r.initial_rto(4 * kMs, 200 * kMs), 30 * kMs);  // 10 + 4 * 5
  r.sample(2 * kMs);
  CHECK(std::fabs(r.rttvar_ns() - (0.75 * 5 + 0.25 * 8) * kMs) < 1);
  CHECK(std::fabs(r.srtt_ns() - (0.875 * 10 + 0.125 * 2) * kMs) < 1);
  CHECK_EQ(r.initial_rto(4 * kMs, 20 * kMs), 20 * kMs);  // capped
}

TEST(loss_nothing_before_deadline) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(3);
  for (auto& x : t) d.launch(x, 0);
  std::vector<unsigned> re;
  int64_t next = d.scan(t.data(), t.size(), 3 * kMs, &re);
  CHECK(re.empty());
  CHECK_EQ(next, 4 * kMs);
}

TEST(loss_single_probe_when_nothing_delivered) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(3);
  d.launch(t[1], 0);
  d.launch(t[0], 1 * kMs);
  d.launch(t[2], 2 * kMs);
  std::vector<unsigned> re;
  d.scan(t.data(), t.size(), 10 * kMs, &re);
  // Only the oldest transmission goes out; the others back off without sending.
  CHECK(re.size() == 1 && re[0] == 1);
  CHECK_EQ(t[1].tries, 1u);
  CHECK_EQ(t[1].last_tx_ns, 10 * kMs);
  CHECK_EQ(t[0].tries, 0u);
  CHECK_EQ(t[0].deadline_ns, 18 * kMs);  // 10 + 2 * 4
  CHECK_EQ(t[1].deadline_ns, 18 * kMs);
}

TEST(loss_rack_resends_overtaken_rounds) {
  LossDetector d(100 * kMs, 1000 * kMs);  // timers far away: only RACK can act
  std::vector<RoundTimer> t(3);
  d.launch(t[0], 0);
  d.launch(t[1], 2 * kMs);
  d.launch(t[2], 4 * kMs);
  d.delivered(t[2], 5 * kMs);  // srtt = 1 ms; reorder window max(srtt/4, 0.5 ms) = 0.5 ms
  CHECK(!t[2].busy);
  std::vector<unsigned> re;
  d.scan(t.data(), t.size(), 5 * kMs, &re);
  // Both earlier rounds were overtaken by a later one and srtt + reorder (1.5 ms) has passed.
  CHECK(re.size() == 2 && re[0] == 0 && re[1] == 1);
  // Their retransmissions are now the newest sends: not resent again at once.
  re.clear();
  d.scan(t.data(), t.size(), 6 * kMs, &re);
  CHECK(re.empty());
}

// A window sent at one instant (an allreduce's start): answers to rounds later in the batch overtake
// the rounds before them, as RFC 8985 orders segments sent together by sequence.
TEST(loss_rack_orders_a_batch_by_its_send_order) {
  LossDetector d(100 * kMs, 1000 * kMs);  // timers far away: only RACK can act
  std::vector<RoundTimer> t(3);
  for (auto& x : t) d.launch(x, 0);
  d.delivered(t[1], 1 * kMs);  // srtt 1 ms, reorder window 0.5 ms
  std::vector<unsigned> re;
  d.scan(t.data(), t.size(), 1 * kMs, &re);
  CHECK(re.empty());  // not before srtt + the reordering window after its send
  d.scan(t.data(), t.size(), 2 * kMs, &re);
  CHECK(re.size() == 1 && re[0] == 0);  // round 0 went before round 1; round 2 after it
  CHECK(t[0].cause == RetxCause::kRack && t[2].tries == 0);
}

// Probes with nothing answered go in send order: the batch's first round is the oldest.
TEST(loss_probes_a_batch_in_its_send_order) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(3);
  d.launch(t[2], 0);
  d.launch(t[0], 0);
  d.launch(t[1], 0);
  std::vector<unsigned> re;
  d.scan(t.data(), t.size(), 10 * kMs, &re);
  CHECK(re.size() == 1 && re[0] == 2);
}

// The switch says a round lacks this sender's data: resent unless it just went (the request may
// have crossed that transmission).
TEST(loss_asked_resends_unless_just_sent) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(1);
  d.launch(t[0], 0);
  CHECK(!d.asked(t[0], 50'000));  // 50 us after the send: RACK would still wait (0.5 ms)
  CHECK(d.asked(t[0], 1 * kMs));
  CHECK(t[0].tries == 1 && t[0].cause == RetxCause::kAsked && t[0].last_tx_ns == 1 * kMs);
  CHECK(!d.asked(t[0], 1 * kMs + 50'000));
  d.delivered(t[0], 2 * kMs);
  CHECK(!d.asked(t[0], 3 * kMs));  // delivered: nothing to resend
}

// Results to this rank come 30 ms late (a stalled path): the switch's request for a round, sent
// before this rank's DATA reached it, comes 20 ms after that DATA went. Resent, and the resend proven
// spurious (DSACK, its round trip 30 ms): the timer's floor learns the stall, and requests for rounds
// sent within it are taken as crossing them from then on, until the floor decays.
TEST(loss_a_stale_request_teaches_the_floor_and_the_request_gap) {
  LossDetector d(4 * kMs, 200 * kMs);
  RoundTimer t;
  d.launch(t, 0);
  CHECK(d.ask_gap_ns() == 500'000);  // RACK's wait: the reordering window's base
  CHECK(d.asked(t, 20 * kMs));
  d.delivered(t, 30 * kMs);
  d.spurious(RetxCause::kAsked, 0, 30 * kMs, 50 * kMs);
  CHECK_EQ(d.rto_floor_ns(), 8 * kMs);  // at most a doubling per lesson, as for a timeout
  CHECK_EQ(d.ask_gap_ns(), 8 * kMs);
  for (int i = 0; i < 3; ++i) d.spurious(RetxCause::kAsked, 0, 30 * kMs, 50 * kMs);
  CHECK_EQ(d.ask_gap_ns(), 30 * kMs + 30 * kMs / 4);
  d.launch(t, 100 * kMs);
  CHECK(!d.asked(t, 120 * kMs));  // the same stall again: the request crossed the DATA
  CHECK(d.asked(t, 140 * kMs));   // older than the stall: the round needs the resend
  // The floor halves after 2 s without a lesson, and the gap with it.
  d.launch(t, 2'100 * kMs);
  CHECK_EQ(d.ask_gap_ns(), (30 * kMs + 30 * kMs / 4) / 2);
}

TEST(loss_rack_waits_for_reorder_window) {
  LossDetector d(100 * kMs, 1000 * kMs);
  std::vector<RoundTimer> t(2);
  d.launch(t[0], 0);
  d.launch(t[1], 400'000);  // 0.4 ms later: within the reordering window (srtt / 4 = 2.4 ms)
  d.delivered(t[1], 10 * kMs);
  std::vector<unsigned> re;
  d.scan(t.data(), t.size(), 11 * kMs, &re);
  CHECK(re.empty());
}

TEST(loss_karn_and_backoff_cap) {
  LossDetector d(4 * kMs, 10 * kMs);
  std::vector<RoundTimer> t(1);
  d.launch(t[0], 0);
  std::vector<unsigned> re;
  int64_t now = 0;
  for (int i = 0; i < 5; ++i) {
    now = t[0].deadline_ns;
    re.clear();
    d.scan(t.data(), 1, now, &re);
    CHECK(re.size() == 1);
  }
  CHECK_EQ(t[0].rto_ns, 10 * kMs);  // 4, 8, then capped at 10
  CHECK_EQ(t[0].tries, 5u);
  d.delivered(t[0], now + 1 * kMs);
  CHECK(!d.rtt().has_sample());  // a resent round gives no RTT sample
}

// Issue #17: a round sent once whose RESULT says a resend completed it (RETX) waited for another
// rank's loss recovery. Sampled, those waits (several ms each at 10% loss, most rounds having a lost
// contribution somewhere) made srtt and rttvar, so every timer, the others' recovery times.
TEST(loss_a_round_completed_by_a_resend_gives_no_rtt_sample) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(2);
  d.launch(t[0], 0);
  d.launch(t[1], 0);
  d.delivered(t[0], 12 * kMs, /*after_recovery=*/true);
  CHECK(!d.rtt().has_sample());
  CHECK(!t[0].busy);
  d.delivered(t[1], 300'000);  // completed by the originals: this path's round trip
  CHECK(d.rtt().srtt_ns() == 300'000.0);
}

// Issue #17: at 10% loss a round that needs five tries is common in an allreduce of 10,000 rounds;
// doubling its timer each time (4, 8, 16, 32, 64 ms) made it the allreduce's tail while every other
// round was answered. While answers flow it waits at most 2 base timers; once nothing was answered
// for rto_max (a dead path) it backs off exponentially again.
TEST(loss_backoff_stays_short_while_answers_flow) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(2);
  d.launch(t[0], 0);
  d.launch(t[1], 0);
  d.delivered(t[1], 1 * kMs);  // srtt 1 ms: the base timer is rto_min, 4 ms
  std::vector<unsigned> re;
  int64_t now = 0;
  for (int i = 0; i < 6; ++i) {
    now = t[0].deadline_ns;
    re.clear();
    d.scan(t.data(), 1, now, &re);
    CHECK(re.size() == 1);
    CHECK_EQ(t[0].rto_ns, 8 * kMs);  // 4, then 8 and no more
    d.launch(t[1], now);             // the other rounds go on being answered
    d.delivered(t[1], now + 1 * kMs);
  }
  // Nothing answered for rto_max: the path may be dead, back off.
  const int64_t last_answer = now + 1 * kMs;
  while (t[0].deadline_ns - last_answer < 200 * kMs) {
    now = t[0].deadline_ns;
    re.clear();
    d.scan(t.data(), 1, now, &re);
    CHECK_EQ(t[0].rto_ns, 8 * kMs);
  }
  now = t[0].deadline_ns;
  d.scan(t.data(), 1, now, &re);
  CHECK_EQ(t[0].rto_ns, 16 * kMs);
  now = t[0].deadline_ns;
  d.scan(t.data(), 1, now, &re);
  CHECK_EQ(t[0].rto_ns, 32 * kMs);
}

// A held round waits for its result; when that is lost (the round completed) only its timer finds
// out, so its timer too stays short while the peer answers. (While a rank recovers, nothing newer
// is delivered either: the scan sends one probe per expiry, not one per held round.)
TEST(loss_held_rounds_probe_at_two_base_timers_while_answers_flow) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(1);
  d.launch(t[0], 0);
  std::vector<unsigned> re;
  d.scan(t.data(), 1, 4 * kMs, &re);  // probe: 8 ms
  CHECK(d.held(t[0], 5 * kMs));       // the answer says the switch holds it
  for (int i = 0; i < 3; ++i) {
    re.clear();
    d.scan(t.data(), 1, t[0].deadline_ns, &re);
    CHECK(re.size() == 1);
    CHECK_EQ(t[0].rto_ns, 8 * kMs);
  }
  while (t[0].deadline_ns - 5 * kMs < 200 * kMs) d.scan(t.data(), 1, t[0].deadline_ns, &re);
  d.scan(t.data(), 1, t[0].deadline_ns, &re);
  CHECK_EQ(t[0].rto_ns, 16 * kMs);  // nothing answered for rto_max: backing off
}

// Issue #9: a switch stalled past the timer; the oldest round was probed at 4 ms; at 10 ms the
// stall ends and the original result of that round arrives first, the others' still queued. The
// answer may be the original's, so the round counts at its first send: the rounds sent with it
// were not overtaken. (Counting it at the probe's time made every round of the window look
// overtaken and resent the whole window.)
TEST(loss_a_resent_round_counts_at_its_first_send) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(8);
  for (auto& x : t) d.launch(x, 0);
  std::vector<unsigned> re;
  d.scan(t.data(), t.size(), 4 * kMs, &re);
  CHECK(re.size() == 1 && re[0] == 0);
  CHECK(t[0].cause == RetxCause::kProbe);
  d.delivered(t[0], 10 * kMs);
  re.clear();
  d.scan(t.data(), t.size(), 10 * kMs, &re);
  CHECK(re.empty());
  CHECK(!d.rtt().has_sample());  // Karn: the answer may be the probe's
  // Answered 6 ms after the probe, far past a round trip: the stalled switch's answer to the
  // original, so it is no evidence that the rounds sent before the probe were lost.
  re.clear();
  d.scan(t.data(), t.size(), 11 * kMs, &re);  // (their backed-off timers are due at 12 ms)
  CHECK(re.empty());
}

// A lost tail: the last rounds of a stream are lost, nothing later comes back, the timer probes
// the oldest. Its answer comes within a round trip of the probe: the path works, so the rounds
// sent before the probe are lost too and go out a round trip and a reordering window later, not
// one probe per doubled timeout.
TEST(loss_an_answered_probe_resends_the_rest_of_a_lost_tail) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(5);
  d.launch(t[4], 0);
  d.delivered(t[4], 200'000);  // srtt = min_rtt = 0.2 ms; reordering window 0.5 ms
  for (int i = 0; i < 4; ++i) d.launch(t[i], 1 * kMs);
  std::vector<unsigned> re;
  d.scan(t.data(), 4, 5 * kMs, &re);  // rto floor 4 ms: round 0 probed, the others back off to 13 ms
  CHECK(re.size() == 1 && re[0] == 0);
  d.delivered(t[0], 5 * kMs + 300'000);
  re.clear();
  int64_t next = d.scan(t.data(), 4, 5 * kMs + 300'000, &re);
  CHECK(re.empty());
  CHECK_EQ(next, 6 * kMs);  // the caller wakes when RACK's wait ends, before any timer
  d.scan(t.data(), 4, 6 * kMs, &re);
  CHECK(re.size() == 3 && re[0] == 1 && re[2] == 3);
  CHECK(t[1].cause == RetxCause::kRack);
  // The three went out together; one is answered, so the other two, lost again, go once more a
  // round trip and a reordering window later (no timer: theirs is due at 13 + 16 ms).
  d.delivered(t[1], 6 * kMs + 300'000);
  re.clear();
  CHECK_EQ(d.scan(t.data(), 4, 6 * kMs + 300'000, &re), 7 * kMs);
  CHECK(re.empty());
  d.scan(t.data(), 4, 7 * kMs, &re);
  CHECK(re.size() == 2 && re[0] == 2 && re[1] == 3);
}

TEST(loss_held_round_leaves_rack_and_teaches_the_timer) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(3);
  d.launch(t[0], 0);
  d.launch(t[1], 0);
  std::vector<unsigned> re;
  d.scan(t.data(), 2, 4 * kMs, &re);  // round 0 probed
  CHECK(re.size() == 1 && re[0] == 0);
  CHECK(d.held(t[0], 5 * kMs));   // the switch holds it: the probe was spurious
  CHECK(!d.held(t[0], 5 * kMs));  // counted once
  CHECK(t[0].held && t[0].busy);
  d.launch(t[2], 5 * kMs);
  d.delivered(t[2], 6 * kMs);  // sent after round 0's probe, answered first
  d.delivered(t[1], 6 * kMs);
  re.clear();
  d.scan(t.data(), 3, 8 * kMs, &re);
  CHECK(re.empty());  // overtaken, but held: it waits for other ranks, it is not lost
  d.delivered(t[0], 30 * kMs);
  // It waited for another rank: neither an RTT sample nor a lesson for the timer's floor.
  CHECK_EQ(d.rto_floor_ns(), 4 * kMs);
  CHECK_EQ(d.rtt().min_ns(), 1 * kMs);
}

// Ranks send their rounds in different orders, so the round whose data is missing at the switch
// is not always this rank's oldest: probes must move on from a round the switch holds.
TEST(loss_probes_rotate_past_held_rounds) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(2);
  d.launch(t[0], 0);
  d.launch(t[1], 1 * kMs);
  std::vector<unsigned> re;
  d.scan(t.data(), 2, 6 * kMs, &re);
  CHECK(re.size() == 1 && re[0] == 0);
  d.held(t[0], 7 * kMs);  // HELD: re-armed at 7 + 8 ms
  re.clear();
  d.scan(t.data(), 2, 14 * kMs, &re);  // round 1 (backed off to 6 + 8 ms) is due
  CHECK(re.size() == 1 && re[0] == 1);
  // Both due: the one not held goes first, even though the held one was sent earlier.
  re.clear();
  d.scan(t.data(), 2, 40 * kMs, &re);
  CHECK(re.size() == 1 && re[0] == 1);
}

TEST(loss_a_late_original_answer_teaches_the_timer) {
  LossDetector d(4 * kMs, 200 * kMs);
  RoundTimer t;
  d.launch(t, 0);
  std::vector<unsigned> re;
  d.scan(&t, 1, 4 * kMs, &re);  // probed; the switch was stalled, not lossy
  d.delivered(t, 30 * kMs);     // by the answer to the probe, or the late original: unknown yet
  CHECK(!d.rtt().has_sample());
  // Then the other answer arrives: the probe was spurious. The caller passes the probe's own round
  // trip (here 27 ms: the stalled switch answered it that late): the floor learns 1.25x it.
  d.spurious(RetxCause::kProbe, 30 * kMs, 27 * kMs, 31 * kMs);
  CHECK(d.rtt().srtt_ns() == 30.0 * kMs);
  // At most a doubling per lesson (one outlier does not put the floor at rto_max): 4 -> 8 ms; the
  // same stall again -> 16, 32, then 1.25 x 27 ms.
  CHECK_EQ(d.rto_floor_ns(), 8 * kMs);
  d.spurious(RetxCause::kProbe, 0, 27 * kMs, 31 * kMs);
  CHECK_EQ(d.rto_floor_ns(), 16 * kMs);
  d.spurious(RetxCause::kProbe, 0, 27 * kMs, 31 * kMs);
  d.spurious(RetxCause::kProbe, 0, 27 * kMs, 31 * kMs);
  CHECK_EQ(d.rto_floor_ns(), 27 * kMs + 27 * kMs / 4);
  // A shorter wait lowers nothing; a RACK resend teaches the timer nothing.
  d.spurious(RetxCause::kProbe, 0, 1 * kMs, 31 * kMs);
  d.spurious(RetxCause::kRack, 0, 60 * kMs, 31 * kMs);
  CHECK_EQ(d.rto_floor_ns(), 27 * kMs + 27 * kMs / 4);
  d.launch(t, 32 * kMs);
  CHECK(t.rto_ns >= 27 * kMs + 27 * kMs / 4);
  // Two seconds without another spurious probe halve it.
  d.launch(t, 31 * kMs + 2'000 * kMs);
  CHECK_EQ(d.rto_floor_ns(), (27 * kMs + 27 * kMs / 4) / 2);
}

// The switch path keeps a detector per switch thread; a stall of this host (or of the switch's)
// delays every thread's answers. Seen under CPU load: one thread's detector learned the 30 ms stall,
// the other's first lessons came late in the stall (17 ms) and its next stall cost resends again.
// Detectors of one path share the floor; a detector of its own keeps its own.
TEST(loss_detectors_sharing_a_floor_learn_a_stall_together) {
  auto floor = std::make_shared<TimerFloor>(4 * kMs, 200 * kMs);
  LossDetector a(4 * kMs, 200 * kMs, floor), b(4 * kMs, 200 * kMs, floor), alone(4 * kMs, 200 * kMs);
  a.spurious(RetxCause::kProbe, 0, 27 * kMs, 31 * kMs);
  alone.spurious(RetxCause::kProbe, 0, 27 * kMs, 31 * kMs);
  b.spurious(RetxCause::kTimeout, 0, 27 * kMs, 32 * kMs);  // each lesson at most doubles the shared floor
  CHECK_EQ(a.rto_floor_ns(), 16 * kMs);
  CHECK_EQ(b.rto_floor_ns(), 16 * kMs);
  CHECK_EQ(alone.rto_floor_ns(), 8 * kMs);
  RoundTimer t;
  b.launch(t, 33 * kMs);
  CHECK_EQ(t.rto_ns, 16 * kMs);  // no RTT sample yet: the timer starts at the floor
  CHECK(b.ask_gap_ns() >= 16 * kMs);
  // Two seconds without a lesson halve it for both.
  a.launch(t, 32 * kMs + 2'000 * kMs);
  CHECK_EQ(b.rto_floor_ns(), 8 * kMs);
}

TEST(loss_spurious_rack_widens_the_reordering_window) {
  LossDetector d(4 * kMs, 200 * kMs);
  RoundTimer x;
  d.launch(x, 0);
  d.delivered(x, 10 * kMs);  // srtt 10 ms, min 10 ms: base max(2.5 ms, 0.5 ms)
  CHECK_EQ(d.reorder_window_ns(), 2500 * 1000LL);
  d.spurious(RetxCause::kRack, 0, 0, 20 * kMs);
  CHECK_EQ(d.reorder_mult(), 2u);
  CHECK_EQ(d.reorder_window_ns(), 5 * kMs);
  d.spurious(RetxCause::kRack, 0, 0, 21 * kMs);  // same round trip: once
  CHECK_EQ(d.reorder_mult(), 2u);
  d.spurious(RetxCause::kRack, 0, 0, 40 * kMs);
  d.spurious(RetxCause::kRack, 0, 0, 60 * kMs);
  d.spurious(RetxCause::kRack, 0, 0, 80 * kMs);
  CHECK_EQ(d.reorder_window_ns(), 10 * kMs);  // at most srtt
  // 16 RACK losses without a spurious one: back to one step.
  std::vector<RoundTimer> t(17);
  for (auto& r : t) d.launch(r, 100 * kMs);
  d.launch(t[16], 130 * kMs);
  d.delivered(t[16], 131 * kMs);
  std::vector<unsigned> re;
  d.scan(t.data(), 16, 150 * kMs, &re);
  CHECK_EQ(re.size(), size_t{16});
  CHECK(t[0].cause == RetxCause::kRack);
  CHECK_EQ(d.reorder_mult(), 1u);
}

// A HELD answer to a RACK resend does not widen the reordering window (the round may wait for
// another rank's loss); `reordered` (a late rank's original completed it) does, up to srtt.
TEST(loss_held_does_not_widen_reordered_does) {
  LossDetector d(4 * kMs, 200 * kMs);
  RoundTimer x, y;
  d.launch(x, 0);
  d.delivered(x, 400'000);  // 0.4 ms
  d.launch(y, 1 * kMs);
  d.delivered(y, 11 * kMs);  // waited 10 ms for another rank
  std::vector<RoundTimer> t(2);
  d.launch(t[0], 20 * kMs);
  d.launch(t[1], 21 * kMs);
  d.delivered(t[1], 21 * kMs + 500'000);
  std::vector<unsigned> re;
  d.scan(t.data(), 1, 22 * kMs, &re);  // overtaken: resent by RACK
  CHECK(re.size() == 1 && t[0].cause == RetxCause::kRack);
  CHECK(d.held(t[0], 22 * kMs + 300'000));
  CHECK_EQ(d.reorder_mult(), 1u);
  for (int i = 0; i < 4; ++i) d.reordered(30 * kMs + i * 2 * kMs);  // at most once per srtt
  CHECK_EQ(d.reorder_mult(), 5u);
  // 5 x 0.5 ms, capped at srtt: 0.4, 10 and 0.5 ms smoothed = 1.4625 ms.
  CHECK_EQ(d.reorder_window_ns(), 1'462'500);
}

GS_TEST_MAIN()
