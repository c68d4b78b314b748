// Internet checksums (RFC 1071) of the frames the DPDK switch builds: the IPv4 header, and UDP with
// its pseudo header. A result goes to every rank of a job with the same payload, so the payload's
// sum is taken once and each frame adds only its headers.
//
// The one's-complement sum does not depend on byte order (RFC 1071 §2(B)): words are added as this
// little-endian host loads them, and the folded, complemented sum is stored the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace gradswitch::dpdk {

// The unfolded sum of `len` bytes at `data`, added to `sum`. 32-bit words into 64-bit accumulators
// (they cannot overflow within a frame); four of them, so that the adds do not wait on each other:
// a result's payload is summed once per result, on the packet path.
inline uint64_t checksum_add(uint64_t sum, const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t i = 0;
  uint64_t a = 0, b = 0, c = 0;
  for (; i + 16 <= len; i += 16) {
    uint32_t w[4];
    std::memcpy(w, p + i, 16);
    sum += w[0];
    a += w[1];
    b += w[2];
    c += w[3];
  }
  sum += a + b + c;
  for (; i + 4 <= len; i += 4) {
    uint32_t w;
    std::memcpy(&w, p + i, 4);
    sum += w;
  }
  if (i + 2 <= len) {
    uint16_t w;
    std::memcpy(&w, p + i, 2);
    sum += w;
    i += 2;
  }
  if (i < len) sum += p[i];  // the odd byte is the high-order byte of a word padded with zero
  return sum;
}

// Folds an unfolded sum to 16 bits (end-around carries).
inline uint16_t checksum_fold(uint64_t sum) {
  sum = (sum & 0xFFFFFFFFu) + (sum >> 32);
  sum = (sum & 0xFFFFFFFFu) + (sum >> 32);
  sum = (sum & 0xFFFFu) + (sum >> 16);
  sum = (sum & 0xFFFFu) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

// The value for a checksum field whose header (checksum field zero) sums to `sum`.
inline uint16_t checksum_finish(uint64_t sum) {
  return static_cast<uint16_t>(~checksum_fold(sum));
}

}  // namespace gradswitch::dpdk
