// The metrics of GET /metrics (see collector.h).
#include "switch/metrics/collector.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "common/clock.h"
#include "common/kernels.h"
#include "gradswitch/control.h"
#include "switch/metrics/exposition.h"

namespace gradswitch::metrics {

namespace {

using Type = Exposition::Type;

std::vector<double> bounds_seconds() {
  std::vector<double> b;
  for (uint64_t ns : kLatencyBoundsNs) b.push_back(static_cast<double>(ns) / 1e9);
  return b;
}

void histogram(Exposition& e, const Labels& labels, const LatencyValues& v) {
  static const std::vector<double> bounds = bounds_seconds();
  e.histogram(labels, bounds, std::vector<uint64_t>(v.counts.begin(), v.counts.end()),
              static_cast<double>(v.sum_ns) / 1e9);
}

// The counters every job and the total share: (metric suffix, help, value).
struct CounterField {
  const char* name;
  const char* help;
  uint64_t CounterValues::*field;
};
constexpr CounterField kCounterFields[] = {
    {"received_packets_total", "Datagrams received on the data ports (every one, dropped or not).",
     &CounterValues::pkts_in},
    {"received_bytes_total", "Bytes of the datagrams received (UDP payload).", &CounterValues::bytes_in},
    {"sent_packets_total", "Datagrams sent: results (one per rank), answers to retransmissions, aborts.",
     &CounterValues::pkts_out},
    {"sent_bytes_total", "Bytes of the datagrams sent (UDP payload).", &CounterValues::bytes_out},
    {"rounds_completed_total", "Rounds (one chunk summed over every rank) completed.",
     &CounterValues::completed},
    {"duplicate_packets_total", "Contributions already counted in their round, ignored.",
     &CounterValues::duplicates},
    {"retransmissions_answered_total", "Retransmitted contributions answered from a round's shadow copy.",
     &CounterValues::retx_answered},
    {"retransmissions_held_total",
     "Retransmitted contributions an open round already held, answered with HELD (the resend was spurious).",
     &CounterValues::held_answered},
    {"lacking_told_total",
     "HELDs sent to ranks an open round lacked when another rank's retransmission reached it (resend yours).",
     &CounterValues::lacking_told},
    {"rounds_partial_total",
     "Rounds closed without every rank's contribution, at their deadline or by concessions (jobs with "
     "deadline_us=, docs/protocol.md 3.1).",
     &CounterValues::partial},
    {"contributions_missed_total", "Contributions the rounds closed at their deadline lacked.",
     &CounterValues::missed},
    {"arrivals_conceded_total",
     "Ranks that reached a round without contributing (DATA with CONCEDE, docs/protocol.md 3.1).",
     &CounterValues::conceded},
};

// `every_reason`: a sample for each reason, 0 or not (the totals); else only those that happened.
// `per_reason`: the secret checks apart (operators); else as one, reason="rejected" (is_secret_check).
void counters(Exposition& e, const std::string& prefix,
              const std::vector<std::pair<Labels, CounterValues>>& rows, bool every_reason, bool per_reason) {
  for (const CounterField& f : kCounterFields) {
    e.family(prefix + f.name, Type::kCounter, f.help);
    for (const auto& [labels, v] : rows) e.sample(labels, v.*(f.field));
  }
  e.family(prefix + "dropped_packets_total", Type::kCounter,
           "Datagrams dropped, by reason (docs/protocol.md section 3 names them; \"rejected\": the checks of "
           "job id, key, rank and source address, apart for operators only).");
  for (const auto& [labels, v] : rows) {
    uint64_t rejected = 0;
    for (size_t r = 1; r < kDropReasons; ++r)
      if (is_secret_check(static_cast<DropReason>(r))) rejected += v.drops[r];
    if (!per_reason && (every_reason || rejected != 0)) {
      Labels l = labels;
      l.emplace_back("reason", kRejectedName);
      e.sample(l, rejected);
    }
    for (size_t r = 1; r < kDropReasons; ++r) {
      if (!per_reason && is_secret_check(static_cast<DropReason>(r))) continue;
      if (!every_reason && v.drops[r] == 0) continue;  // per job: only the reasons that happened
      Labels l = labels;
      l.emplace_back("reason", drop_reason_name(static_cast<DropReason>(r)));
      e.sample(l, v.drops[r]);
    }
  }
}

// The process: CPU, memory, file descriptors (the names every Prometheus client library uses).
void process_metrics(Exposition& e, double start_time_s) {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  const double cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                     static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  e.family("process_cpu_seconds_total", Type::kCounter, "User and system CPU time of the process.");
  e.sample({}, cpu);
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  e.family("process_resident_memory_bytes", Type::kGauge, "Resident memory of the process.");
  e.sample({}, static_cast<uint64_t>(resident) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)));
  uint64_t fds = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* ent = ::readdir(d))
      if (ent->d_name[0] != '.') ++fds;
    ::closedir(d);
  }
  e.family("process_open_fds", Type::kGauge, "Open file descriptors of the process.");
  e.sample({}, fds > 0 ? fds - 1 : 0);  // less the one reading the directory
  e.family("process_start_time_seconds", Type::kGauge, "Start of the process, seconds since the Unix epoch.");
  e.sample({}, start_time_s);
}

// A backend's stats as metrics: gradswitch_<backend>_<name>, counters with _total; a value in
// nanoseconds (`_ns`) in the base unit, seconds.
void backend_metrics(Exposition& e, const Backend& backend) {
  std::vector<BackendStat> stats = backend.stats();
  // One family per name (a labelled stat comes once per label value), in first-seen order.
  std::vector<const char*> names;
  for (const BackendStat& s : stats)
    if (std::none_of(names.begin(), names.end(), [&](const char* n) { return std::string(n) == s.name; }))
      names.push_back(s.name);
  for (const char* name : names) {
    const BackendStat* first = nullptr;
    for (const BackendStat& s : stats)
      if (std::string(s.name) == name) {
        std::string metric = name;
        const bool nanoseconds = metric.size() > 3 && metric.compare(metric.size() - 3, 3, "_ns") == 0;
        if (nanoseconds) metric.replace(metric.size() - 3, 3, "_seconds");
        if (!first) {
          first = &s;
          const bool counter = s.kind == BackendStat::Kind::kCounter;
          e.family(std::string("gradswitch_") + backend.name() + "_" + metric + (counter ? "_total" : ""),
                   counter ? Type::kCounter : Type::kGauge, s.help);
        }
        Labels l;
        if (s.label) l.emplace_back(s.label, std::to_string(s.label_value));
        if (nanoseconds)
          e.sample(l, static_cast<double>(s.value) / 1e9);
        else
          e.sample(l, s.value);
      }
  }
}

}  // namespace

// A job as the scrape saw it (copied under the engine's ReadGuard).
struct JobView {
  JobStatus status;
  LatencyValues rounds, allreduces;
  std::vector<OpenRound> open;
};

Collector::Collector(const Engine& engine, const Backend& backend, const ControlPlane& control,
                     const SwitchConfig& config)
    : engine_(engine),
      backend_(backend),
      control_(control),
      config_(config),
      start_time_s_(
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()) {}

std::string Collector::render(const control::Viewer& viewer) const {
  // Copy what the jobs say while the engine cannot free them; format afterwards.
  std::vector<JobView> jobs;
  {
    Engine::ReadGuard guard(engine_);
    for (uint32_t id : engine_.job_ids()) {
      JobView j;
      if (!engine_.job_status(id, &j.status) || !control_.may_see_job(viewer, j.status)) continue;
      engine_.job_latency(id, &j.rounds, &j.allreduces);
      engine_.open_rounds(id, &j.open);
      jobs.push_back(std::move(j));
    }
  }
  const uint64_t now = monotonic_ns();
  Exposition e;

  e.family("gradswitch_build_info", Type::kGauge, "Always 1; the labels say which gradswitchd runs.");
  e.sample({{"version", GRADSWITCH_VERSION}, {"backend", backend_.name()}, {"simd", kernels().name}},
           uint64_t{1});
  e.family("gradswitch_start_time_seconds", Type::kGauge,
           "Start of the switch, seconds since the Unix epoch.");
  e.sample({}, start_time_s_);
  e.family("gradswitch_data_threads", Type::kGauge, "Data threads (--threads).");
  e.sample({}, uint64_t{config_.threads});
  e.family("gradswitch_max_jobs", Type::kGauge, "Jobs that may be alive at once (--max-jobs).");
  e.sample({}, uint64_t{config_.max_jobs});
  e.family("gradswitch_memory_limit_bytes", Type::kGauge, "Memory the jobs may reserve (--max-memory).");
  e.sample({}, config_.max_memory);
  // Up to here: the configuration, the same whoever runs what. Everything switch-wide below moves
  // with every tenant's jobs (that they exist, how fast they run, how guesses were dropped): a
  // tenant's token gets its own jobs' series only (docs/security.md).
  if (viewer.privileged) totals(e, jobs);
  per_job(e, jobs, viewer.privileged, now);
  if (viewer.privileged) {
    backend_metrics(e, backend_);
    process_metrics(e, start_time_s_);
  }
  return e.take();
}

void Collector::totals(Exposition& e, const std::vector<JobView>& jobs) const {
  const ControlPlane::Gauges& g = control_.gauges();
  e.family("gradswitch_memory_reserved_bytes", Type::kGauge,
           "Memory reserved by running and joining jobs (slots, optimizer parameters and state).");
  e.sample({}, g.reserved_bytes.load(std::memory_order_relaxed));
  e.family("gradswitch_control_connections", Type::kGauge, "Open control-plane connections.");
  e.sample({}, g.connections.load(std::memory_order_relaxed));
  if (!config_.auth_file.empty()) {
    e.family("gradswitch_auth_reloads_total", Type::kCounter,
             "Re-reads of the auth file (SIGHUP): put in force (ok) or refused, the table in force kept "
             "(refused).");
    e.sample({{"result", "ok"}}, g.auth_reloads.load(std::memory_order_relaxed));
    e.sample({{"result", "refused"}}, g.auth_reload_failures.load(std::memory_order_relaxed));
  }

  uint64_t running = 0, aborted = 0, open_total = 0;
  for (const JobView& j : jobs) {
    (j.status.aborted ? aborted : running)++;
    open_total += j.open.size();
  }
  e.family("gradswitch_jobs", Type::kGauge,
           "Jobs by state: running, aborted (until every rank has closed), joining (waiting for ranks).");
  e.sample({{"state", "running"}}, running);
  e.sample({{"state", "aborted"}}, aborted);
  e.sample({{"state", "joining"}}, g.joining.load(std::memory_order_relaxed));
  e.family("gradswitch_jobs_started_total", Type::kCounter, "Jobs started (every rank joined).");
  e.sample({}, g.jobs_started.load(std::memory_order_relaxed));
  e.family("gradswitch_jobs_aborted_total", Type::kCounter, "Jobs aborted, by reason.");
  const auto aborts = engine_.aborts();
  for (uint8_t r = 1; r < aborts.size(); ++r)
    if (std::string(gs_abort_reason_name(r)) != "unknown")
      e.sample({{"reason", gs_abort_reason_name(r)}}, aborts[r]);
  e.family("gradswitch_open_rounds", Type::kGauge, "Rounds waiting for contributions, over every job.");
  e.sample({}, open_total);

  counters(e, "gradswitch_", {{Labels{}, engine_.total_counters()}}, /*every_reason=*/true,
           /*per_reason=*/true);
  e.family("gradswitch_round_duration_seconds", Type::kHistogram,
           "Time from a round's first contribution to its completion (every job since start).");
  histogram(e, {}, engine_.total_round_times());
  e.family("gradswitch_allreduce_duration_seconds", Type::kHistogram,
           "Time from an allreduce's first DATA packet to the completion of its last chunk, as the data "
           "thread that completes it sees them (every job since start).");
  histogram(e, {}, engine_.total_allreduce_times());
}

void Collector::per_job(Exposition& e, const std::vector<JobView>& jobs, bool per_reason,
                        uint64_t now) const {
  std::vector<std::pair<Labels, CounterValues>> rows;
  for (const JobView& j : jobs)
    rows.push_back(
        {{{"job_name", j.status.name}, {"job_id", std::to_string(j.status.job_id)}}, j.status.counters});
  if (!jobs.empty()) {
    e.family("gradswitch_job_info", Type::kGauge, "Always 1 per live job; the labels describe it.");
    for (size_t i = 0; i < jobs.size(); ++i) {
      Labels l = rows[i].first;
      l.emplace_back("wire", gs_elem_name(jobs[i].status.wire));
      l.emplace_back("state", jobs[i].status.aborted ? "aborted" : "running");
      l.emplace_back("abort_reason",
                     gs_abort_reason_name(jobs[i].status.aborted ? jobs[i].status.abort_reason : 0));
      e.sample(l, uint64_t{1});
    }
    e.family("gradswitch_job_ranks", Type::kGauge, "Ranks of the job (its world size).");
    for (size_t i = 0; i < jobs.size(); ++i) e.sample(rows[i].first, uint64_t{jobs[i].status.world});
    e.family("gradswitch_job_slots", Type::kGauge, "Slots of the job (the workers' window).");
    for (size_t i = 0; i < jobs.size(); ++i) e.sample(rows[i].first, uint64_t{jobs[i].status.slots});
    e.family("gradswitch_job_open_rounds", Type::kGauge, "The job's rounds waiting for contributions.");
    for (size_t i = 0; i < jobs.size(); ++i) e.sample(rows[i].first, uint64_t{jobs[i].open.size()});
    e.family("gradswitch_job_oldest_open_round_seconds", Type::kGauge,
             "Age of the job's oldest round still waiting for contributions (0 when none waits): a job "
             "whose value keeps growing is stuck (`gradswitch status` names the ranks it waits for).");
    for (size_t i = 0; i < jobs.size(); ++i) {
      const auto& open = jobs[i].open;
      const uint64_t opened = open.empty() ? now : open.front().opened_ns;
      e.sample(rows[i].first, now > opened ? static_cast<double>(now - opened) / 1e9 : 0.0);
    }
    e.family("gradswitch_job_idle_seconds", Type::kGauge, "Time since the job's last DATA packet.");
    for (size_t i = 0; i < jobs.size(); ++i) {
      const uint64_t last = jobs[i].status.last_activity_ns;
      e.sample(rows[i].first, last && now > last ? static_cast<double>(now - last) / 1e9 : 0.0);
    }
    e.family("gradswitch_job_rank_lag_allreduces", Type::kGauge,
             "Highest allreduce seq seen from any rank minus the lowest (a rank behind the others; "
             "ranks not seen yet count from -1).");
    for (size_t i = 0; i < jobs.size(); ++i) {
      const auto& seqs = jobs[i].status.rank_last_seq;
      int64_t lo = 0, hi = 0;
      if (!seqs.empty()) {
        lo = *std::min_element(seqs.begin(), seqs.end());
        hi = *std::max_element(seqs.begin(), seqs.end());
      }
      e.sample(rows[i].first, static_cast<uint64_t>(hi - lo));
    }
    counters(e, "gradswitch_job_", rows, /*every_reason=*/false, per_reason);
    e.family("gradswitch_job_round_duration_seconds", Type::kHistogram,
             "Time from a round's first contribution to its completion.");
    for (size_t i = 0; i < jobs.size(); ++i) histogram(e, rows[i].first, jobs[i].rounds);
    e.family("gradswitch_job_allreduce_duration_seconds", Type::kHistogram,
             "Time from an allreduce's first DATA packet to the completion of its last chunk.");
    for (size_t i = 0; i < jobs.size(); ++i) histogram(e, rows[i].first, jobs[i].allreduces);
  }
}

}  // namespace gradswitch::metrics
