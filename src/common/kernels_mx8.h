// The mx8 wire type's kernels (docs/protocol.md 2.2): blocks of 32 FP8 E4M3 elements behind one
// E8M0 scale byte. The scalar reference is here; the Kernels table (kernels.h) holds each variant's
// payload kernels, the SIMD ones built on mx8_encode / mx8_decode below. Every function is exact up
// to the one rounding the spec defines, and every variant gives the reference's bits.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gradswitch/wire.h"

namespace gradswitch {

// The nearest E4M3 byte to `v` (an exact, already scaled value), ties to even, |v| > 448
// saturating to +-448 (0x7E/0xFE), infinities too; NaN gives 0x7F with v's sign.
uint8_t e4m3_from_f32(float v);
// The value of an E4M3 byte (0x7F and 0xFF are NaN).
float e4m3_to_f32(uint8_t b);

// The scalar reference: `count` fp32 values as an mx8 payload of gs_payload_bytes(GS_ELEM_MX8,
// count) bytes; a payload of `count` elements widened to fp32, written (to_) or added (add_) into dst.
void f32_to_mx8_scalar(uint8_t* payload, const float* src, size_t count);
void mx8_to_f32_scalar(float* dst, const uint8_t* payload, size_t count);
void add_mx8_to_f32_scalar(float* dst, const uint8_t* payload, size_t count);

// The block arithmetic every variant shares. `static`: each file compiled for its own ISA keeps its
// own copy (an inline function's one out-of-line copy could come from a file of a wider ISA).

// The scale byte of a finite block whose largest |x| has the bit pattern `amax` (below 0x7F800000):
// X = max(floor(log2 amax) - 8, -127) from the exponent field, s = X + 127 (subnormal and zero
// maxima clamp to 0).
static inline uint8_t mx8_scale_byte(uint32_t amax) {
  const uint32_t biased = amax >> 23;
  return static_cast<uint8_t>(biased > 8 ? biased - 8 : 0);
}
// 2^-X for a block's scale byte s < 0xFF: the factor that puts its elements on E4M3's grid. A normal
// binary32 (-X is at least -119 for a finite block).
static inline float mx8_inverse_scale(uint8_t s) {
  return std::bit_cast<float>(static_cast<uint32_t>(254 - s) << 23);
}
// 2^(s - 127), or NaN for 0xFF: every element of that block is NaN. 2^-127 is subnormal.
static inline float mx8_scale(uint8_t s) {
  if (s == GS_MX8_SCALE_NAN) return NAN;
  return std::bit_cast<float>(s == 0 ? 0x00400000u : uint32_t{s} << 23);
}

// A SIMD variant's payload kernels (its Kernels entries) over its whole-block kernels B, a type of
// that variant's file, so that each instantiation is that file's alone: B::amax(x), the largest |x_i|
// of 32 as bits (NaN and infinity order above every finite value); B::elements(x, inv, out), the 32
// element bytes of x scaled by inv; B::decode<kAdd>(dst, q, scale), 32 element bytes widened and
// scaled into dst. A payload's partial last block goes to the scalar reference.
template <class B>
struct Mx8Payload {
  static void encode(uint8_t* payload, const float* src, size_t count) {
    size_t first = 0;
    for (; count - first >= GS_MX8_BLOCK; first += GS_MX8_BLOCK, payload += GS_MX8_BLOCK_BYTES) {
      const uint32_t amax = B::amax(src + first);
      if (amax >= 0x7F800000u) {  // NaN or infinite: the whole block is NaN (step 1)
        payload[0] = GS_MX8_SCALE_NAN;
        std::memset(payload + 1, 0x7F, GS_MX8_BLOCK);
        continue;
      }
      payload[0] = mx8_scale_byte(amax);
      B::elements(src + first, mx8_inverse_scale(payload[0]), payload + 1);
    }
    if (first < count) f32_to_mx8_scalar(payload, src + first, count - first);
  }
  static void decode(float* dst, const uint8_t* payload, size_t count) { widen<false>(dst, payload, count); }
  static void add(float* dst, const uint8_t* payload, size_t count) { widen<true>(dst, payload, count); }

 private:
  template <bool kAdd>
  static void widen(float* dst, const uint8_t* payload, size_t count) {
    size_t first = 0;
    for (; count - first >= GS_MX8_BLOCK; first += GS_MX8_BLOCK, payload += GS_MX8_BLOCK_BYTES)
      B::template decode<kAdd>(dst + first, payload + 1, mx8_scale(payload[0]));
    if (first < count)
      (kAdd ? add_mx8_to_f32_scalar : mx8_to_f32_scalar)(dst + first, payload, count - first);
  }
};

}  // namespace gradswitch
