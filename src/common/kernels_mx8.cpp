// mx8 encoding and decoding, the scalar reference (see kernels_mx8.h; the rounding is docs/protocol.md
// 2.2's), written without branches per element so that the compiler vectorizes it for the baseline ISA.
#include "common/kernels_mx8.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace gradswitch {

namespace {

// std::bit_cast, not memcpy: GCC vectorizes the loops below only through bit_cast.
uint32_t bits_of(float f) {
  return std::bit_cast<uint32_t>(f);
}
float float_of(uint32_t u) {
  return std::bit_cast<float>(u);
}

constexpr uint32_t kMinNormalE4M3 = 0x3C800000u;  // 2^-6 as binary32 bits
constexpr uint32_t kMaxCode = 0x7E;               // 448 = 1.75 * 2^8
constexpr uint32_t kAbsMask = 0x7FFFFFFFu, kInfBits = 0x7F800000u;

// The E4M3 byte of an exact, already scaled finite value (see e4m3_from_f32), without branches so
// that the loops below vectorize. Normal: round the 23 mantissa bits to 3, ties to even, and rebias
// the exponent (bits 20-30 hold exponent and 3 mantissa bits: E4M3's code plus 120 << 3), saturating
// at 0x7E. Subnormal (|v| < 2^-6): adding 2^14, whose ulp is 2^-9, rounds |v| to E4M3's subnormal
// step in the FPU's round-to-nearest-even; the ulps added are the code (8: the smallest normal, 0x08).
inline uint8_t e4m3_finite(float v) {
  const uint32_t bits = bits_of(v), u = bits & kAbsMask;
  const uint32_t r = u + 0x7FFFFu + ((u >> 20) & 1);
  const uint32_t rebiased = (r >> 20) - (120u << 3);
  const uint32_t normal = rebiased < kMaxCode ? rebiased : kMaxCode;
  const uint32_t subnormal = bits_of(float_of(u) + 16384.0f) - bits_of(16384.0f);
  const uint32_t is_sub = 0u - static_cast<uint32_t>(u < kMinNormalE4M3);  // all ones or zero: a select
  return static_cast<uint8_t>(((bits >> 24) & 0x80) | (subnormal & is_sub) | (normal & ~is_sub));
}

// A block's n element bytes, scaled by `inv`: a loop of its own, which vectorizes (not inside
// encode_block, whose scale byte store GCC would not move past the loop).
template <size_t kN>
void encode_elements(const float* __restrict x, size_t n, float inv, uint8_t* __restrict out) {
  for (size_t i = 0; i < (kN ? kN : n); ++i) out[i] = e4m3_finite(x[i] * inv);
}
void encode_elements(const float* __restrict x, size_t n, float inv, uint8_t* __restrict out) {
  if (n == GS_MX8_BLOCK)
    encode_elements<GS_MX8_BLOCK>(x, n, inv, out);
  else
    encode_elements<0>(x, n, inv, out);
}

// One block of n <= 32 values: its scale byte, then n element bytes.
inline void encode_block(const float* __restrict x, size_t n, uint8_t* __restrict out) {
  uint32_t amax = 0;  // as bits: the largest |x| orders like its bit pattern, NaN and inf on top
  for (size_t i = 0; i < n; ++i) amax = std::max(amax, bits_of(x[i]) & kAbsMask);
  if (amax >= kInfBits) {  // NaN or infinite: the whole block is NaN
    out[0] = GS_MX8_SCALE_NAN;
    std::memset(out + 1, 0x7F, n);
    return;
  }
  // The scale exponent leaves the block's largest element in E4M3's top binade [2^8, 2^9). Each
  // product with its inverse is exact until it falls below 2^-126, far under E4M3's smallest
  // half-step (2^-10): its byte is +-0 either way.
  out[0] = mx8_scale_byte(amax);
  encode_elements(x, n, mx8_inverse_scale(out[0]), out + 1);
}

// An E4M3 byte's magnitude bits moved to binary32's exponent and mantissa fields read as
// 2^(E-127) (1 + M/8), or M 2^-129 for E = 0 (a binary32 subnormal): times 2^120, exactly E4M3's
// value. 0x7F (NaN) is picked out. The block's scale then multiplies once more (exact, §2.2).
template <bool kAdd>
inline void decode_block(float* __restrict dst, const uint8_t* __restrict q, size_t n, float scale) {
  const float k2p120 = float_of((127u + 120u) << 23);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = q[i];
    const float mag = float_of((b & 0x80u) << 24 | (b & 0x7Fu) << 20) * k2p120;
    const uint32_t nan = 0u - static_cast<uint32_t>((b & 0x7Fu) == 0x7Fu);  // a quiet NaN's bits OR-ed in
    const float v = float_of(bits_of(mag * scale) | (nan & 0x7FC00000u));
    if (kAdd)
      dst[i] += v;
    else
      dst[i] = v;
  }
}

template <bool kAdd>
void decode(float* dst, const uint8_t* payload, size_t count) {
  for (size_t first = 0; first < count; first += GS_MX8_BLOCK, payload += GS_MX8_BLOCK_BYTES) {
    const float scale = mx8_scale(payload[0]);
    if (count - first >= GS_MX8_BLOCK)  // a full block: a loop of known length, which vectorizes
      decode_block<kAdd>(dst + first, payload + 1, GS_MX8_BLOCK, scale);
    else
      decode_block<kAdd>(dst + first, payload + 1, count - first, scale);
  }
}

}  // namespace

uint8_t e4m3_from_f32(float v) {
  const uint32_t u = bits_of(v) & kAbsMask;
  if (u > kInfBits) return static_cast<uint8_t>(((bits_of(v) >> 24) & 0x80) | 0x7F);
  if (u == kInfBits) return static_cast<uint8_t>(((bits_of(v) >> 24) & 0x80) | kMaxCode);
  return e4m3_finite(v);
}

float e4m3_to_f32(uint8_t b) {
  float v;
  decode_block<false>(&v, &b, 1, 1.0f);
  return v;
}

void f32_to_mx8_scalar(uint8_t* payload, const float* src, size_t count) {
  for (size_t first = 0; first < count; first += GS_MX8_BLOCK, payload += GS_MX8_BLOCK_BYTES)
    if (count - first >= GS_MX8_BLOCK)  // as in decode
      encode_block(src + first, GS_MX8_BLOCK, payload);
    else
      encode_block(src + first, count - first, payload);
}

void mx8_to_f32_scalar(float* dst, const uint8_t* payload, size_t count) {
  decode<false>(dst, payload, count);
}

void add_mx8_to_f32_scalar(float* dst, const uint8_t* payload, size_t count) {
  decode<true>(dst, payload, count);
}

}  // namespace gradswitch
