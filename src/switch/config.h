// The daemon's configuration: every option, its default and its help text in one place.
//
// The defaults are the member initialisers of SwitchConfig; `switch_options()` describes each
// option once (name, argument, help, how to parse and how to print it), and main.cpp builds
// getopt_long's table and `--help` from it. Also here: the log level and the monotonic clock
// that the data threads and the control plane share (the engine's last_activity_ns is on it).
#pragma once

#include <arpa/inet.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "gradswitch/wire.h"

#ifndef GRADSWITCH_VERSION
#define GRADSWITCH_VERSION "0.1.0"
#endif

namespace gradswitch {

struct SwitchConfig {
  std::string control_host = "0.0.0.0";  // IPv4 address of the TCP control plane and UDP data ports
  uint16_t control_port = 7700;
  uint16_t data_port = 7701;  // data thread t listens on data_port + t
  unsigned threads = 1;       // data threads; slot s is served by thread s % threads
  unsigned slots = 256;       // slots per job = the workers' window
  unsigned mtu = 1500;        // IP MTU; payload = (mtu - 60) rounded down to 4 bytes
  unsigned max_jobs = 64;
  unsigned join_timeout_s = 60;      // all ranks must have joined within this
  unsigned idle_timeout_s = 600;     // a job without packets or requests this long is aborted
  double drop_rate = 0.0;            // injected loss of received data packets (tests)
  uint64_t seed = 1;                 // seed of the injected loss
  unsigned batch = 32;               // datagrams per recvmmsg/sendmmsg
  unsigned stats_interval_s = 0;     // periodic stats log line; 0 = off
  std::string log_level = "info";    // error | warn | info | debug
  std::string backend = "udp";       // udp | dpdk
  uint64_t max_memory = 1ull << 30;  // bytes of slot memory for all jobs together
  std::string udp_gso = "on";        // on | off: UDP_SEGMENT for results sent to one worker

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
  const char* metavar;  // shown in --help
  const char* help;
  std::function<bool(SwitchConfig&, const std::string&, std::string*)> set;
  std::function<std::string(const SwitchConfig&)> get;
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

template <typename T>
OptionSpec uint_option(const char* name, const char* metavar, const char* help, T SwitchConfig::*field,
                       uint64_t lo, uint64_t hi) {
  return {name, metavar, help,
          [=](SwitchConfig& c, const std::string& s, std::string* err) {
            uint64_t v;
            if (!parse_uint(s, lo, hi, &v, err)) return false;
            c.*field = static_cast<T>(v);
            return true;
          },
          [=](const SwitchConfig& c) { return std::to_string(c.*field); }};
}

inline OptionSpec choice_option(const char* name, const char* metavar, const char* help,
                                std::string SwitchConfig::*field,
                                std::initializer_list<const char*> choices) {
  std::vector<const char*> copy(choices);
  return {name, metavar, help,
          [=](SwitchConfig& c, const std::string& s, std::string* err) {
            for (const char* ch : copy)
              if (s == ch) return (c.*field = s), true;
            std::string list;
            for (const char* ch : copy) list += list.empty() ? ch : std::string("|") + ch;
            *err = "expected one of " + list + ", got '" + s + "'";
            return false;
          },
          [=](const SwitchConfig& c) { return c.*field; }};
}

}  // namespace config_detail

// Every option of gradswitchd, in --help order.
inline const std::vector<OptionSpec>& switch_options() {
  using namespace config_detail;
  static const std::vector<OptionSpec> options = {
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
      uint_option("slots", "N", "slots per job (the workers' window)", &SwitchConfig::slots, 1, 65535),
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
      uint_option("stats-interval", "SECONDS", "log a stats line this often (0 = never)",
                  &SwitchConfig::stats_interval_s, 0, 86400),
      choice_option("log-level", "LEVEL", "error|warn|info|debug", &SwitchConfig::log_level,
                    {"error", "warn", "info", "debug"}),
      choice_option("backend", "NAME", "data-plane I/O: udp (sockets) or dpdk (options after --)",
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
  };
  return options;
}

// Checks that involve several options; "" when the config is usable.
inline std::string validate_config(const SwitchConfig& c) {
  if (c.data_port + c.threads - 1 > 65535)
    return "--data-port " + std::to_string(c.data_port) + " with --threads " + std::to_string(c.threads) +
           " needs UDP ports beyond 65535";
  if (c.control_port >= c.data_port && c.control_port < c.data_port + c.threads)
    return "--control-port " + std::to_string(c.control_port) + " overlaps the data ports " +
           std::to_string(c.data_port) + "-" + std::to_string(c.data_port + c.threads - 1) +
           " (TCP and UDP could share it, but that is almost always a mistake)";
  return "";
}

// ---- logging (stderr, one line per call) ----
enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

inline std::atomic<int>& log_level_ref() {
  static std::atomic<int> level{static_cast<int>(LogLevel::kInfo)};
  return level;
}
inline void set_log_level(const std::string& name) {
  int l = name == "error" ? 0 : name == "warn" ? 1 : name == "debug" ? 3 : 2;
  log_level_ref().store(l, std::memory_order_relaxed);
}
inline bool log_enabled(LogLevel l) {
  return static_cast<int>(l) <= log_level_ref().load(std::memory_order_relaxed);
}

__attribute__((format(printf, 2, 3))) inline void log_msg(LogLevel l, const char* fmt, ...) {
  if (!log_enabled(l)) return;
  static const char* const names[] = {"error", "warn", "info", "debug"};
  char line[1024];
  int n = std::snprintf(line, sizeof line, "gradswitchd %s: ", names[static_cast<int>(l)]);
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line + n, sizeof line - n, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "%s\n", line);
}
#define GS_LOG_ERROR(...) ::gradswitch::log_msg(::gradswitch::LogLevel::kError, __VA_ARGS__)
#define GS_LOG_WARN(...) ::gradswitch::log_msg(::gradswitch::LogLevel::kWarn, __VA_ARGS__)
#define GS_LOG_INFO(...) ::gradswitch::log_msg(::gradswitch::LogLevel::kInfo, __VA_ARGS__)
#define GS_LOG_DEBUG(...) ::gradswitch::log_msg(::gradswitch::LogLevel::kDebug, __VA_ARGS__)

// CLOCK_MONOTONIC in nanoseconds: the clock of ingest()'s now_ns and JobStatus.last_activity_ns.
inline uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace gradswitch
