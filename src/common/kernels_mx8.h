// The mx8 wire type's kernels (docs/protocol.md 2.2): blocks of 32 FP8 E4M3 elements behind one
// E8M0 scale byte. The scalar reference is here; the Kernels table (kernels.h) holds each variant's
// payload kernels, the SIMD ones built on Mx8Blocks / Mx8Payload below. Every function is exact up
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

// A SIMD variant's whole-block kernels over its 32-bit lanes L, a type of that variant's file (so that
// each instantiation is that file's alone, compiled for its ISA): the scalar reference's integer and
// binary32 operations (common/kernels_mx8.cpp explains the arithmetic) in the same order, lane-wise,
// so the same bits. L names the intrinsics: binary32 lanes V (kLanes of them), the same lanes as
// integers VI, lane masks M, and
//   bits(V) / floats(VI) reinterpret; splat(u32) and set1(float) broadcast; load / store of whole
//   vectors, add / mul on V; and_ / or_ / add32 / sub32 / min_u32 / max_u32 / shr(VI, n) / shl(VI, n) on VI;
//   lt(a, b) (for lanes below 2^31) and eq(a, b) give M; blend(m, a, b) takes b where m is set;
//   or_if(v, m, c) ORs c into the lanes where m is set; reduce_max_u32(VI);
//   load_bytes(q), kLanes element bytes sign-extended to VI; store_bytes(out, e), the low bytes of
//   32 / kLanes vectors e as 32 bytes in order.
template <class L>
struct Mx8Blocks {
  using VI = typename L::VI;
  using VF = typename L::V;
  static constexpr size_t kVectors = GS_MX8_BLOCK / L::kLanes;

  // The largest |x_i| of 32 as bits (NaN and infinity order above every finite value).
  static uint32_t amax(const float* x) {
    VI m = abs_bits(x);
    for (size_t i = 1; i < kVectors; ++i) m = L::max_u32(m, abs_bits(x + L::kLanes * i));
    return L::reduce_max_u32(m);
  }
  // The 32 element bytes of x scaled by inv.
  static void elements(const float* x, float inv, uint8_t* out) {
    const VF s = L::set1(inv);
    VI e[kVectors];
    for (size_t i = 0; i < kVectors; ++i) e[i] = e4m3(L::mul(L::load(x + L::kLanes * i), s));
    L::store_bytes(out, e);
  }
  // 32 element bytes widened and scaled into dst (written, or with kAdd added).
  template <bool kAdd>
  static void decode(float* dst, const uint8_t* q, float scale) {
    const VF s = L::set1(scale);
    for (size_t h = 0; h < GS_MX8_BLOCK; h += L::kLanes) {
      VF v = widen(q + h, s);
      if (kAdd) v = L::add(L::load(dst + h), v);
      L::store(dst + h, v);
    }
  }

 private:
  static VI abs_bits(const float* x) { return L::and_(L::bits(L::load(x)), L::splat(0x7FFFFFFF)); }
  // kLanes scaled values' E4M3 bytes, one per 32-bit lane: normal ones rounded on the bit pattern,
  // subnormal ones by the FPU's addition of 2^14, the sign OR-ed in.
  static VI e4m3(VF v) {
    const VI x = L::bits(v), u = L::and_(x, L::splat(0x7FFFFFFF));
    const VI lsb = L::and_(L::shr(u, 20), L::splat(1));
    const VI r = L::add32(L::add32(u, L::splat(0x7FFFF)), lsb);
    const VI normal = L::min_u32(L::sub32(L::shr(r, 20), L::splat(120 << 3)), L::splat(0x7E));
    const VI sub = L::sub32(L::bits(L::add(L::floats(u), L::set1(16384.0f))),
                            L::splat(0x46800000));  // 16384.0f's bits
    const VI sign = L::and_(L::shr(x, 24), L::splat(0x80));
    return L::or_(L::blend(L::lt(u, L::splat(0x3C800000)), normal, sub), sign);
  }
  // kLanes element bytes: shifted 20 left, bit 31 is the sign and bits 20-26 are E and M.
  static VF widen(const uint8_t* q, VF scale) {
    const VI b = L::load_bytes(q);
    const VI m = L::and_(L::shl(b, 20), L::splat(0x87F00000));
    const VF mag = L::mul(L::floats(m), L::floats(L::splat((127u + 120u) << 23)));
    const VI nan = L::splat(0x7F);
    return L::floats(
        L::or_if(L::bits(L::mul(mag, scale)), L::eq(L::and_(b, nan), nan), L::splat(0x7FC00000)));
  }
};

// A SIMD variant's payload kernels (its Kernels entries) over its whole-block kernels B
// (Mx8Blocks<its lanes>): B::amax, B::elements and B::decode<kAdd> above. A payload's partial last
// block goes to the scalar reference.
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
