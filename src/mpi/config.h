// Settings of the MPI interposition library, read once from the environment at MPI_Init
// (docs/mpi.md lists every variable with its default).
#pragma once

#include <cstddef>
#include <string>

namespace gradswitch::mpi {

// How MPI_FLOAT / MPI_DOUBLE buffers travel: as their own type (native), or all as one wire type.
enum class FloatWire { kNative, kFloat32, kFixed32, kFloat64 };

// Below this many bytes a reduction goes to MPI (PMPI): its latency wins there, where every reduction
// through the switch still ends with a small MPI agreement (BENCHMARKS.md §8, small messages).
// GRADSWITCH_MPI_MIN_BYTES overrides it.
inline constexpr size_t kDefaultMinBytes = 256 * 1024;
// An operation that makes no progress for this long falls back to MPI (GRADSWITCH_MPI_TIMEOUT).
inline constexpr double kDefaultTimeoutS = 60.0;

struct Config {
  std::string switch_addr;  // GRADSWITCH_SWITCH, host:port of the switch's control plane
  FloatWire wire = FloatWire::kNative;
  size_t min_bytes = kDefaultMinBytes;
  bool strict = false;  // GRADSWITCH_MPI_STRICT=1: errors instead of falling back to MPI
  double timeout_s = kDefaultTimeoutS;
  std::string stats;     // GRADSWITCH_MPI_STATS: "" (off), "1" (a line on stderr) or a file prefix
  bool verbose = false;  // GRADSWITCH_MPI_VERBOSE=1: one line per switch job created
  // Empty when the settings are usable; otherwise what is wrong (the library then stays out of the way).
  std::string problem;
};

// Reads the environment; never throws. A malformed value sets `problem` naming the variable,
// the value and what is accepted.
Config config_from_env();

const char* float_wire_name(FloatWire w);

}  // namespace gradswitch::mpi
