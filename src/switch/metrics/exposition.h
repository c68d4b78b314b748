// Writes metrics in Prometheus' text exposition format (version 0.0.4, what `GET /metrics` returns):
// one family at a time, `# HELP` and `# TYPE` lines, then its samples with their labels. The names
// follow prometheus.io's conventions, which the callers choose: one prefix (gradswitch_), base units
// in the name (_bytes, _seconds), counters ending in _total.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gradswitch::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Exposition {
 public:
  enum class Type { kCounter, kGauge, kHistogram };

  // Starts a family; `name` is the full metric name (a counter's with _total).
  void family(const std::string& name, Type type, const std::string& help);
  void sample(const Labels& labels, uint64_t value);
  void sample(const Labels& labels, double value);
  // A histogram sample of the current family: `counts[i]` observations in bucket i (not cumulative;
  // the last entry counts those above the largest bound), `bounds` in the family's unit.
  void histogram(const Labels& labels, const std::vector<double>& bounds, const std::vector<uint64_t>& counts,
                 double sum);

  const std::string& text() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void line(const std::string& suffix, const Labels& labels, const std::string& value);

  std::string out_;
  std::string name_;
};

// `v` as a label value: backslash, double quote and newline escaped.
std::string escape_label_value(const std::string& v);
// A number as Prometheus writes it (integers without exponent, +Inf/-Inf/NaN by name).
std::string format_value(double v);

}  // namespace gradswitch::metrics
