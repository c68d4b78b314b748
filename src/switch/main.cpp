// gradswitchd: options -> config -> engine, control plane, backend -> run until SIGINT/SIGTERM.
#include <getopt.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/kernels.h"
#include "switch/config.h"
#include "switch/control/control_plane.h"
#include "switch/engine/engine.h"
#include "switch/io/udp/udp_backend.h"
#ifdef GRADSWITCH_HAVE_DPDK
#include "switch/io/dpdk/dpdk_backend.h"
#endif

using namespace gradswitch;

namespace {

constexpr const char* kNoDpdk =
    "this gradswitchd was built without DPDK (libdpdk-dev not found at build time)";
constexpr int kShutdownGraceMs = 200;  // data threads keep answering DATA with ABORT(SHUTDOWN) this long

std::atomic<bool> g_stop{false};
void on_signal(int) {
  g_stop.store(true);
}

struct Args {
  SwitchConfig config;
  bool help = false, version = false;
  std::vector<std::string> backend_args;  // after "--"
};

void print_help() {
  const SwitchConfig defaults;
  std::printf(
      "usage: gradswitchd [options] [-- dpdk-options]\n"
      "A software switch that sums data-parallel workers' gradients as they stream through.\n\n");
  for (const OptionSpec& o : switch_options()) {
    std::string flag = std::string("--") + o.name + " " + o.metavar;
    std::printf("  %-26s %s (default %s)\n", flag.c_str(), o.help, o.get(defaults).c_str());
  }
  std::printf("  %-26s %s\n  %-26s %s\n", "-h, --help",
              "this text; with --backend dpdk also the DPDK options", "-V, --version",
              "print the version and exit");
}

bool parse_args(int argc, char** argv, Args* args, std::string* error) {
  const auto& specs = switch_options();
  std::vector<option> longopts;
  for (size_t i = 0; i < specs.size(); ++i)
    longopts.push_back({specs[i].name, required_argument, nullptr, int(1000 + i)});
  longopts.push_back({"help", no_argument, nullptr, 'h'});
  longopts.push_back({"version", no_argument, nullptr, 'V'});
  longopts.push_back({nullptr, 0, nullptr, 0});
  opterr = 0;
  for (;;) {
    int c = getopt_long(argc, argv, "+:hV", longopts.data(), nullptr);
    if (c == -1) break;
    if (c == 'h')
      args->help = true;
    else if (c == 'V')
      args->version = true;
    else if (c == ':')
      return *error = std::string("option '") + argv[optind - 1] + "' needs a value", false;
    else if (c == '?')
      return *error = std::string("unknown option '") + argv[optind - 1] + "'", false;
    else {
      const OptionSpec& o = specs[c - 1000];
      std::string why;
      if (!o.set(args->config, optarg, &why))
        return *error = std::string("bad value for --") + o.name + ": " + why, false;
    }
  }
  if (optind < argc && !(optind > 1 && std::strcmp(argv[optind - 1], "--") == 0))
    return *error = std::string("unexpected argument '") + argv[optind] + "' (DPDK options go after --)",
           false;
  for (int i = optind; i < argc; ++i) args->backend_args.push_back(argv[i]);
  if (!args->backend_args.empty() && args->config.backend != "dpdk")
    return *error = "arguments after -- are for --backend dpdk", false;
  if (std::string v = validate_config(args->config); !v.empty()) return *error = v, false;
  return true;
}

std::unique_ptr<Backend> make_backend(Engine& engine, ControlPlane& control, const Args& args,
                                      std::string* error) {
  if (args.config.backend == "udp") return make_udp_backend(engine, args.config, error);
#ifdef GRADSWITCH_HAVE_DPDK
  return make_dpdk_backend(engine, control, args.config, args.backend_args, error);
#else
  *error = kNoDpdk;
  return nullptr;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  std::string error;
  if (!parse_args(argc, argv, &args, &error)) {
    std::fprintf(stderr, "gradswitchd: %s\nTry 'gradswitchd --help'.\n", error.c_str());
    return 2;
  }
  if (args.help) {
    print_help();
#ifdef GRADSWITCH_HAVE_DPDK
    if (args.config.backend == "dpdk")
      std::printf("\nDPDK backend (options after --):\n%s", dpdk_backend_help().c_str());
#else
    if (args.config.backend == "dpdk") std::printf("\n--backend dpdk: %s\n", kNoDpdk);
#endif
    return 0;
  }
  if (args.version) {
    std::printf("gradswitchd %s\n", GRADSWITCH_VERSION);
    return 0;
  }
  const SwitchConfig& config = args.config;
  set_log_level(config.log_level);

  Engine engine(EngineConfig{config.threads, config.max_jobs});
  ControlPlane control(engine, config);
  if (!control.listen(&error)) {
    std::fprintf(stderr, "gradswitchd: %s\n", error.c_str());
    return 1;
  }
  std::unique_ptr<Backend> backend = make_backend(engine, control, args, &error);
  if (!backend) {
    std::fprintf(stderr, "gradswitchd: %s\n", error.c_str());
    return 1;
  }
  control.add_stats_source([&] { return format_backend_stats(*backend); });

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::fprintf(stderr, "gradswitchd %s: control %s, data %s, mtu %u (payload %u B), simd %s\n",
               GRADSWITCH_VERSION, control.describe().c_str(), backend->describe().c_str(), config.mtu,
               config.payload_bytes(), kernels().name);
  const uint64_t start_ns = monotonic_ns();

  // The control plane runs on its own thread until a signal (or the backend returning); then it
  // aborts every job (GS_ABORT_SHUTDOWN) and, after a grace period in which the data threads answer
  // DATA packets with ABORT, stops the data path. The backend runs here: DPDK's main lcore is the
  // thread that initialised it.
  std::atomic<bool> data_stop{false};
  std::thread control_thread([&] {
    control.run(g_stop);
    for (uint64_t end = monotonic_ns() + kShutdownGraceMs * 1'000'000ull; monotonic_ns() < end;)
      control.step(10, monotonic_ns());
    data_stop.store(true);
  });
  const int backend_rc = backend->run(data_stop);
  g_stop.store(true);
  control_thread.join();
  control.close_all();  // every job ends and is destroyed

  const CounterValues t = engine.total_counters();
  std::fprintf(stderr,
               "gradswitchd: stopped after %.1f s: %llu jobs, pkts_in=%llu pkts_out=%llu completed=%llu "
               "retx_answered=%llu drops=%llu%s%s\n",
               (monotonic_ns() - start_ns) / 1e9, (unsigned long long)control.jobs_started(),
               (unsigned long long)t.pkts_in, (unsigned long long)t.pkts_out, (unsigned long long)t.completed,
               (unsigned long long)t.retx_answered, (unsigned long long)t.drops_total(), " ",
               format_backend_stats(*backend).c_str());
  return backend_rc;
}
