// The interface between the daemon and an I/O backend (one folder per backend under io/), and the
// shape of a backend's counters: named, typed values that the STATS reply and a metrics exporter
// read the same way, whatever the backend.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace gradswitch {

class Engine;

// One value a backend reports. Shaped for Prometheus: `name` is lower_snake_case with its base unit
// (`_bytes`, `_ns`), without the backend prefix and without `_total`; a counter only grows (it
// restarts at 0 with the process), a gauge goes up and down. `label` names an optional, bounded
// dimension (a port, a data thread, an lcore: a handful of values fixed at start-up); the same
// name with different label values is one metric family.
struct BackendStat {
  enum class Kind : uint8_t { kCounter, kGauge };
  const char* name;
  const char* help;  // one sentence
  Kind kind = Kind::kCounter;
  uint64_t value = 0;
  const char* label = nullptr;  // e.g. "port"; nullptr = no label
  unsigned label_value = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // "udp" or "dpdk": the prefix of the backend's counters.
  virtual const char* name() const = 0;
  // One line for the startup log: ports, threads, variant.
  virtual std::string describe() const = 0;
  // Runs the data path on the backend's own threads until `stop` becomes true; returns 0 on a
  // clean stop. Errors that prevent starting are reported by the factory, not here.
  virtual int run(const std::atomic<bool>& stop) = 0;
  // The backend's counters and gauges, callable from any thread at any time (before, during and
  // after run()); each value is a relaxed snapshot, so a set is not one instant.
  virtual std::vector<BackendStat> stats() const = 0;
};

// "udp.send_errors=0 udp.thread0.cpu_ns=123 ...": the backend's stats as the STATS reply's
// `key=value` pairs; a labelled value is `<backend>.<label><value>.<name>`.
inline std::string format_backend_stats(const Backend& backend) {
  std::string out;
  for (const BackendStat& s : backend.stats()) {
    if (!out.empty()) out += ' ';
    out += backend.name();
    out += '.';
    if (s.label) out += s.label + std::to_string(s.label_value) + '.';
    out += s.name;
    out += '=';
    out += std::to_string(s.value);
  }
  return out;
}

}  // namespace gradswitch
