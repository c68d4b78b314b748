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

// The unfolded sum of `len` bytes at `data`, added to `sum`. 32-bit loads into a 64-bit accumulator
// (a carry every 2^32 words at worst, far beyond a frame) let the compiler vectorise the loop.
inline uint64_t checksum_add(uint64_t sum, const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t i = 0;
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
