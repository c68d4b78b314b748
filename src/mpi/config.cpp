// Environment variables of the MPI library (see config.h and docs/mpi.md).
#include "mpi/config.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

namespace gradswitch::mpi {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// "262144", "256K", "4M" (binary multiples); false when malformed or out of range.
bool parse_bytes(const std::string& s, size_t* out) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str() || errno || s[0] == '-') return false;
  std::string unit(end);
  unsigned shift = 0;
  if (unit == "K" || unit == "k" || unit == "KiB")
    shift = 10;
  else if (unit == "M" || unit == "MiB")
    shift = 20;
  else if (unit == "G" || unit == "GiB")
    shift = 30;
  else if (!unit.empty())
    return false;
  if (v > (~0ull >> shift)) return false;
  *out = static_cast<size_t>(v << shift);
  return true;
}

}  // namespace

const char* float_wire_name(FloatWire w) {
  switch (w) {
    case FloatWire::kNative:
      return "native";
    case FloatWire::kFloat32:
      return "float32";
    case FloatWire::kFixed32:
      return "fixed32";
    case FloatWire::kFloat64:
      return "float64";
  }
  return "?";
}

Config config_from_env() {
  Config c;
  auto bad = [&](const char* var, const std::string& value, const char* accepted) {
    if (c.problem.empty()) c.problem = std::string(var) + "='" + value + "' is not valid (" + accepted + ")";
  };
  if (const char* v = env("GRADSWITCH_SWITCH")) c.switch_addr = v;
  if (const char* v = env("GRADSWITCH_MPI_WIRE")) {
    std::string s = v;
    if (s == "native")
      c.wire = FloatWire::kNative;
    else if (s == "float32")
      c.wire = FloatWire::kFloat32;
    else if (s == "fixed32")
      c.wire = FloatWire::kFixed32;
    else if (s == "float64")
      c.wire = FloatWire::kFloat64;
    else
      bad("GRADSWITCH_MPI_WIRE", s, "native, float32, fixed32 or float64");
  }
  if (const char* v = env("GRADSWITCH_MPI_MIN_BYTES")) {
    if (!parse_bytes(v, &c.min_bytes)) bad("GRADSWITCH_MPI_MIN_BYTES", v, "bytes, e.g. 262144, 256K or 4M");
  }
  if (const char* v = env("GRADSWITCH_MPI_STRICT")) {
    std::string s = v;
    if (s == "1")
      c.strict = true;
    else if (s != "0")
      bad("GRADSWITCH_MPI_STRICT", s, "0 or 1");
  }
  if (const char* v = env("GRADSWITCH_MPI_TIMEOUT")) {
    char* end = nullptr;
    double t = std::strtod(v, &end);
    if (end == v || *end || !std::isfinite(t) || t <= 0 || t > 86400)
      bad("GRADSWITCH_MPI_TIMEOUT", v, "seconds, > 0");
    else
      c.timeout_s = t;
  }
  if (const char* v = env("GRADSWITCH_MPI_STATS")) c.stats = v;
  if (const char* v = env("GRADSWITCH_MPI_VERBOSE")) c.verbose = std::string(v) == "1";
  return c;
}

}  // namespace gradswitch::mpi
