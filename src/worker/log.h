// The worker's log on stderr, its level chosen by GRADSWITCH_LOG=error|warn|info|debug (default
// warn), as NCCL_DEBUG chooses NCCL's: info tells what a group joined and how it ended, debug adds
// a line per operation. Lines read "gradswitch <level> [<host>:<pid> rank <r>] <message>", so that
// the logs of many ranks can be interleaved and still be told apart.
#pragma once

#include <string>

namespace gradswitch::worker {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// The level from GRADSWITCH_LOG, read once (an unknown value is reported on stderr and means warn).
LogLevel log_level();
inline bool log_enabled(LogLevel l) {
  return static_cast<int>(l) <= static_cast<int>(log_level());
}
// One line (the message without a trailing newline; a leading "gradswitch: " is dropped).
void log_line(LogLevel level, unsigned rank, const std::string& message);

}  // namespace gradswitch::worker
