// libFuzzer target over the metrics endpoint's request handling (switch/metrics/http_server.h):
// any bytes as an HTTP request. Checks: no crash, no sanitizer report, every answer is a complete
// HTTP/1.1 response whose Content-Length matches its body, only GET /metrics is a scrape, and a
// refused scrape (no or a wrong bearer token) carries no metric.
#include <cstdint>
#include <optional>
#include <string>

#include "switch/metrics/http_server.h"

using namespace gradswitch::metrics;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string request(reinterpret_cast<const char*>(data), size);
  HttpReply r = answer_http(request, [](const std::string& bearer) -> std::optional<std::string> {
    if (bearer != "t0ken") return std::nullopt;
    return std::string("gradswitch_up 1\n");
  });
  if (r.bytes.rfind("HTTP/1.1 ", 0) != 0) __builtin_trap();
  const size_t end = r.bytes.find("\r\n\r\n");
  if (end == std::string::npos) __builtin_trap();
  const size_t cl = r.bytes.find("Content-Length: ");
  if (cl == std::string::npos || cl > end) __builtin_trap();
  const size_t length = std::stoul(r.bytes.substr(cl + 16));
  const size_t body = r.bytes.size() - end - 4;
  const bool head = request.rfind("HEAD ", 0) == 0;
  if (body != length && !(head && body == 0)) __builtin_trap();  // HEAD: the headers of a GET
  if (r.scrape && request.rfind("GET /metrics", 0) != 0) __builtin_trap();
  if (r.refused && (r.scrape || r.bytes.find("gradswitch_up") != std::string::npos)) __builtin_trap();
  return 0;
}
