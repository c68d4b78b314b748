// Prometheus text format writer (see exposition.h).
#include "switch/metrics/exposition.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace gradswitch::metrics {

std::string escape_label_value(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char b[40];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(b, sizeof b, "%.0f", v);
    return b;
  }
  for (int digits = 1; digits <= 17; ++digits) {  // the shortest text that reads back as v: 2.5e-06
    std::snprintf(b, sizeof b, "%.*g", digits, v);
    if (std::strtod(b, nullptr) == v) break;
  }
  return b;
}

void Exposition::family(const std::string& name, Type type, const std::string& help) {
  name_ = name;
  static const char* const types[] = {"counter", "gauge", "histogram"};
  out_ += "# HELP " + name + " ";
  for (char c : help) out_ += c == '\n' ? ' ' : c;  // HELP is one line (backslashes are rare enough)
  out_ += "\n# TYPE " + name + " " + types[static_cast<int>(type)] + "\n";
}

void Exposition::line(const std::string& suffix, const Labels& labels, const std::string& value) {
  out_ += name_;
  out_ += suffix;
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i) out_ += ',';
      out_ += labels[i].first + "=\"" + escape_label_value(labels[i].second) + '"';
    }
    out_ += '}';
  }
  out_ += ' ';
  out_ += value;
  out_ += '\n';
}

void Exposition::sample(const Labels& labels, uint64_t value) {
  line("", labels, std::to_string(value));
}

void Exposition::sample(const Labels& labels, double value) {
  line("", labels, format_value(value));
}

void Exposition::histogram(const Labels& labels, const std::vector<double>& bounds,
                           const std::vector<uint64_t>& counts, double sum) {
  uint64_t cumulative = 0;
  Labels with_le = labels;
  with_le.emplace_back("le", "");
  for (size_t i = 0; i < bounds.size(); ++i) {
    cumulative += i < counts.size() ? counts[i] : 0;
    with_le.back().second = format_value(bounds[i]);
    line("_bucket", with_le, std::to_string(cumulative));
  }
  for (size_t i = bounds.size(); i < counts.size(); ++i) cumulative += counts[i];
  with_le.back().second = "+Inf";
  line("_bucket", with_le, std::to_string(cumulative));
  line("_sum", labels, format_value(sum));
  line("_count", labels, std::to_string(cumulative));
}

}  // namespace gradswitch::metrics
