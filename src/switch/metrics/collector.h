// What `GET /metrics` shows (docs/observability.md lists every metric): the engine's totals and
// per-job counters, drops by reason, aborts by reason, round and allreduce duration histograms,
// gauges (jobs, joining, memory reserved, open rounds, the age of a job's oldest open round), the
// backend's own counters (Backend::stats()) and the process's. Per-job series carry the labels
// job_name and job_id and exist only while the job does, so the label sets stay bounded by
// --max-jobs. ("job" is Prometheus' own target label, hence job_name.) Who sees what: render()'s
// viewer, the control plane's rule (control::may_see).
//
// render() runs on the metrics thread: it reads counters without locks (single-writer atomics)
// and holds an Engine::ReadGuard while it looks at jobs, so a job the control plane destroys
// meanwhile is freed only after the scrape let go of it. The data path never waits for a scrape.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "switch/config.h"
#include "switch/control/control_plane.h"
#include "switch/engine/engine.h"
#include "switch/io/backend.h"
#include "switch/metrics/exposition.h"

namespace gradswitch::metrics {

struct JobView;

class Collector {
 public:
  Collector(const Engine& engine, const Backend& backend, const ControlPlane& control,
            const SwitchConfig& config);
  // The exposition (Prometheus text format 0.0.4), as of now, as `viewer` may see it: an operator
  // (or anyone, without an auth file) everything; a tenant the configuration and its own jobs'
  // series, with the secret checks' drops as one reason (docs/security.md).
  std::string render(const control::Viewer& viewer) const;

 private:
  // The switch-wide families (they move with every tenant's jobs): operators only.
  void totals(Exposition& e, const std::vector<JobView>& jobs) const;
  void per_job(Exposition& e, const std::vector<JobView>& jobs, bool per_reason, uint64_t now) const;

  const Engine& engine_;
  const Backend& backend_;
  const ControlPlane& control_;
  const SwitchConfig& config_;
  double start_time_s_;  // wall clock at start-up
};

}  // namespace gradswitch::metrics
