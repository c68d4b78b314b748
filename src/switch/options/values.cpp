// The option value parsers (values.h).
#include "switch/options/values.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace gradswitch::option_values {

// Strict unsigned decimal in [lo, hi].
bool parse_uint(const std::string& s, uint64_t lo, uint64_t hi, uint64_t* out, std::string* err) {
  if (s.empty() || s.size() > 20 || s.find_first_not_of("0123456789") != std::string::npos) {
    *err = "expected an unsigned integer, got '" + s + "'";
    return false;
  }
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
  if (errno == ERANGE || v < lo || v > hi) {
    *err = "'" + s + "' is out of range " + std::to_string(lo) + ".." + std::to_string(hi);
    return false;
  }
  *out = v;
  return true;
}

// Unsigned with an optional K/M/G suffix (binary units), for --max-memory.
bool parse_bytes(const std::string& s, uint64_t* out, std::string* err) {
  std::string digits = s;
  uint64_t mult = 1;
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'K':
      case 'k':
        mult = 1ull << 10;
        digits.pop_back();
        break;
      case 'M':
      case 'm':
        mult = 1ull << 20;
        digits.pop_back();
        break;
      case 'G':
      case 'g':
        mult = 1ull << 30;
        digits.pop_back();
        break;
      default:
        break;
    }
  }
  uint64_t v;
  if (!parse_uint(digits, 1, (1ull << 50) / mult, &v, err)) {
    *err = "expected a byte count like 1073741824, 512M or 4G, got '" + s + "'";
    return false;
  }
  *out = v * mult;
  return true;
}

bool valid_ipv4(const std::string& s, std::string* err) {
  in_addr a;
  if (inet_pton(AF_INET, s.c_str(), &a) == 1) return true;
  *err = "expected an IPv4 address like 10.0.0.100, got '" + s + "'";
  return false;
}

// "IPv4:PORT" with a port in 1..65535.
bool parse_ipv4_port(const std::string& s, uint32_t* ip_be, uint16_t* port, std::string* err) {
  const size_t colon = s.rfind(':');
  in_addr a;
  uint64_t p = 0;
  std::string why;
  if (colon == std::string::npos || inet_pton(AF_INET, s.substr(0, colon).c_str(), &a) != 1 ||
      !parse_uint(s.substr(colon + 1), 1, 65535, &p, &why)) {
    *err = "expected IPv4:PORT like 10.0.0.3:9911, got '" + s + "'";
    return false;
  }
  *ip_be = a.s_addr;
  *port = static_cast<uint16_t>(p);
  return true;
}
bool valid_ipv4_port(const std::string& s, std::string* err) {
  uint32_t ip;
  uint16_t port;
  return parse_ipv4_port(s, &ip, &port, err);
}

// A MAC address as six hex pairs separated by ':' or '-'.
bool parse_mac(const std::string& s, uint8_t out[6], std::string* err) {
  unsigned b[6];
  char sep[5];
  int used = 0;
  if (s.size() == 17 &&
      std::sscanf(s.c_str(), "%2x%c%2x%c%2x%c%2x%c%2x%c%2x%n", &b[0], &sep[0], &b[1], &sep[1], &b[2], &sep[2],
                  &b[3], &sep[3], &b[4], &sep[4], &b[5], &used) == 11 &&
      used == 17 && s.find_first_not_of("0123456789abcdefABCDEF:-") == std::string::npos) {
    for (int i = 0; i < 6; ++i) out[i] = static_cast<uint8_t>(b[i]);
    return true;
  }
  *err = "expected a MAC address like 02:00:00:00:00:01, got '" + s + "'";
  return false;
}
bool valid_mac(const std::string& s, std::string* err) {
  uint8_t m[6];
  return parse_mac(s, m, err);
}

// 127.0.0.0/8: reachable from this machine only.
bool is_loopback_ipv4(const std::string& s) {
  in_addr a;
  return inet_pton(AF_INET, s.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

}  // namespace gradswitch::option_values
