// libFuzzer target over the control plane's text parsing: the line framer and every verb's
// argument parser (JOIN with types=, LEAVE with lost=, AUTH, ABORT ...). Checks: no crash, no sanitizer
// report, framed lines respect the length limit, and every error formats as a single "ERR <code> <message>"
// line.
#include <cstdint>
#include <string>

#include "switch/control/parse.h"

using namespace gradswitch::control;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  LineFramer framer;
  // Feed in two pieces so partial lines are exercised.
  size_t split = size ? data[0] % (size + 1) : 0;
  framer.append(reinterpret_cast<const char*>(data), split);
  framer.append(reinterpret_cast<const char*>(data) + split, size - split);
  std::string line;
  for (;;) {
    LineFramer::Next n = framer.next(&line);
    if (n != LineFramer::Next::kLine) break;
    if (line.size() >= kMaxLineBytes) __builtin_trap();
    Error err;
    auto req = parse_request(line, &err);
    if (!req) {
      std::string formatted = format_error(err);
      if (formatted.rfind("ERR ", 0) != 0 || formatted.find('\n') != formatted.size() - 1) __builtin_trap();
      continue;
    }
    Error e2;
    (void)parse_join(*req, &e2);
    (void)parse_status(*req, &e2);
    (void)parse_stats(*req, &e2);
    (void)parse_no_args(*req, &e2);
    if (auto l = parse_leave(*req, &e2); l && l->lost.find_first_of(" \n\r=") != std::string::npos)
      __builtin_trap();  // lost= is written back verbatim into STATUS and EVENT lines
    (void)parse_auth(*req, &e2);
    (void)parse_abort(*req, &e2);
    if (auto j = parse_join(*req, &e2); j && (j->types & ~uint32_t{0x7E})) __builtin_trap();
    std::string formatted = format_error(e2);
    if (formatted.find('\n') != formatted.size() - 1) __builtin_trap();
  }
  return 0;
}
