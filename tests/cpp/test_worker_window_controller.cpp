// The worker's window controller alone (worker/switch/window_controller.h, docs/protocol.md section 4.2)
// on a hand-made clock: growth while the window is used, the cut on queueing delay, the tolerance
// that falls as the window grows (and shares a queue evenly between ranks whose bases disagree),
// which round trips count as delay (and a window that grows while none does), loss with and without
// a queue beyond the one the delay rule holds, the DSACK undo, the pool as a cap, the job's window (the
// smallest declared), the grid of what is allowed in flight, and the drains on the wall clock that give a
// rank that started behind a standing queue the path's base.
#include <algorithm>
#include <cstdint>

#include "harness.h"
#include "worker/switch/window_controller.h"

using namespace gradswitch::worker;

namespace {

constexpr int64_t kUs = 1'000;
constexpr int64_t kMs = 1'000'000;

// One round-trip period (srtt 1 ms) of results, each measuring `own_rtt` (-1: not this rank's
// own), starting at `*now`; the last result ends the period.
void period(WindowController& c, int64_t* now, int64_t own_rtt, bool limited = true) {
  constexpr int64_t rtt = kMs;
  for (int i = 0; i < 4; ++i) {
    c.on_result(*now, own_rtt, limited, rtt);
    *now += rtt / 4;
  }
  c.on_result(*now, own_rtt, limited, rtt);
}

// One period of slow start from 16 (base 1 ms): a window of 32 rounds. Returns the time.
int64_t at_32_rounds(WindowController& c) {
  int64_t now = kMs;
  period(c, &now, kMs);
  CHECK_EQ(c.window(), 32u);
  return now;
}

// A window of 64 rounds (two periods of slow start from 16, base 1 ms, target 0.5 ms: it tolerates
// 0.57 ms of queue), then a result of this period that met `queue` of it. Returns the time.
int64_t at_64_rounds_with_queue(WindowController& c, int64_t queue) {
  int64_t now = at_32_rounds(c);
  period(c, &now, kMs);
  CHECK_EQ(c.window(), 64u);
  c.on_result(now, kMs + queue, true, kMs);
  return now;
}

}  // namespace

TEST(window_starts_at_initial_and_is_capped_by_the_pool) {
  WindowController a(256, 500 * kUs);
  CHECK_EQ(a.window(), 16u);
  WindowController b(8, 500 * kUs);  // a pool smaller than the initial window
  CHECK_EQ(b.window(), 8u);
  WindowController c(0, 500 * kUs);  // never zero rounds in flight
  CHECK_EQ(c.window(), 1u);
}

TEST(window_doubles_per_round_trip_while_used_and_stops_at_the_cap) {
  WindowController c(100, 500 * kUs);
  int64_t now = at_32_rounds(c);
  CHECK(c.slow_start());
  period(c, &now, kMs);
  CHECK_EQ(c.window(), 64u);
  period(c, &now, kMs);
  CHECK_EQ(c.window(), 100u);  // capped: the pool
  period(c, &now, kMs);
  CHECK_EQ(c.window(), 100u);
  CHECK_EQ(c.base_rtt_ns(), kMs);
}

TEST(window_does_not_grow_when_the_data_limited_it) {
  WindowController c(256, 500 * kUs);
  int64_t now = kMs;
  for (int i = 0; i < 5; ++i) period(c, &now, kMs, /*limited=*/false);
  CHECK_EQ(c.window(), 16u);
}

TEST(window_cuts_in_proportion_to_queueing_delay_then_grows_by_one) {
  WindowController c(256, 500 * kUs);
  int64_t now = at_32_rounds(c);
  // At 32 rounds the tolerated queue is the target (0.5 ms) and 2 x 0.5 ms x (1/sqrt(32) - 1/16) /
  // (1 - 1/16) more: 621.9 us.
  CHECK_EQ(c.tolerated_queue_ns(), 621'895);
  // 1 ms of queue in a 2 ms round trip: excess 0.378 ms / 2 ms, cut by 0.8 of it.
  period(c, &now, 2 * kMs);
  CHECK_EQ(c.window(), 27u);  // 32 * (1 - 0.8 * 0.189)
  CHECK(!c.slow_start());
  // A queue far above the target: at most halved per period.
  period(c, &now, 20 * kMs);
  CHECK_EQ(c.window(), 13u);  // 27.2 * 0.5
  // Back at the base: one round more per period, no more doubling.
  period(c, &now, kMs);
  CHECK_EQ(c.window(), 14u);
  period(c, &now, kMs);
  CHECK_EQ(c.window(), 15u);
  // A queue below the target is no reason to cut.
  period(c, &now, kMs + 400 * kUs);
  CHECK_EQ(c.window(), 16u);
}

TEST(window_tolerates_more_queue_the_smaller_it_is) {
  // Swift's flow scaling: the target at 256 rounds and above, 3 x the target at one round.
  WindowController big(1024, 500 * kUs, 512), pool(256, 500 * kUs, 256), small(256, 500 * kUs, 4);
  WindowController one(256, 500 * kUs, 1);
  CHECK_EQ(big.tolerated_queue_ns(), 500 * kUs);
  CHECK_EQ(pool.tolerated_queue_ns(), 500 * kUs);
  CHECK_EQ(small.tolerated_queue_ns(), 500 * kUs + 466'666);  // + 2 x 0.5 ms x (1/2 - 1/16) / (15/16)
  CHECK_EQ(one.tolerated_queue_ns(), 1'500 * kUs);
  // 0.8 ms of queue above a base of 1 ms: the window of 256 is cut, the window of 4 grows.
  int64_t now = kMs, t = kMs;
  period(pool, &now, kMs);
  period(small, &t, kMs);
  CHECK_EQ(small.window(), 8u);
  period(pool, &now, 1'800 * kUs);
  period(small, &t, 1'800 * kUs);
  CHECK(pool.window() < 256u);
  CHECK_EQ(small.window(), 16u);
}

TEST(window_ranks_whose_bases_disagree_still_share_a_queue_evenly) {
  // Two ranks of two jobs at one bottleneck (a fluid model: 40 rounds per ms, a path of 200 us,
  // so the round trip is the larger of 200 us and the rounds in flight / 40 per ms). Rank b took a
  // round trip 50 us below the path's for its base (a lucky sample), so it sees 50 us more queue
  // than there is (5% of the target). With one tolerance for every window b is cut whenever a is
  // not, and a takes the link (47 rounds against 1 in this model); with the tolerance that grows as
  // a window shrinks they end 32 and 25, within 1.6x (Jain's index of two rates 1.6x apart: 0.95).
  WindowController a(256, kMs), b(256, kMs);
  int64_t now = 2'100 * kMs;  // clear of the drains (the first 2 ms of every second)
  constexpr int64_t kPath = 200 * kUs;
  // Both measured the path empty at the start, b 50 us too low.
  a.on_result(now, kPath, true, kMs);
  b.on_result(now, kPath - 50 * kUs, true, kMs);
  for (int i = 0; i < 850; ++i) {  // 850 periods of 1 ms, ending before the next drain
    const double in_flight = a.window() + b.window();
    const int64_t rtt = std::max<int64_t>(kPath, static_cast<int64_t>(in_flight / 40.0 * kMs));
    int64_t t = now;
    period(a, &t, rtt);
    period(b, &now, rtt);
  }
  const double lo = std::min(a.window(), b.window()), hi = std::max(a.window(), b.window());
  CHECK(hi / lo < 1.6);
  CHECK(a.window() + b.window() > 40u);  // together far more than the 8 rounds that fill the path
}

TEST(window_uses_the_smallest_own_round_trip_of_a_period) {
  WindowController c(256, 500 * kUs);
  int64_t now = at_32_rounds(c);
  // Most samples of this period were inflated (a descheduled thread), one was not: no queue.
  for (int i = 0; i < 4; ++i) {
    c.on_result(now, i == 2 ? kMs : 9 * kMs, true, kMs);
    now += kMs / 4;
  }
  c.on_result(now, 9 * kMs, true, kMs);
  CHECK_EQ(c.window(), 64u);
}

TEST(window_grows_while_used_even_when_every_round_waits_for_other_ranks) {
  WindowController c(256, 500 * kUs);
  int64_t now = at_32_rounds(c);
  // Results completed by another rank (own_rtt -1), however long they took: no delay sample, so no
  // cut; the window still grows: the job runs the smallest of its ranks' windows (run_at()), which
  // the rank that completes the rounds, measuring the queue, keeps down.
  period(c, &now, -1);
  CHECK_EQ(c.window(), 64u);
  CHECK(c.slow_start());
  // Nor does a round trip that waited for another rank count as delay: no cut.
  period(c, &now, -1);
  CHECK_EQ(c.window(), 128u);
}

TEST(window_loss_without_a_queue_is_not_congestion) {
  WindowController c(256, 500 * kUs);
  int64_t now = at_32_rounds(c);
  c.on_result(now, kMs, true, kMs);  // this period: no queue
  c.on_loss(now);
  CHECK_EQ(c.window(), 32u);
  CHECK(c.slow_start());
}

TEST(window_loss_at_the_queue_the_delay_rule_holds_is_not_congestion) {
  WindowController c(256, 500 * kUs);
  const int64_t now = at_64_rounds_with_queue(c, 600 * kUs);  // above the tolerance, by less than the target
  c.on_loss(now);
  CHECK_EQ(c.window(), 64u);  // random loss: resent, not a halving
  c.on_result(now + kMs, 1600 * kUs, true, kMs);
  CHECK_EQ(c.window(), 62u);  // the period ends: the delay rule's cut, 0.8 x 0.03 ms / 1.6 ms
  CHECK(!c.slow_start());
}

TEST(window_loss_with_a_queue_halves_once_and_dsack_undoes_it) {
  WindowController c(256, 500 * kUs);
  const int64_t now = at_64_rounds_with_queue(c, 1200 * kUs);  // more than a target above the tolerance
  c.on_loss(now);
  CHECK_EQ(c.window(), 32u);
  c.on_loss(now + 100 * kUs);  // the same period: one cut
  CHECK_EQ(c.window(), 32u);
  CHECK(!c.slow_start());
  CHECK(!c.on_spurious(now + 150 * kUs, now - 50 * kUs));  // a resend from before the cut: nothing
  CHECK(!c.on_spurious(now + 200 * kUs, now));  // the cutting resend was not needed, the other may be
  CHECK_EQ(c.window(), 32u);
  CHECK(c.on_spurious(now + 250 * kUs, now + 100 * kUs));  // neither was: the cut is undone
  CHECK_EQ(c.window(), 64u);
  CHECK(!c.on_spurious(now + 300 * kUs, now + 100 * kUs));  // nothing more to undo
  CHECK_EQ(c.window(), 64u);
}

TEST(window_a_cut_that_a_real_loss_also_made_stays) {
  WindowController c(256, 500 * kUs);
  const int64_t now = at_64_rounds_with_queue(c, 1200 * kUs);
  CHECK(c.on_loss(now));
  c.on_loss(now + 100 * kUs);  // another rank's round, say, which the switch holds
  c.on_loss(now + 200 * kUs);  // a round this rank lost: never proven spurious
  CHECK(!c.on_spurious(now + 300 * kUs, now));
  CHECK(!c.on_spurious(now + 400 * kUs, now + 100 * kUs));
  CHECK_EQ(c.window(), 32u);
}

TEST(window_dsack_long_after_the_cut_undoes_nothing) {
  WindowController c(256, 500 * kUs);
  int64_t now = at_32_rounds(c);
  c.on_result(now, 2200 * kUs, true, kMs);  // 1.2 ms of queue: 0.62 ms tolerated at 32 rounds, + 0.5
  c.on_loss(now);
  CHECK_EQ(c.window(), 16u);
  c.on_spurious(now + 10 * kMs, now);  // more than 4 round trips later: the cut had another reason too
  CHECK_EQ(c.window(), 16u);
}

TEST(window_never_below_one_round) {
  WindowController c(256, 100 * kUs, 1);
  int64_t now = kMs;
  period(c, &now, kMs);
  for (int i = 0; i < 10; ++i) period(c, &now, 50 * kMs);
  CHECK_EQ(c.window(), 1u);
}

TEST(window_the_job_runs_the_smallest_window_its_ranks_declared) {
  WindowController c(256, 500 * kUs);
  int64_t now = at_32_rounds(c);
  c.run_at(0);  // no window declared: nothing changes
  CHECK_EQ(c.job_window(), 32u);
  c.run_at(40);  // the others' windows are larger: the job runs this rank's
  CHECK_EQ(c.window(), 32u);
  CHECK_EQ(c.job_window(), 32u);
  c.run_at(16);  // declared a doubling ago: the job's window lags this rank's, which is no cut
  CHECK_EQ(c.window(), 32u);
  CHECK_EQ(c.job_window(), 16u);  // but the job runs it until every rank's DATA declare more
  CHECK_EQ(c.allowed(500 * kMs), 16u);
  CHECK(c.slow_start());
  period(c, &now, kMs);  // slow start doubles only once the job's window has caught up
  CHECK_EQ(c.window(), 32u);
  c.run_at(32);
  period(c, &now, kMs);
  CHECK_EQ(c.window(), 64u);
  c.run_at(20);  // lower by more than a doubling: another rank was cut, and the job left slow start
  CHECK_EQ(c.window(), 40u);
  CHECK(!c.slow_start());
  c.run_at(39);  // out of slow start this rank stays within two rounds of the job's window
  CHECK_EQ(c.window(), 40u);
  c.run_at(30);
  CHECK_EQ(c.window(), 32u);
  CHECK_EQ(c.job_window(), 30u);
  period(c, &now, kMs);  // its own growth is kept, whatever the others declared before they saw it
  CHECK_EQ(c.window(), 33u);
  c.run_at(1000);  // never past the pool
  CHECK_EQ(c.job_window(), 33u);
}

TEST(window_allowed_in_flight_is_on_a_grid_of_four_steps_per_power_of_two) {
  CHECK_EQ(WindowController::on_grid(1), 1u);
  CHECK_EQ(WindowController::on_grid(7), 7u);
  CHECK_EQ(WindowController::on_grid(9), 8u);
  CHECK_EQ(WindowController::on_grid(15), 14u);
  CHECK_EQ(WindowController::on_grid(70), 64u);
  CHECK_EQ(WindowController::on_grid(75), 64u);
  CHECK_EQ(WindowController::on_grid(80), 80u);
  CHECK_EQ(WindowController::on_grid(255), 224u);
  CHECK_EQ(WindowController::on_grid(65535), 57344u);
  for (unsigned w = 1; w < 70000; ++w) {  // never above it, and less than a step (1/4 to 1/8) below
    const unsigned g = WindowController::on_grid(w);
    CHECK(g <= w && 5 * g + 5 > 4 * w);
  }
  WindowController c(256, 500 * kUs, 80);
  c.run_at(75);
  CHECK_EQ(c.window(), 80u);            // declared as it is
  CHECK_EQ(c.job_window(), 75u);        // run as the job's
  CHECK_EQ(c.allowed(500 * kMs), 64u);  // on the grid (not in a drain)
}

TEST(window_drains_at_every_whole_second_of_the_wall_clock) {
  const int64_t wall_minus_steady = 5'300 * kMs;  // steady 700 ms is wall 6 s
  WindowController c(256, 500 * kUs, 16, wall_minus_steady);
  CHECK_EQ(c.drain_ns(), kMs);  // twice the target, at least 1 ms
  CHECK(!c.draining(699 * kMs));
  CHECK(c.draining(700 * kMs));
  CHECK_EQ(c.allowed(700 * kMs), WindowController::kDrainRounds);
  CHECK(c.draining(700 * kMs + 999 * kUs));
  CHECK(!c.draining(701 * kMs));
  CHECK_EQ(c.allowed(701 * kMs), 16u);
  CHECK(c.draining(1'700 * kMs + 10 * kUs));  // every second
  WindowController wide(256, 2 * kMs);
  CHECK_EQ(wide.drain_ns(), 4 * kMs);
  CHECK(wide.draining(3'003 * kMs) && !wide.draining(3'004 * kMs));
  WindowController small(256, 500 * kUs, 1);
  CHECK_EQ(small.allowed(0), 1u);  // a drain never raises the window
}

TEST(window_a_rank_that_started_behind_a_standing_queue_learns_the_base_in_a_drain) {
  // Path round trip 1 ms; another job's queue of 2 ms stands when this rank starts: its first
  // round trips are 3 ms, which it takes for its base, so the queue does not slow it.
  WindowController late(256, kMs);
  WindowController early(256, kMs, 64);
  int64_t now = 100 * kMs;
  period(early, &now, kMs);  // the early rank measured the path empty: base 1 ms
  for (int i = 0; i < 3; ++i) {
    int64_t t = now;
    period(late, &t, 3 * kMs);
    period(early, &now, 3 * kMs);
  }
  CHECK_EQ(late.base_rtt_ns(), 3 * kMs);
  CHECK_EQ(late.window(), 128u);  // doubling: no queue above its base
  CHECK(early.window() < 64u);    // 2 ms of queue above its target: cut
  const unsigned early_before = early.window();
  // The drain at the next second: every rank keeps 2 rounds out, the queue empties, the round
  // trips are the path's. Neither window moves for the periods in the drain.
  now = 1'000 * kMs;
  CHECK(late.draining(now));
  for (int i = 0; i < 2; ++i) {
    int64_t t = now;
    period(late, &t, kMs);
    period(early, &now, kMs);
  }
  CHECK(!late.draining(now));
  CHECK_EQ(late.base_rtt_ns(), kMs);
  CHECK_EQ(late.window(), 128u);
  CHECK_EQ(early.window(), early_before);
  // The queue stands again: both now see it for what it is and both cut.
  int64_t t = now;
  period(late, &t, 3 * kMs);
  period(late, &t, 3 * kMs);
  CHECK(late.window() < 128u);
  CHECK(!late.slow_start());
}

GS_TEST_MAIN()
