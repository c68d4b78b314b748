// SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104): the control plane's challenge-response
// authentication (docs/protocol.md section 1.5, docs/security.md). Used by the switch and the
// worker; small and dependency-free (the project links no crypto library). Not for bulk data.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gradswitch {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t len);
  void update(std::string_view s) { update(s.data(), s.size()); }
  Digest finish();  // the object is spent afterwards

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

Digest sha256(std::string_view data);
Digest hmac_sha256(std::string_view key, std::string_view message);

// Lower-case hexadecimal.
std::string to_hex(const uint8_t* data, size_t len);
inline std::string to_hex(const Digest& d) {
  return to_hex(d.data(), d.size());
}
// Compares without an early exit, so that the time taken does not tell how much of a guess was right.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace gradswitch
