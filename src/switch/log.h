// The daemon's log on stderr, one line per message: `--log-level` filters it, `--log-format`
// chooses text ("gradswitchd info: job 'x' started ...") or JSON, one object per line for log
// shippers (Loki, Elasticsearch, journald's JSON import):
//   {"time":"2026-11-23T14:20:00.123456Z","level":"info","logger":"gradswitchd","pid":4242,"msg":"..."}
// Lines are written with one call each, so lines of different threads never mix.
#pragma once

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <string>

#include "common/json.h"

namespace gradswitch {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

inline std::atomic<int>& log_level_ref() {
  static std::atomic<int> level{static_cast<int>(LogLevel::kInfo)};
  return level;
}
inline std::atomic<bool>& log_json_ref() {
  static std::atomic<bool> json{false};
  return json;
}
inline void set_log_level(const std::string& name) {
  int l = name == "error" ? 0 : name == "warn" ? 1 : name == "debug" ? 3 : 2;
  log_level_ref().store(l, std::memory_order_relaxed);
}
inline void set_log_format(const std::string& name) {
  log_json_ref().store(name == "json", std::memory_order_relaxed);
}
inline bool log_enabled(LogLevel l) {
  return static_cast<int>(l) <= log_level_ref().load(std::memory_order_relaxed);
}

// Writes one message: in text format `text_prefix` + message, in JSON the message alone.
inline void log_write(LogLevel l, const char* text_prefix, const std::string& message) {
  static const char* const names[] = {"error", "warn", "info", "debug"};
  std::string line;
  if (log_json_ref().load(std::memory_order_relaxed)) {
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    tm utc;
    gmtime_r(&ts.tv_sec, &utc);
    char when[48];
    const size_t n = std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &utc);
    std::snprintf(when + n, sizeof when - n, ".%06ldZ", ts.tv_nsec / 1000);
    line = std::string("{\"time\":\"") + when + "\",\"level\":\"" + names[static_cast<int>(l)] +
           "\",\"logger\":\"gradswitchd\",\"pid\":" + std::to_string(::getpid()) + ",\"msg\":\"" +
           json_escape(message) + "\"}\n";
  } else {
    line = text_prefix + message + "\n";
  }
  std::fwrite(line.data(), 1, line.size(), stderr);
}

__attribute__((format(printf, 2, 3))) inline void log_msg(LogLevel l, const char* fmt, ...) {
  if (!log_enabled(l)) return;
  static const char* const prefixes[] = {
      "gradswitchd error: ", "gradswitchd warn: ", "gradswitchd info: ", "gradswitchd debug: "};
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  log_write(l, prefixes[static_cast<int>(l)], text);
}
// A line printed whatever --log-level says, whose text form carries its own prefix: the start-up and
// shutdown summaries ("gradswitchd 0.1.0: control ...") and start-up failures.
__attribute__((format(printf, 2, 3))) inline void log_plain(LogLevel l, const char* fmt, ...) {
  char text[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  log_write(l, "", text);
}

#define GS_LOG_ERROR(...) ::gradswitch::log_msg(::gradswitch::LogLevel::kError, __VA_ARGS__)
#define GS_LOG_WARN(...) ::gradswitch::log_msg(::gradswitch::LogLevel::kWarn, __VA_ARGS__)
#define GS_LOG_INFO(...) ::gradswitch::log_msg(::gradswitch::LogLevel::kInfo, __VA_ARGS__)
#define GS_LOG_DEBUG(...) ::gradswitch::log_msg(::gradswitch::LogLevel::kDebug, __VA_ARGS__)

}  // namespace gradswitch
