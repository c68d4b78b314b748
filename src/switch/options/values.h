// The values of options and config entries: strict integers, byte counts, IPv4 addresses, ports and
// MACs, each with an error that says what was expected. The option table, the auth file and the
// backends read their values with these, so a value is spelled the same way everywhere.
#pragma once

#include <cstdint>
#include <string>

namespace gradswitch::option_values {

// Strict unsigned decimal in [lo, hi].
bool parse_uint(const std::string& s, uint64_t lo, uint64_t hi, uint64_t* out, std::string* err);
// Unsigned with an optional K/M/G suffix (binary units), for --max-memory.
bool parse_bytes(const std::string& s, uint64_t* out, std::string* err);
bool valid_ipv4(const std::string& s, std::string* err);
// "IPv4:PORT" with a port in 1..65535.
bool parse_ipv4_port(const std::string& s, uint32_t* ip_be, uint16_t* port, std::string* err);
bool valid_ipv4_port(const std::string& s, std::string* err);
// A MAC address as six hex pairs separated by ':' or '-'.
bool parse_mac(const std::string& s, uint8_t out[6], std::string* err);
bool valid_mac(const std::string& s, std::string* err);
// 127.0.0.0/8: reachable from this machine only.
bool is_loopback_ipv4(const std::string& s);

}  // namespace gradswitch::option_values
