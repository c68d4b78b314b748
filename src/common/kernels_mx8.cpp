// mx8 encoding and decoding, scalar (see kernels_mx8.h; the rounding is docs/protocol.md 2.2's).
#include "common/kernels_mx8.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "gradswitch/wire.h"

namespace gradswitch {

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

constexpr uint32_t kMinNormalE4M3 = 0x3C800000u;  // 2^-6 as binary32 bits
constexpr uint32_t kMaxE4M3 = 0x43E00000u;        // 448 = 1.75 * 2^8

std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> t{};
  for (unsigned b = 0; b < 256; ++b) {
    const unsigned e = (b >> 3) & 15, m = b & 7;
    float v =
        e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + m / 8.0f, static_cast<int>(e) - 7);
    if ((b & 0x7F) == 0x7F) v = NAN;
    t[b] = (b & 0x80) ? -v : v;
  }
  return t;
}
const std::array<float, 256> kE4M3 = make_e4m3_table();

// One block of n <= 32 values: its scale byte, then n element bytes.
void encode_block(const float* x, size_t n, uint8_t* out) {
  float amax = 0;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (!(a <= 3.40282347e38f)) {  // NaN or infinite: the whole block is NaN
      out[0] = GS_MX8_SCALE_NAN;
      std::memset(out + 1, 0x7F, n);
      return;
    }
    amax = std::max(amax, a);
  }
  // floor(log2(amax)) from the exponent field (subnormals and zero clamp to -127 below anyway);
  // the scale exponent leaves the block's largest element in E4M3's top binade [2^8, 2^9).
  const int e = static_cast<int>(bits_of(amax) >> 23) - 127;
  const int x_exp = std::max(e - 8, -127);
  out[0] = static_cast<uint8_t>(x_exp + 127);
  // 2^-x_exp is a normal binary32 (x_exp <= 119 for finite input), so each product is exact until
  // it falls below 2^-126, far under E4M3's smallest half-quantum (2^-10): its byte is +-0 either way.
  const float inv = float_of(static_cast<uint32_t>(127 - x_exp) << 23);
  for (size_t i = 0; i < n; ++i) out[1 + i] = e4m3_from_f32(x[i] * inv);
}

template <bool kAdd>
void decode(float* dst, const uint8_t* payload, size_t count) {
  for (size_t first = 0; first < count; first += GS_MX8_BLOCK, payload += GS_MX8_BLOCK_BYTES) {
    const size_t n = std::min<size_t>(GS_MX8_BLOCK, count - first);
    const uint8_t s = payload[0];
    const float scale = s == GS_MX8_SCALE_NAN ? NAN : mx8_scale_value(s);
    for (size_t i = 0; i < n; ++i) {
      const float v = kE4M3[payload[1 + i]] * scale;
      if (kAdd)
        dst[first + i] += v;
      else
        dst[first + i] = v;
    }
  }
}

}  // namespace

uint8_t e4m3_from_f32(float v) {
  uint32_t u = bits_of(v);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80);
  u &= 0x7FFFFFFFu;
  if (u > 0x7F800000u) return sign | 0x7F;
  if (u < kMinNormalE4M3)  // subnormal E4M3: multiples of 2^-9; 8 * 2^-9 is the smallest normal, 0x08
    return sign | static_cast<uint8_t>(std::nearbyint(float_of(u) * 512.0f));
  u += 0x7FFFFu + ((u >> 20) & 1);  // round the 23 mantissa bits to 3, ties to even
  if (u >= kMaxE4M3) return sign | 0x7E;
  const unsigned e = (u >> 23) - 127 + 7;  // 1..15
  return sign | static_cast<uint8_t>(e << 3 | ((u >> 20) & 7));
}

float e4m3_to_f32(uint8_t b) {
  return kE4M3[b];
}

float mx8_scale_value(uint8_t s) {
  return s == 0 ? float_of(0x00400000u) : float_of(uint32_t{s} << 23);  // 2^-127 is subnormal
}

void f32_to_mx8(uint8_t* payload, const float* src, size_t count) {
  for (size_t first = 0; first < count; first += GS_MX8_BLOCK, payload += GS_MX8_BLOCK_BYTES)
    encode_block(src + first, std::min<size_t>(GS_MX8_BLOCK, count - first), payload);
}

void mx8_to_f32(float* dst, const uint8_t* payload, size_t count) {
  decode<false>(dst, payload, count);
}

void add_mx8_to_f32(float* dst, const uint8_t* payload, size_t count) {
  decode<true>(dst, payload, count);
}

}  // namespace gradswitch
