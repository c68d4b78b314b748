// Counter snapshots and the drop hook (see counters.h).
#include "worker/counters.h"

namespace gradswitch::worker {

Stats Counters::snapshot() const {
  auto r = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  Stats s;
  s.allreduces = r(allreduces);
  s.packets_sent = r(packets_sent);
  s.bytes_sent = r(bytes_sent);
  s.packets_received = r(packets_received);
  s.bytes_received = r(bytes_received);
  s.retransmissions = r(retransmissions);
  s.retx_rack = r(retx_rack);
  s.retx_timeout = r(retx_timeout);
  s.retx_probe = r(retx_probe);
  s.retx_asked = r(retx_asked);
  s.spurious_retransmissions = r(spurious_retransmissions);
  s.held_answers = r(held_answers);
  s.window_delay_cuts = r(window_delay_cuts);
  s.window_loss_cuts = r(window_loss_cuts);
  s.window_undos = r(window_undos);
  s.injected_drops = r(injected_drops);
  s.ignored = r(ignored);
  s.unicast_results = r(unicast_results);
  s.bootstrap_rounds = r(bootstrap_rounds);
  s.ring_allreduces = r(ring_allreduces);
  s.fallbacks = r(fallbacks);
  s.fallback_held = r(fallback_held);
  s.dropped_foreign = r(dropped_foreign);
  s.unconfirmed_aborts = r(unconfirmed_aborts);
  s.partial_results = r(partial_results);
  s.missed_contributions = r(missed_contributions);
  s.straggler_reports = r(straggler_reports);
  s.conceded_rounds = r(conceded_rounds);
  return s;
}

}  // namespace gradswitch::worker
