// The worker's log (see log.h).
#include "worker/log.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gradswitch::worker {

namespace {

LogLevel read_level() {
  const char* v = std::getenv("GRADSWITCH_LOG");
  if (!v || !*v) return LogLevel::kWarn;
  const char* names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; ++i)
    if (strcasecmp(v, names[i]) == 0) return static_cast<LogLevel>(i);
  if (strcasecmp(v, "warning") == 0) return LogLevel::kWarn;
  if (strcasecmp(v, "trace") == 0) return LogLevel::kDebug;
  std::fprintf(stderr,
               "gradswitch warn: GRADSWITCH_LOG=%s is not one of error, warn, info, debug; using warn\n", v);
  return LogLevel::kWarn;
}

}  // namespace

LogLevel log_level() {
  static const LogLevel level = read_level();
  return level;
}

void log_line(LogLevel level, unsigned rank, const std::string& message) {
  if (!log_enabled(level)) return;
  static const std::string where = [] {
    char host[256] = "";
    ::gethostname(host, sizeof host - 1);
    return std::string(host) + ":" + std::to_string(::getpid());
  }();
  static const char* const names[] = {"error", "warn", "info", "debug"};
  const std::string prefix = "gradswitch: ";
  const char* text =
      message.compare(0, prefix.size(), prefix) == 0 ? message.c_str() + prefix.size() : message.c_str();
  // One write per line: lines of threads and processes that share stderr do not mix.
  std::string line = std::string("gradswitch ") + names[static_cast<int>(level)] + " [" + where + " rank " +
                     std::to_string(rank) + "] " + text + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace gradswitch::worker
