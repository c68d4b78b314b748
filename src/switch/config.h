// The daemon's configuration: every option, its default and its help text in one place.
//
// The defaults are the member initialisers of SwitchConfig; `switch_options()` describes each
// option once (name, argument, help, how to parse and how to print it, its group), and
// command_line.cpp parses the command line and builds `--help` from it. The DPDK backend's options
// are a group of the same table (SwitchConfig::dpdk). The clock is common/clock.h; the log is log.h.
#pragma once

#include <arpa/inet.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "gradswitch/wire.h"
#include "switch/log.h"

#ifndef GRADSWITCH_VERSION
#define GRADSWITCH_VERSION "0.1.0"
#endif

namespace gradswitch {

struct SwitchConfig {
  // IPv4 address of the TCP control plane and UDP data ports. Loopback needs no configuration;
  // any other address needs --auth-file (or --insecure): docs/security.md.
  std::string control_host = "127.0.0.1";
  uint16_t control_port = 7700;
  uint16_t data_port = 7701;  // data thread t listens on data_port + t
  unsigned threads = 1;       // data threads; slot s is served by thread s % threads
  unsigned slots = 256;       // slots per job = the workers' window
  unsigned mtu = 1500;        // IP MTU; payload = (mtu - 60) rounded down to 4 bytes
  unsigned max_jobs = 64;
  unsigned join_timeout_s = 60;            // all ranks must have joined within this
  unsigned idle_timeout_s = 600;           // a job without packets or requests this long is aborted
  double drop_rate = 0.0;                  // injected loss of received data packets (tests)
  uint64_t seed = 1;                       // seed of the injected loss
  unsigned batch = 32;                     // datagrams per recvmmsg/sendmmsg
  unsigned hold_us = 100;                  // udp: results may wait for the next burst's (result_hold.h)
  unsigned stats_interval_s = 0;           // periodic stats log line; 0 = off
  std::string log_level = "info";          // error | warn | info | debug
  std::string log_format = "text";         // text | json (one object per line)
  uint16_t metrics_port = 0;               // HTTP GET /metrics (Prometheus); 0 = off
  std::string metrics_host = "127.0.0.1";  // where it listens (with --auth-file: bearer tokens)
  std::string backend = "udp";             // udp | dpdk
  uint64_t max_memory = 1ull << 30;        // bytes of slot memory for all jobs together
  std::string udp_gso = "on";              // on | off: UDP_SEGMENT for results sent to one worker
  std::string uplink;                      // IPv4:PORT of a spine's control plane: this switch is a leaf
  std::string auth_file;  // tenants, their secrets and quotas; "" = anonymous (docs/security.md)
  bool insecure = false;  // serve a non-loopback address without --auth-file
  // With --auth-file (docs/security.md, "the control port"): a connection that neither authenticated
  // nor joined within handshake_timeout_s is closed, and so is any connection that holds an incomplete
  // line that long; at most max_unauth_connections such connections are held (the oldest of the
  // address holding the most is closed for a new one), and max_tenant_connections authenticated ones
  // outside a job per tenant. tenant_share_percent: the default quotas (docs/protocol.md §1.5).
  unsigned handshake_timeout_s = 10;
  unsigned max_unauth_connections = 1024;
  unsigned max_tenant_connections = 64;
  unsigned tenant_share_percent = 50;

  // The DPDK backend's own options (--backend dpdk; docs/dpdk.md).
  struct Dpdk {
    std::string agg_ip;               // aggregation address; "" = --control-host unless 0.0.0.0 or loopback
    unsigned agg_prefix = 24;         // prefix length given to net_tap interfaces with agg_ip
    std::string agg_mac;              // source MAC of results; "" = the tap port's, else the first port's
    std::string layout = "auto";      // auto | 8b | 8a | io | single (lcore_layout.h)
    bool tap_config = true;           // assign agg_ip to net_tap interfaces
    std::string answer_arp = "auto";  // auto | on | off: answer ARP for agg_ip (auto: without a tap)
    std::string notify;               // IP:PORT of completion signals; "" = none
    unsigned notify_quiet_us = 1000;  // a job's latest seq is complete after this long without results
    unsigned mac_age_s = 300;         // MAC and neighbour ageing
    unsigned idle_sleep_us = 0;       // sleep after 64 idle polls; 0 = pure polling
    std::string udp_checksum = "on";  // on | off: UDP checksums of results
    std::string stats_file;           // rewritten with every counter; "" = none
    unsigned stats_interval_ms = 1000;
    unsigned mbufs = 8191;      // per port pool
    unsigned ring_size = 4096;  // entries per rte_ring, a power of two
  } dpdk;

  // Largest payload of a data packet: mtu - IPv4 (20) - UDP (8) - gradswitch header (32),
  // rounded down to a multiple of 4.
  uint32_t payload_bytes() const { return (mtu - GS_IPV4_UDP_OVERHEAD - GS_HEADER_BYTES) & ~3u; }
};

inline constexpr unsigned kMinMtu = 128;
inline constexpr unsigned kMaxThreads = 64;

// One command-line option. `set` parses the argument into the config or returns false with a
// message; `get` prints the current value (applied to SwitchConfig{} it gives the default).
struct OptionSpec {
  const char* name;     // long option name without "--"
  const char* metavar;  // shown in --help; nullptr for a flag (no argument; `set` gets "")
  const char* help;
  std::function<bool(SwitchConfig&, const std::string&, std::string*)> set;
  std::function<std::string(const SwitchConfig&)> get;
  const char* group = "";  // "" = the daemon's, "dpdk" = the DPDK backend's
};

namespace config_detail {

// Strict unsigned decimal in [lo, hi].
inline bool parse_uint(const std::string& s, uint64_t lo, uint64_t hi, uint64_t* out, std::string* err) {
  if (s.empty() || s.size() > 20 || s.find_first_not_of("0123456789") != std::string::npos) {
    *err = "expected an unsigned integer, got '" + s + "'";
    return false;
  }
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
  if (errno == ERANGE || v < lo || v > hi) {
    *err = "'" + s + "' is out of range " + std::to_string(lo) + ".." + std::to_string(hi);
    return false;
  }
  *out = v;
  return true;
}

// Unsigned with an optional K/M/G suffix (binary units), for --max-memory.
inline bool parse_bytes(const std::string& s, uint64_t* out, std::string* err) {
  std::string digits = s;
  uint64_t mult = 1;
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'K':
      case 'k':
        mult = 1ull << 10;
        digits.pop_back();
        break;
      case 'M':
      case 'm':
        mult = 1ull << 20;
        digits.pop_back();
        break;
      case 'G':
      case 'g':
        mult = 1ull << 30;
        digits.pop_back();
        break;
      default:
        break;
    }
  }
  uint64_t v;
  if (!parse_uint(digits, 1, (1ull << 50) / mult, &v, err)) {
    *err = "expected a byte count like 1073741824, 512M or 4G, got '" + s + "'";
    return false;
  }
  *out = v * mult;
  return true;
}

inline bool parse_choice(const std::string& s, std::initializer_list<const char*> choices, std::string* out,
                         std::string* err) {
  std::string list;
  for (const char* c : choices) {
    if (s == c) {
      *out = s;
      return true;
    }
    list += list.empty() ? c : std::string("|") + c;
  }
  *err = "expected one of " + list + ", got '" + s + "'";
  return false;
}

// A field of SwitchConfig, named by a member pointer (&SwitchConfig::mtu) or, inside a group, by a
// generic lambda returning it (`[](auto& c) -> auto& { return c.dpdk.mbufs; }`).
template <typename Field, typename Config>
decltype(auto) field_of(Field field, Config& c) {
  if constexpr (std::is_member_object_pointer_v<Field>)
    return (c.*field);
  else
    return field(c);
}

template <typename Field>
OptionSpec uint_option(const char* name, const char* metavar, const char* help, Field field, uint64_t lo,
                       uint64_t hi) {
  return {name, metavar, help,
          [=](SwitchConfig& c, const std::string& s, std::string* err) {
            uint64_t v;
            if (!parse_uint(s, lo, hi, &v, err)) return false;
            auto& f = field_of(field, c);
            f = static_cast<std::remove_reference_t<decltype(f)>>(v);
            return true;
          },
          [=](const SwitchConfig& c) { return std::to_string(field_of(field, c)); }};
}

template <typename Field>
OptionSpec choice_option(const char* name, const char* metavar, const char* help, Field field,
                         std::initializer_list<const char*> choices) {
  std::vector<const char*> copy(choices);
  return {name, metavar, help,
          [=](SwitchConfig& c, const std::string& s, std::string* err) {
            for (const char* ch : copy)
              if (s == ch) return (field_of(field, c) = s), true;
            std::string list;
            for (const char* ch : copy) list += list.empty() ? ch : std::string("|") + ch;
            *err = "expected one of " + list + ", got '" + s + "'";
            return false;
          },
          [=](const SwitchConfig& c) { return field_of(field, c); }};
}

// A string checked by `valid` (which explains what it expected); "" is allowed when `optional`.
template <typename Field>
OptionSpec text_option(const char* name, const char* metavar, const char* help, Field field, bool optional,
                       bool (*valid)(const std::string&, std::string*)) {
  return {name, metavar, help,
          [=](SwitchConfig& c, const std::string& s, std::string* err) {
            if (!(optional && s.empty()) && valid && !valid(s, err)) return false;
            field_of(field, c) = s;
            return true;
          },
          [=](const SwitchConfig& c) {
            const std::string& v = field_of(field, c);
            return v.empty() ? std::string("none") : v;
          }};
}

// A flag without argument that sets a bool to `value`.
template <typename Field>
OptionSpec flag_option(const char* name, const char* help, Field field, bool value) {
  return {
      name, nullptr, help,
      [=](SwitchConfig& c, const std::string&, std::string*) { return (field_of(field, c) = value), true; },
      [=](const SwitchConfig& c) { return std::string(field_of(field, c) == value ? "set" : "not set"); }};
}

inline bool valid_ipv4(const std::string& s, std::string* err) {
  in_addr a;
  if (inet_pton(AF_INET, s.c_str(), &a) == 1) return true;
  *err = "expected an IPv4 address like 10.0.0.100, got '" + s + "'";
  return false;
}

// "IPv4:PORT" with a port in 1..65535.
inline bool parse_ipv4_port(const std::string& s, uint32_t* ip_be, uint16_t* port, std::string* err) {
  const size_t colon = s.rfind(':');
  in_addr a;
  uint64_t p = 0;
  std::string why;
  if (colon == std::string::npos || inet_pton(AF_INET, s.substr(0, colon).c_str(), &a) != 1 ||
      !parse_uint(s.substr(colon + 1), 1, 65535, &p, &why)) {
    *err = "expected IPv4:PORT like 10.0.0.3:9911, got '" + s + "'";
    return false;
  }
  *ip_be = a.s_addr;
  *port = static_cast<uint16_t>(p);
  return true;
}
inline bool valid_ipv4_port(const std::string& s, std::string* err) {
  uint32_t ip;
  uint16_t port;
  return parse_ipv4_port(s, &ip, &port, err);
}

// A MAC address as six hex pairs separated by ':' or '-'.
inline bool parse_mac(const std::string& s, uint8_t out[6], std::string* err) {
  unsigned b[6];
  char sep[5];
  int used = 0;
  if (s.size() == 17 &&
      std::sscanf(s.c_str(), "%2x%c%2x%c%2x%c%2x%c%2x%c%2x%n", &b[0], &sep[0], &b[1], &sep[1], &b[2], &sep[2],
                  &b[3], &sep[3], &b[4], &sep[4], &b[5], &used) == 11 &&
      used == 17 && s.find_first_not_of("0123456789abcdefABCDEF:-") == std::string::npos) {
    for (int i = 0; i < 6; ++i) out[i] = static_cast<uint8_t>(b[i]);
    return true;
  }
  *err = "expected a MAC address like 02:00:00:00:00:01, got '" + s + "'";
  return false;
}
inline bool valid_mac(const std::string& s, std::string* err) {
  uint8_t m[6];
  return parse_mac(s, m, err);
}

}  // namespace config_detail

// The DPDK backend's options (group "dpdk"): accepted before the `--` that starts the EAL
// arguments and, as before, after a second `--` that ends them.
inline std::vector<OptionSpec> dpdk_options() {
  using namespace config_detail;
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

// Every option of gradswitchd, in --help order.
inline const std::vector<OptionSpec>& switch_options() {
  using namespace config_detail;
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
                    &SwitchConfig::metrics_host, false, config_detail::valid_ipv4),
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

// 127.0.0.0/8: reachable from this machine only.
inline bool is_loopback_ipv4(const std::string& s) {
  in_addr a;
  return inet_pton(AF_INET, s.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

// Checks that involve several options; "" when the config is usable.
inline std::string validate_config(const SwitchConfig& c) {
  // Redis' protected mode: a switch others can reach does not serve them anonymously by accident.
  if (!is_loopback_ipv4(c.control_host) && c.auth_file.empty() && !c.insecure)
    return "--control-host " + c.control_host +
           " can be reached from other machines: give --auth-file FILE (tenants and their secrets, "
           "docs/security.md), or --insecure to let anyone who reaches it join, read and abort any job";
  // With an auth file /metrics needs a bearer token (docs/observability.md); without one it answers
  // anyone, which is loopback's trust and nobody else's.
  if (c.metrics_port != 0 && !is_loopback_ipv4(c.metrics_host) && c.auth_file.empty() && !c.insecure)
    return "--metrics-host " + c.metrics_host +
           " can be reached from other machines, and without --auth-file /metrics shows every job to "
           "anyone: give --auth-file FILE (scrapes then need a bearer token, docs/observability.md), keep "
           "it on loopback, or give --insecure";
  if (c.backend != "dpdk") {
    const SwitchConfig defaults;
    for (const OptionSpec& o : switch_options())
      if (std::string(o.group) == "dpdk" && o.get(c) != o.get(defaults))
        return std::string("--") + o.name + " is an option of the DPDK backend: add --backend dpdk";
  }
  if (!c.uplink.empty() && c.backend != "udp")
    return "--uplink needs --backend udp (the DPDK backend has no uplink)";
  if (!c.uplink.empty() && c.threads != 1)
    return "--uplink needs --threads 1 (the spine answers a leaf on one UDP port)";
  if (c.data_port + c.threads - 1 > 65535)
    return "--data-port " + std::to_string(c.data_port) + " with --threads " + std::to_string(c.threads) +
           " needs UDP ports beyond 65535";
  if (c.metrics_port != 0 && c.metrics_port == c.control_port)
    return "--metrics-port " + std::to_string(c.metrics_port) + " is the control port: choose another one";
  if (c.control_port >= c.data_port && c.control_port < c.data_port + c.threads)
    return "--control-port " + std::to_string(c.control_port) + " overlaps the data ports " +
           std::to_string(c.data_port) + "-" + std::to_string(c.data_port + c.threads - 1) +
           " (TCP and UDP could share it, but that is almost always a mistake)";
  return "";
}

}  // namespace gradswitch
