// AVX-512 variant (F, BW, VL + F16C). This file alone is compiled with those flags; kernels.cpp
// only calls into it after checking the CPU. Tails use masked loads/stores, so no scalar tail.
//
// Each kernel is written once over a lane type (F32x16, F64x8) or a 16-bit format (F16, BF16)
// that names the intrinsics; the templates inline to the same loops as hand-written per-type code.
#include <immintrin.h>

#include <limits>

#include "common/kernels.h"
#include "common/kernels_mx8.h"
#include "common/kernels_table.h"

namespace gradswitch {
namespace {

struct F32x16 {
  using T = float;
  using V = __m512;
  using M = __mmask16;
  static constexpr size_t kLanes = 16;
  static M mask(size_t left) { return left >= 16 ? 0xFFFF : static_cast<M>((1u << left) - 1); }
  static V load(M k, const T* p) { return _mm512_maskz_loadu_ps(k, p); }
  static void store(T* p, M k, V v) { _mm512_mask_storeu_ps(p, k, v); }
  static V set1(T x) { return _mm512_set1_ps(x); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V abs(V a) { return _mm512_abs_ps(a); }
  static M unordered(V a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  static T reduce_max(V a) { return _mm512_reduce_max_ps(a); }
  // fixed32 lanes: int32 <-> T, rounding to nearest even (cvtps2dq).
  static V load_i32(M k, const int32_t* p) { return _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(k, p)); }
  static void store_i32(int32_t* p, M k, V v) { _mm512_mask_storeu_epi32(p, k, _mm512_cvtps_epi32(v)); }
};

struct F64x8 {
  using T = double;
  using V = __m512d;
  using M = __mmask8;
  static constexpr size_t kLanes = 8;
  static M mask(size_t left) { return left >= 8 ? 0xFF : static_cast<M>((1u << left) - 1); }
  static V load(M k, const T* p) { return _mm512_maskz_loadu_pd(k, p); }
  static void store(T* p, M k, V v) { _mm512_mask_storeu_pd(p, k, v); }
  static V set1(T x) { return _mm512_set1_pd(x); }
  static V add(V a, V b) { return _mm512_add_pd(a, b); }
  static V mul(V a, V b) { return _mm512_mul_pd(a, b); }
  static V max(V a, V b) { return _mm512_max_pd(a, b); }
  static V abs(V a) { return _mm512_abs_pd(a); }
  static M unordered(V a) { return _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q); }
  static T reduce_max(V a) { return _mm512_reduce_max_pd(a); }
  static V load_i32(M k, const int32_t* p) { return _mm512_cvtepi32_pd(_mm256_maskz_loadu_epi32(k, p)); }
  static void store_i32(int32_t* p, M k, V v) { _mm256_mask_storeu_epi32(p, k, _mm512_cvtpd_epi32(v)); }
};

template <class L>
void add(typename L::T* dst, const typename L::T* src, size_t n) {
  for (size_t i = 0; i < n; i += L::kLanes) {
    typename L::M k = L::mask(n - i);
    const typename L::V a = L::load(k, dst + i), b = L::load(k, src + i);
    L::store(dst + i, k, L::add(a, b));
  }
}
template <class L>
void quantize(int32_t* dst, const typename L::T* src, size_t n, typename L::T scale) {
  const typename L::V s = L::set1(scale);
  for (size_t i = 0; i < n; i += L::kLanes) {
    typename L::M k = L::mask(n - i);
    L::store_i32(dst + i, k, L::mul(L::load(k, src + i), s));
  }
}
template <class L>
void dequantize(typename L::T* dst, const int32_t* src, size_t n, typename L::T scale) {
  const typename L::V s = L::set1(scale);
  for (size_t i = 0; i < n; i += L::kLanes) {
    typename L::M k = L::mask(n - i);
    L::store(dst + i, k, L::mul(L::load_i32(k, src + i), s));
  }
}
template <class L>
typename L::T max_abs(const typename L::T* src, size_t n) {
  typename L::V m = L::set1(0);
  typename L::M nan_seen = 0;
  for (size_t i = 0; i < n; i += L::kLanes) {
    typename L::V a = L::abs(L::load(L::mask(n - i), src + i));
    nan_seen |= L::unordered(a);
    m = L::max(m, a);
  }
  if (nan_seen) return std::numeric_limits<typename L::T>::quiet_NaN();
  return L::reduce_max(m);
}

void add_i32(int32_t* dst, const int32_t* src, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 k = F32x16::mask(n - i);
    __m512i a = _mm512_maskz_loadu_epi32(k, dst + i), b = _mm512_maskz_loadu_epi32(k, src + i);
    _mm512_mask_storeu_epi32(dst + i, k, _mm512_add_epi32(a, b));
  }
}

// 16-bit formats, 16 lanes at a time: widen (load) and narrow (round to nearest even).
struct F16 {
  static __m512 load(__mmask16 k, const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p));
  }
  static __m256i narrow(__m512 v) {
    return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
};
struct BF16 {
  static __m512 load(__mmask16 k, const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p)), 16));
  }
  // Round to nearest even on the bit pattern; NaNs are made quiet (as the scalar version).
  static __m256i narrow(__m512 v) {
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7FFF);
    const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
    const __m512i quiet = _mm512_set1_epi32(0x00400000);
    __m512i x = _mm512_castps_si512(v);
    __mmask16 is_nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, abs_mask), inf);
    __m512i rounded =
        _mm512_add_epi32(x, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(x, 16), one)));
    __m512i r = _mm512_mask_blend_epi32(is_nan, rounded, _mm512_or_si512(x, quiet));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
  }
};

template <class H>
void widen(float* dst, const uint16_t* src, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 k = F32x16::mask(n - i);
    _mm512_mask_storeu_ps(dst + i, k, H::load(k, src + i));
  }
}
template <class H>
void add_widened(float* dst, const uint16_t* src, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 k = F32x16::mask(n - i);
    _mm512_mask_storeu_ps(dst + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, dst + i), H::load(k, src + i)));
  }
}
template <class H>
void narrow(uint16_t* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 k = F32x16::mask(n - i);
    _mm256_mask_storeu_epi16(dst + i, k, H::narrow(_mm512_maskz_loadu_ps(k, src + i)));
  }
}

void f32_to_f64(double* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    __mmask8 k = F64x8::mask(n - i);
    _mm512_mask_storeu_pd(dst + i, k, _mm512_cvtps_pd(_mm256_maskz_loadu_ps(k, src + i)));
  }
}
void f64_to_f32(float* dst, const double* src, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    __mmask8 k = F64x8::mask(n - i);
    _mm256_mask_storeu_ps(dst + i, k, _mm512_cvtpd_ps(_mm512_maskz_loadu_pd(k, src + i)));
  }
}

// mx8's 32-bit lanes for Mx8Blocks (common/kernels_mx8.h): F32x16's binary32 ones and masks, and
// the same 16 as integers. A block is whole vectors: its loads and stores need no mask.
struct Mx8Lanes : F32x16 {
  using VI = __m512i;
  static VI bits(V v) { return _mm512_castps_si512(v); }
  static V floats(VI v) { return _mm512_castsi512_ps(v); }
  static VI splat(uint32_t u) { return _mm512_set1_epi32(static_cast<int>(u)); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static VI and_(VI a, VI b) { return _mm512_and_si512(a, b); }
  static VI or_(VI a, VI b) { return _mm512_or_si512(a, b); }
  static VI add32(VI a, VI b) { return _mm512_add_epi32(a, b); }
  static VI sub32(VI a, VI b) { return _mm512_sub_epi32(a, b); }
  static VI min_u32(VI a, VI b) { return _mm512_min_epu32(a, b); }
  static VI max_u32(VI a, VI b) { return _mm512_max_epu32(a, b); }
  static VI shr(VI a, int n) { return _mm512_srli_epi32(a, n); }
  static VI shl(VI a, int n) { return _mm512_slli_epi32(a, n); }
  static M lt(VI a, VI b) { return _mm512_cmplt_epu32_mask(a, b); }
  static M eq(VI a, VI b) { return _mm512_cmpeq_epi32_mask(a, b); }
  static VI blend(M m, VI a, VI b) { return _mm512_mask_blend_epi32(m, a, b); }
  static VI or_if(VI v, M m, VI c) { return _mm512_mask_or_epi32(v, m, v, c); }
  static uint32_t reduce_max_u32(VI m) { return _mm512_reduce_max_epu32(m); }
  static VI load_bytes(const uint8_t* q) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  }
  static void store_bytes(uint8_t* out, const VI* e) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(e[0]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm512_cvtepi32_epi8(e[1]));
  }
};
using MX8 = Mx8Payload<Mx8Blocks<Mx8Lanes>>;

}  // namespace

extern const Kernels kAvx512Kernels = GRADSWITCH_KERNELS_TABLE("avx512", F32x16, F64x8, F16, BF16, MX8);

}  // namespace gradswitch
