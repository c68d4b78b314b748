// gradswitchd: options -> config -> engine, control plane, backend -> run until SIGINT/SIGTERM;
// SIGHUP reads the auth file again.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/kernels.h"
#include "switch/config.h"
#include "switch/control/control_plane.h"
#include "switch/engine/engine.h"
#include "switch/io/udp/udp_backend.h"
#include "switch/log.h"
#include "switch/metrics/collector.h"
#include "switch/metrics/http_server.h"
#include "switch/options/command_line.h"
#include "switch/options/values.h"
#ifdef GRADSWITCH_HAVE_DPDK
#include "switch/io/dpdk/dpdk_backend.h"
#endif

using namespace gradswitch;

namespace {

constexpr const char* kNoDpdk =
    "this gradswitchd was built without DPDK (libdpdk-dev not found at build time)";
// Data threads keep answering DATA this long after the abort: resends of completed rounds from their
// copies (workers settle what they hold before the ring takes over), everything else with ABORT(SHUTDOWN).
constexpr int kShutdownGraceMs = 200;

std::atomic<bool> g_stop{false};
void on_signal(int) {
  g_stop.store(true);
}
// A signal handler may only store to a lock-free atomic: the control thread does the reload.
std::atomic<bool> g_reload{false};
static_assert(std::atomic<bool>::is_always_lock_free);
void on_hangup(int) {
  g_reload.store(true);
}

std::unique_ptr<Backend> make_backend(Engine& engine, const CommandLine& cl, std::string* error) {
  if (cl.config.backend == "udp") return make_udp_backend(engine, cl.config, error);
#ifdef GRADSWITCH_HAVE_DPDK
  return make_dpdk_backend(engine, cl.config, cl.eal_args, error);
#else
  *error = kNoDpdk;
  return nullptr;
#endif
}

// How the user ran us, for usage lines: `gradswitch switch` execs the daemon with that argv[0].
std::string program_name(const char* argv0) {
  std::string p = argv0 && *argv0 ? argv0 : "gradswitchd";
  if (p.find(' ') != std::string::npos) return p;
  return p.substr(p.rfind('/') + 1);
}

// Before the control port listens: a SIGHUP (a reload) that comes as soon as the port answers must
// not meet the default action, which ends the process.
void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sa.sa_handler = on_hangup;
  sigaction(SIGHUP, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

// --auth-file's tenants and operators, or without one the warning that --insecure deserves; false
// (the error printed) when the file cannot be used.
bool set_up_auth(ControlPlane& control, const SwitchConfig& config) {
  if (config.auth_file.empty()) {
    if (config.insecure && !option_values::is_loopback_ipv4(config.control_host))
      std::fprintf(stderr,
                   "gradswitchd: warning: --insecure: anyone who reaches %s may join, read and abort any "
                   "job (docs/security.md)\n",
                   config.control_host.c_str());
    return true;
  }
  std::string error;
  auto table = control::load_auth_file(config.auth_file, {config.max_jobs, config.max_memory}, &error,
                                       config.tenant_share_percent);
  if (!table) {
    std::fprintf(stderr, "gradswitchd: %s\n", error.c_str());
    return false;
  }
  std::fprintf(stderr, "gradswitchd: %zu tenants and operators from %s%s\n", table->tenants.size(),
               config.auth_file.c_str(), table->anonymous ? ", anonymous JOINs allowed" : "");
  control.use_auth(std::move(*table));
  return true;
}

// The control plane runs on its own thread until a signal (or the backend returning); then it aborts
// every job (GS_ABORT_SHUTDOWN) and, after a grace period in which the data threads still answer DATA
// packets (protocol.md §1.3), stops the data path. The backend runs here: DPDK's main lcore is the
// thread that initialised it. The backend's exit status.
int run_until_stopped(Backend& backend, ControlPlane& control, metrics::HttpServer& metrics_server) {
  std::atomic<bool> data_stop{false};
  std::thread control_thread([&] {
    control.run(g_stop, &g_reload);
    for (uint64_t end = monotonic_ns() + kShutdownGraceMs * 1'000'000ull; monotonic_ns() < end;)
      control.step(10, monotonic_ns());
    data_stop.store(true);
  });
  const int backend_rc = backend.run(data_stop);
  g_stop.store(true);
  control_thread.join();
  metrics_server.stop();  // before the jobs go: a last scrape still reads them
  control.close_all();    // every job ends and is destroyed
  return backend_rc;
}

void log_stopped(const Engine& engine, const ControlPlane& control, const Backend& backend,
                 uint64_t start_ns) {
  const CounterValues t = engine.total_counters();
  log_plain(LogLevel::kInfo,
            "gradswitchd: stopped after %.1f s: %llu jobs, pkts_in=%llu pkts_out=%llu completed=%llu "
            "retx_answered=%llu held_answered=%llu drops=%llu%s%s",
            (monotonic_ns() - start_ns) / 1e9, (unsigned long long)control.jobs_started(),
            (unsigned long long)t.pkts_in, (unsigned long long)t.pkts_out, (unsigned long long)t.completed,
            (unsigned long long)t.retx_answered, (unsigned long long)t.held_answered,
            (unsigned long long)t.drops_total(), " ", format_backend_stats(backend).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CommandLine args;
  std::string error;
  const std::string program = program_name(argv[0]);
  if (!parse_command_line(std::vector<std::string>(argv + 1, argv + argc), &args, &error)) {
    std::fprintf(stderr, "gradswitchd: %s\nTry '%s --help'.\n", error.c_str(), program.c_str());
    return 2;
  }
  if (args.help) {
#ifdef GRADSWITCH_HAVE_DPDK
    std::printf("%s", help_text(program, dpdk_backend_help()).c_str());
#else
    std::printf("%s", help_text(program, std::string("--backend dpdk: ") + kNoDpdk + "\n").c_str());
#endif
    return 0;
  }
  if (args.version) {
    std::printf("gradswitchd %s\n", GRADSWITCH_VERSION);
    return 0;
  }
  const SwitchConfig& config = args.config;
  set_log_level(config.log_level);
  set_log_format(config.log_format);
  install_signal_handlers();

  Engine engine(EngineConfig{config.threads, config.max_jobs, !config.uplink.empty()});
  ControlPlane control(engine, config);
  if (!set_up_auth(control, config)) return 2;
  if (!control.listen(&error)) {
    log_plain(LogLevel::kError, "gradswitchd: %s", error.c_str());
    return 1;
  }
  std::unique_ptr<Backend> backend = make_backend(engine, args, &error);
  if (!backend) {
    log_plain(LogLevel::kError, "gradswitchd: %s", error.c_str());
    return 1;
  }
  control.add_stats_source([&] { return format_backend_stats(*backend); });
  metrics::Collector collector(engine, *backend, control, config);
  metrics::HttpServer metrics_server(config.metrics_host, config.metrics_port,
                                     [&](const std::string& bearer) -> std::optional<std::string> {
                                       auto viewer = control.metrics_viewer(bearer);
                                       if (!viewer) return std::nullopt;
                                       return collector.render(*viewer);
                                     });
  if (config.metrics_port != 0 && !metrics_server.start(&error)) {
    log_plain(LogLevel::kError, "gradswitchd: %s", error.c_str());
    return 1;
  }
  log_plain(LogLevel::kInfo, "gradswitchd %s: control %s, data %s, mtu %u (payload %u B), simd %s",
            GRADSWITCH_VERSION, control.describe().c_str(), backend->describe().c_str(), config.mtu,
            config.payload_bytes(), kernels().name);
  if (config.metrics_port != 0) GS_LOG_INFO("metrics on %s", metrics_server.url().c_str());

  const uint64_t start_ns = monotonic_ns();
  const int backend_rc = run_until_stopped(*backend, control, metrics_server);
  log_stopped(engine, control, *backend, start_ns);
  return backend_rc;
}
