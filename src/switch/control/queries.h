// What the control plane tells about jobs and counters (docs/protocol.md section 1): STATUS, STATS
// and JOBS, each answering only about the jobs the asking connection may see (docs/security.md),
// and the periodic stats log line. It reads the jobs and never changes them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "switch/config.h"
#include "switch/control/authenticator.h"
#include "switch/control/connections.h"
#include "switch/control/jobs.h"
#include "switch/control/leaf_uplink.h"
#include "switch/engine/engine.h"

namespace gradswitch::control {

class Queries {
 public:
  Queries(Engine& engine, const SwitchConfig& config, Connections& conns, const Authenticator& auth,
          const Jobs& jobs, const LeafUplink& leaf);

  void handle_status(Conn& c, const Request& r, uint64_t now_ns);
  void handle_stats(Conn& c, const Request& r);
  void handle_jobs(Conn& c, const Request& r);
  // Extra `key=value ...` text appended to the total STATS reply and the stats log line.
  void add_source(std::function<std::string()> source) { sources_.push_back(std::move(source)); }
  // The stats log line every --stats-interval.
  void log_periodic(uint64_t now_ns);

 private:
  bool can_see(const Conn& c, uint32_t job_id) const;
  // STATUS's open_rounds= and, when a round is open, the oldest one's slot, age and contributors.
  void add_open_rounds(Line& out, uint32_t job_id, uint64_t now_ns) const;
  // STATUS slot=: that slot's state; false (and answered) when there is no such slot.
  bool add_slot(Conn& c, Line& out, uint32_t id, const JobStatus& s, const QueryRequest& q);
  // The STATS total; `per_reason`: with the drop.<reason> counters (operators and the log).
  std::string stats_line(bool per_reason) const;
  // A non-operator's STATS total: over the jobs it may see.
  std::string visible_stats_line(const Conn& c) const;

  Engine& engine_;
  const SwitchConfig& config_;
  Connections& conns_;
  const Authenticator& auth_;
  const Jobs& jobs_;
  const LeafUplink& leaf_;
  std::vector<std::function<std::string()>> sources_;
  uint64_t next_stats_ns_ = 0;
};

}  // namespace gradswitch::control
