// JSON string escaping shared by the switch's JSON log lines and the worker's timeline.
#pragma once

#include <cstdio>
#include <string>

namespace gradswitch {

// `s` as the inside of a JSON string: quotes, backslashes and control characters escaped.
inline std::string json_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace gradswitch
