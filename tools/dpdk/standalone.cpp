// gs_dpdk_standalone: the DPDK backend without the TCP control plane, for benchmarks and for
// testing the switch before/without the daemon. Jobs are created on the engine directly.
//
//   gs_dpdk_standalone [gradswitchd options: --threads, --data-port, --mtu, --agg-ip, ...]
//       [--job name=N,world=W,key=K,wire=float32,slots=S,ep=IP:PORT+IP:PORT...]...
//       -- EAL-ARGS
// The options are the daemon's (switch/options/, parsed the same way). Prints "job <name> id=<id>
// key=<key>" for each job, then runs until SIGINT/SIGTERM.
#include <arpa/inet.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "switch/config.h"
#include "switch/engine/engine.h"
#include "switch/io/dpdk/dpdk_backend.h"
#include "switch/options/command_line.h"

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) {
  g_stop.store(true);
}

uint8_t wire_of(const std::string& s) {
  if (s == "int32") return GS_ELEM_INT32;
  if (s == "fixed32") return GS_ELEM_FIXED32;
  if (s == "float16") return GS_ELEM_FLOAT16;
  if (s == "bfloat16") return GS_ELEM_BFLOAT16;
  if (s == "float64") return GS_ELEM_FLOAT64;
  return GS_ELEM_FLOAT32;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace gradswitch;
  // --job is this tool's; everything else is the daemon's command line.
  std::vector<std::string> jobs, args;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      args.insert(args.end(), argv + i, argv + argc);
      break;
    }
    if (std::strcmp(argv[i], "--job") == 0 && i + 1 < argc)
      jobs.push_back(argv[++i]);
    else
      args.push_back(argv[i]);
  }
  CommandLine cl;
  cl.config.backend = "dpdk";
  std::string error;
  if (!parse_command_line(args, &cl, &error)) {
    std::fprintf(stderr, "gs_dpdk_standalone: %s\n", error.c_str());
    return 2;
  }
  if (cl.help) {
    std::printf("%s", help_text("gs_dpdk_standalone", dpdk_backend_help()).c_str());
    return 0;
  }
  const SwitchConfig& cfg = cl.config;
  const std::vector<std::string>& rest = cl.eal_args;
  EngineConfig ec;
  ec.threads = cfg.threads;
  ec.max_jobs = cfg.max_jobs;
  Engine engine(ec);
  std::string err;
  auto backend = make_dpdk_backend(engine, cfg, rest, &err);
  if (!backend) {
    std::fprintf(stderr, "gs_dpdk_standalone: %s\n", err.c_str());
    return 1;
  }
  for (const std::string& j : jobs) {
    JobSpec spec;
    spec.payload_bytes = cfg.payload_bytes();
    std::stringstream ss(j);
    std::string kv;
    while (std::getline(ss, kv, ',')) {
      size_t eq = kv.find('=');
      std::string k = kv.substr(0, eq), v = eq == std::string::npos ? "" : kv.substr(eq + 1);
      if (k == "name")
        spec.name = v;
      else if (k == "world")
        spec.world = std::atoi(v.c_str());
      else if (k == "key")
        spec.key = std::strtoul(v.c_str(), nullptr, 0);
      else if (k == "wire")
        spec.wire = wire_of(v);
      else if (k == "slots")
        spec.slots = std::atoi(v.c_str());
      else if (k == "ep") {
        std::stringstream es(v);
        std::string e;
        while (std::getline(es, e, '+')) {
          size_t c = e.rfind(':');
          Endpoint ep;
          inet_pton(AF_INET, e.substr(0, c).c_str(), &ep.ipv4_be);
          ep.port_be = htons(std::atoi(e.substr(c + 1).c_str()));
          spec.endpoints.push_back(ep);
        }
      }
    }
    if (spec.world == 0) spec.world = spec.endpoints.size();
    uint32_t id = engine.create_job(spec, &err);
    if (!id) {
      std::fprintf(stderr, "gs_dpdk_standalone: job %s: %s\n", spec.name.c_str(), err.c_str());
      return 1;
    }
    std::printf("job %s id=%u key=%u\n", spec.name.c_str(), id, spec.key);
  }
  std::printf("%s\nready\n", backend->describe().c_str());
  std::fflush(stdout);
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  int rc = backend->run(g_stop);
  std::printf("%s\n", engine.total_counters().format("engine.").c_str());
  return rc;
}
