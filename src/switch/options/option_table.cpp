// The option table (option_table.h): each option's name, help and parser, in --help order.
#include "switch/options/option_table.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "switch/options/option_builders.h"

namespace gradswitch {
namespace {

using namespace option_builders;
using namespace option_values;

// The DPDK backend's options (group "dpdk"): accepted before the `--` that starts the EAL
// arguments and, as before, after a second `--` that ends them.
std::vector<OptionSpec> dpdk_options() {
  std::vector<OptionSpec> o = {
      text_option(
          "agg-ip", "ADDR", "aggregation address (none: --control-host, unless it is 0.0.0.0 or loopback)",
          [](auto& c) -> auto& { return c.dpdk.agg_ip; }, true, valid_ipv4),
      uint_option(
          "agg-prefix", "N", "prefix length of the aggregation address on net_tap interfaces",
          [](auto& c) -> auto& { return c.dpdk.agg_prefix; }, 0, 32),
      text_option(
          "agg-mac", "MAC", "source MAC of results (none: the tap port's, else the first port's)",
          [](auto& c) -> auto& { return c.dpdk.agg_mac; }, true, valid_mac),
      choice_option("layout", "L", "lcore layout: auto|8b|8a|io|single (see below)",
                    [](auto& c) -> auto& { return c.dpdk.layout; }, {"auto", "8b", "8a", "io", "single"}),
      flag_option(
          "no-tap-config", "do not assign the aggregation address to net_tap interfaces",
          [](auto& c) -> auto& { return c.dpdk.tap_config; }, false),
      choice_option("answer-arp", "M",
                    "auto|on|off: answer ARP for the aggregation address (auto: when no net_tap port exists)",
                    [](auto& c) -> auto& { return c.dpdk.answer_arp; }, {"auto", "on", "off"}),
      text_option(
          "notify", "IP:PORT", "send a completion signal (include/gradswitch/notify.h) per allreduce",
          [](auto& c) -> auto& { return c.dpdk.notify; }, true, valid_ipv4_port),
      uint_option(
          "notify-quiet-us", "US", "a job's latest seq counts as complete after this long without results",
          [](auto& c) -> auto& { return c.dpdk.notify_quiet_us; }, 1, 60'000'000),
      uint_option(
          "mac-age", "SECONDS", "MAC and neighbour table ageing",
          [](auto& c) -> auto& { return c.dpdk.mac_age_s; }, 1, 86400),
      uint_option(
          "idle-sleep-us", "US", "sleep this long after 64 idle polls (0 = pure polling)",
          [](auto& c) -> auto& { return c.dpdk.idle_sleep_us; }, 0, 1'000'000),
      choice_option("udp-checksum", "on|off", "compute the UDP checksums of results",
                    [](auto& c) -> auto& { return c.dpdk.udp_checksum; }, {"on", "off"}),
      text_option(
          "stats-file", "PATH", "rewrite PATH with every counter and the MAC tables",
          [](auto& c) -> auto& { return c.dpdk.stats_file; }, true, nullptr),
      uint_option(
          "stats-interval-ms", "MS", "how often --stats-file is rewritten",
          [](auto& c) -> auto& { return c.dpdk.stats_interval_ms; }, 10, 3'600'000),
      uint_option(
          "mbufs", "N", "mbufs per port pool", [](auto& c) -> auto& { return c.dpdk.mbufs; }, 1023, 1u << 22),
      {"ring-size", "N", "entries per rte_ring (a power of two, 64..1048576)",
       [](SwitchConfig& c, const std::string& s, std::string* err) {
         uint64_t v;
         if (!parse_uint(s, 64, 1u << 20, &v, err)) return false;
         if (v & (v - 1)) return *err = "expected a power of two, got '" + s + "'", false;
         c.dpdk.ring_size = static_cast<unsigned>(v);
         return true;
       },
       [](const SwitchConfig& c) { return std::to_string(c.dpdk.ring_size); }},
  };
  for (OptionSpec& spec : o) spec.group = "dpdk";
  return o;
}

}  // namespace

// Every option of gradswitchd, in --help order.
const std::vector<OptionSpec>& switch_options() {
  static const std::vector<OptionSpec> options = [] {
    std::vector<OptionSpec> o = {
        {"control-host", "ADDR", "IPv4 address to listen on (TCP control plane and UDP data ports)",
         [](SwitchConfig& c, const std::string& s, std::string* err) {
           in_addr a;
           if (inet_pton(AF_INET, s.c_str(), &a) != 1) {
             *err = "expected an IPv4 address like 0.0.0.0 or 127.0.0.1, got '" + s + "'";
             return false;
           }
           c.control_host = s;
           return true;
         },
         [](const SwitchConfig& c) { return c.control_host; }},
        uint_option("control-port", "PORT", "TCP port of the control plane", &SwitchConfig::control_port, 1,
                    65535),
        uint_option("data-port", "PORT", "first UDP data port; data thread t listens on PORT+t",
                    &SwitchConfig::data_port, 1, 65535),
        uint_option("threads", "N", "data threads (slot s is served by thread s % N)", &SwitchConfig::threads,
                    1, kMaxThreads),
        uint_option("slots", "N", "slots per job (the cap of the workers' window, docs/protocol.md 4.2)",
                    &SwitchConfig::slots, 1, 65535),
        uint_option("mtu", "BYTES", "IP MTU of data packets; payload = MTU - 60, rounded down to 4 bytes",
                    &SwitchConfig::mtu, kMinMtu, GS_MAX_MTU),
        uint_option("max-jobs", "N", "jobs alive at once", &SwitchConfig::max_jobs, 1, 256),
        uint_option("join-timeout", "SECONDS", "time for all ranks of a job to join",
                    &SwitchConfig::join_timeout_s, 1, 86400),
        uint_option("idle-timeout", "SECONDS", "abort a job after this long without a packet or request",
                    &SwitchConfig::idle_timeout_s, 1, 30 * 86400),
        {"drop-rate", "P", "drop this fraction of received data packets (loss injection for tests)",
         [](SwitchConfig& c, const std::string& s, std::string* err) {
           char* end = nullptr;
           errno = 0;
           double v = s.empty() ? -1 : std::strtod(s.c_str(), &end);
           if (s.empty() || errno || *end != '\0' || !(v >= 0.0 && v <= 1.0)) {
             *err = "expected a probability between 0 and 1, got '" + s + "'";
             return false;
           }
           c.drop_rate = v;
           return true;
         },
         [](const SwitchConfig& c) {
           char b[32];
           std::snprintf(b, sizeof b, "%g", c.drop_rate);
           return std::string(b);
         }},
        uint_option("seed", "N", "seed of the injected loss", &SwitchConfig::seed, 0, UINT64_MAX),
        uint_option("batch", "N", "datagrams per recvmmsg/sendmmsg burst", &SwitchConfig::batch, 1, 1024),
        uint_option("hold-us", "US",
                    "udp backend: the results of a burst that leaves a round open wait up to this long to "
                    "leave with the next bursts' (fewer writes and wake-ups; 0 = send after every burst)",
                    &SwitchConfig::hold_us, 0, 1000000),
        uint_option("stats-interval", "SECONDS", "log a stats line this often (0 = never)",
                    &SwitchConfig::stats_interval_s, 0, 86400),
        choice_option("log-level", "LEVEL", "error|warn|info|debug", &SwitchConfig::log_level,
                      {"error", "warn", "info", "debug"}),
        choice_option("log-format", "FORMAT", "text|json: log lines as text, or one JSON object per line",
                      &SwitchConfig::log_format, {"text", "json"}),
        uint_option("metrics-port", "PORT",
                    "serve Prometheus metrics on http://METRICS-HOST:PORT/metrics (0 = no metrics endpoint)",
                    &SwitchConfig::metrics_port, 0, 65535),
        text_option("metrics-host", "ADDR",
                    "IPv4 address of the metrics endpoint; with --auth-file a scrape needs a bearer token "
                    "(`gradswitch metrics-token`: an operator's sees every job, a tenant's its own), "
                    "without one it shows every job to anyone, so a non-loopback address also needs "
                    "--insecure",
                    &SwitchConfig::metrics_host, false, valid_ipv4),
        choice_option("backend", "NAME", "data-plane I/O: udp (sockets) or dpdk (EAL arguments after --)",
                      &SwitchConfig::backend, {"udp", "dpdk"}),
        {"max-memory", "BYTES", "slot memory for all jobs together (suffix K, M, G); beyond it JOIN fails",
         [](SwitchConfig& c, const std::string& s, std::string* err) {
           return parse_bytes(s, &c.max_memory, err);
         },
         [](const SwitchConfig& c) {
           if (c.max_memory % (1ull << 30) == 0) return std::to_string(c.max_memory >> 30) + "G";
           if (c.max_memory % (1ull << 20) == 0) return std::to_string(c.max_memory >> 20) + "M";
           return std::to_string(c.max_memory);
         }},
        choice_option("udp-gso", "on|off",
                      "udp backend: send a burst's results to a worker as one UDP_SEGMENT write",
                      &SwitchConfig::udp_gso, {"on", "off"}),
        text_option("uplink", "IPv4:PORT",
                    "be a leaf: every job also joins the spine switch whose control plane is here, as one "
                    "rank for this switch's ranks (docs/protocol.md section 8); none: aggregate alone",
                    &SwitchConfig::uplink, true, valid_ipv4_port),
        text_option("auth-file", "PATH",
                    "tenants, secrets and quotas (docs/security.md); JOIN then needs AUTH (none: anonymous)",
                    &SwitchConfig::auth_file, true, nullptr),
        uint_option("handshake-timeout", "SECONDS",
                    "with --auth-file: close a connection that has neither authenticated nor joined a job "
                    "within this, and any connection that holds an incomplete line (no newline) this long",
                    &SwitchConfig::handshake_timeout_s, 1, 3600),
        uint_option("max-unauth-connections", "N",
                    "with --auth-file: connections neither authenticated nor in a job, from all addresses "
                    "together; a new one closes the oldest of the address that holds the most",
                    &SwitchConfig::max_unauth_connections, 1, 4000),
        uint_option("max-tenant-connections", "N",
                    "with --auth-file: a tenant's (or operator's) authenticated connections outside a job; "
                    "beyond it its oldest such connection is closed",
                    &SwitchConfig::max_tenant_connections, 1, 4096),
        uint_option("tenant-share", "PERCENT",
                    "with --auth-file: a quota the auth file leaves out (no defaults entry) is this share of "
                    "--max-jobs and --max-memory",
                    &SwitchConfig::tenant_share_percent, 1, 100),
        flag_option("insecure",
                    "serve a non-loopback --control-host without --auth-file: anyone who reaches it may "
                    "join, read and abort any job",
                    &SwitchConfig::insecure, true),
    };
    for (OptionSpec& spec : dpdk_options()) o.push_back(std::move(spec));
    return o;
  }();
  return options;
}

const OptionSpec* find_option(const std::string& name) {
  for (const OptionSpec& o : switch_options())
    if (name == o.name) return &o;
  return nullptr;
}

}  // namespace gradswitch
