// The worker's counters (Group::stats), shared by the data paths (switch window, ring). They are
// written by the group's one background thread and read from any thread (common/counter.h).
#pragma once

#include <atomic>
#include <cstdint>

namespace gradswitch::worker {

struct Stats {
  uint64_t allreduces = 0;
  uint64_t packets_sent = 0, bytes_sent = 0;
  uint64_t packets_received = 0, bytes_received = 0;
  uint64_t retransmissions = 0;           // DATA packets resent (the sum of the four causes below)
  uint64_t retx_rack = 0;                 //   a later round's answer came first (RACK)
  uint64_t retx_timeout = 0;              //   the round's timer expired after a later round's answer came
  uint64_t retx_probe = 0;                //   timers expired with nothing later answered: one probe
  uint64_t retx_asked = 0;                //   the switch said the round lacks this rank (HELD's body)
  uint64_t spurious_retransmissions = 0;  // resends proven unneeded (DSACK, HELD, a late original result)
  uint64_t held_answers = 0;              // HELD answers: the switch held the resent contribution
  uint64_t window_delay_cuts = 0;         // adaptive window (protocol.md §4.2): cuts for queueing delay,
  uint64_t window_loss_cuts = 0;          //   halvings for a loss behind a queue,
  uint64_t window_undos = 0;              //   and loss cuts undone (the resend proven spurious)
  uint64_t injected_drops = 0;            // DATA packets dropped by the drop_rate hook
  uint64_t ignored = 0;           // received datagrams matching no outstanding round (late duplicates, ...)
  uint64_t unicast_results = 0;   // results answering a retransmission
  uint64_t bootstrap_rounds = 0;  // fixed32 exponent rounds (count = 0)
  uint64_t ring_allreduces = 0;   // allreduces (or their rest, after a fallback) run on the ring
  uint64_t fallbacks = 0;         // 1 once the switch was lost (or unreachable) and the ring took over
  uint64_t fallback_held = 0;     // chunks of the allreduce in flight whose sums this rank held then
  // Dropped for their source (docs/protocol.md §2.1): datagrams from an address that is neither the
  // switch's data ports nor, on the ring, a peer's.
  uint64_t dropped_foreign = 0;
  uint64_t unconfirmed_aborts = 0;  // ABORT datagrams the control connection did not confirm (§4)
  // Bounded-time rounds (docs/protocol.md §3.1): RESULTs that closed at their deadline without every
  // rank, the contributions they lacked, and ranks reported for missing Options::straggler_report
  // allreduces in a row.
  uint64_t partial_results = 0, missed_contributions = 0, straggler_reports = 0;
  uint64_t conceded_rounds = 0;  // rounds this rank conceded (Options::concede): DATA sent without payload
};

struct Counters {
  std::atomic<uint64_t> allreduces{0}, packets_sent{0}, bytes_sent{0}, packets_received{0}, bytes_received{0},
      retransmissions{0}, retx_rack{0}, retx_timeout{0}, retx_probe{0}, retx_asked{0},
      spurious_retransmissions{0}, held_answers{0}, window_delay_cuts{0}, window_loss_cuts{0},
      window_undos{0}, injected_drops{0}, ignored{0}, unicast_results{0}, bootstrap_rounds{0},
      ring_allreduces{0}, fallbacks{0}, fallback_held{0}, dropped_foreign{0}, unconfirmed_aborts{0},
      partial_results{0}, missed_contributions{0}, straggler_reports{0}, conceded_rounds{0};

  Stats snapshot() const;
};

}  // namespace gradswitch::worker
