// AVX2 + F16C variant. This file alone is compiled with -mavx2 -mf16c -mfma; kernels.cpp only
// calls into it after checking the CPU.
//
// Each kernel is written once over a lane type (F32x8, F64x4) or a 16-bit format (F16, BF16) that
// names the intrinsics; the templates inline to the same loops as hand-written per-type code.
#include <immintrin.h>

#include <cmath>
#include <limits>

#include "common/kernels.h"
#include "common/kernels_mx8.h"
#include "common/kernels_table.h"

namespace gradswitch {
namespace {

struct F32x8 {
  using T = float;
  using V = __m256;
  static constexpr size_t kLanes = 8;
  static V load(const T* p) { return _mm256_loadu_ps(p); }
  static void store(T* p, V v) { _mm256_storeu_ps(p, v); }
  static V set1(T x) { return _mm256_set1_ps(x); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V abs(V a) { return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF))); }
  static V unordered(V a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
  static V bit_or(V a, V b) { return _mm256_or_ps(a, b); }
  static bool any(V a) { return _mm256_movemask_ps(a) != 0; }
  // fixed32 lanes: int32 <-> T, rounding to nearest even (cvtps2dq).
  static V load_i32(const int32_t* p) {
    return _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store_i32(int32_t* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_cvtps_epi32(v));
  }
};

struct F64x4 {
  using T = double;
  using V = __m256d;
  static constexpr size_t kLanes = 4;
  static V load(const T* p) { return _mm256_loadu_pd(p); }
  static void store(T* p, V v) { _mm256_storeu_pd(p, v); }
  static V set1(T x) { return _mm256_set1_pd(x); }
  static V add(V a, V b) { return _mm256_add_pd(a, b); }
  static V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  static V max(V a, V b) { return _mm256_max_pd(a, b); }
  static V abs(V a) {
    return _mm256_and_pd(a, _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFll)));
  }
  static V unordered(V a) { return _mm256_cmp_pd(a, a, _CMP_UNORD_Q); }
  static V bit_or(V a, V b) { return _mm256_or_pd(a, b); }
  static bool any(V a) { return _mm256_movemask_pd(a) != 0; }
  static V load_i32(const int32_t* p) {
    return _mm256_cvtepi32_pd(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store_i32(int32_t* p, V v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtpd_epi32(v));
  }
};

template <class L>
void add(typename L::T* dst, const typename L::T* src, size_t n) {
  size_t i = 0;
  for (; i + L::kLanes <= n; i += L::kLanes) L::store(dst + i, L::add(L::load(dst + i), L::load(src + i)));
  for (; i < n; ++i) dst[i] += src[i];
}
template <class L>
void quantize(int32_t* dst, const typename L::T* src, size_t n, typename L::T scale) {
  const typename L::V s = L::set1(scale);
  size_t i = 0;
  for (; i + L::kLanes <= n; i += L::kLanes) L::store_i32(dst + i, L::mul(L::load(src + i), s));
  for (; i < n; ++i) dst[i] = static_cast<int32_t>(std::lrint(src[i] * scale));
}
template <class L>
void dequantize(typename L::T* dst, const int32_t* src, size_t n, typename L::T scale) {
  const typename L::V s = L::set1(scale);
  size_t i = 0;
  for (; i + L::kLanes <= n; i += L::kLanes) L::store(dst + i, L::mul(L::load_i32(src + i), s));
  for (; i < n; ++i) dst[i] = static_cast<typename L::T>(src[i]) * scale;
}
template <class L>
typename L::T max_abs(const typename L::T* src, size_t n) {
  using T = typename L::T;
  typename L::V m = L::set1(0), nan_seen = L::set1(0);
  size_t i = 0;
  for (; i + L::kLanes <= n; i += L::kLanes) {
    typename L::V a = L::abs(L::load(src + i));
    nan_seen = L::bit_or(nan_seen, L::unordered(a));
    m = L::max(m, a);
  }
  if (L::any(nan_seen)) return std::numeric_limits<T>::quiet_NaN();
  alignas(32) T lanes[L::kLanes];
  L::store(lanes, m);
  T r = 0;
  for (T v : lanes) r = v > r ? v : r;
  for (; i < n; ++i) {
    T a = std::fabs(src[i]);
    if (std::isnan(a)) return a;
    if (a > r) r = a;
  }
  return r;
}

void add_i32(int32_t* dst, const int32_t* src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(dst + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_add_epi32(a, b));
  }
  for (; i < n; ++i)
    dst[i] = static_cast<int32_t>(static_cast<uint32_t>(dst[i]) + static_cast<uint32_t>(src[i]));
}

// 16-bit formats, 8 lanes at a time: widen (load) and narrow (round to nearest even).
struct F16 {
  static __m256 load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static __m128i narrow(__m256 v) {
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static float widen_one(uint16_t h) { return f16_to_f32_scalar(h); }
  static uint16_t narrow_one(float f) { return f32_to_f16_scalar(f); }
};
struct BF16 {
  static __m256 load(const uint16_t* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  // Round to nearest even on the bit pattern; NaNs are made quiet (as the scalar version).
  static __m128i narrow(__m256 v) {
    const __m256i lsb_mask = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7FFF);
    const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
    const __m256i quiet = _mm256_set1_epi32(0x00400000);
    __m256i x = _mm256_castps_si256(v);
    __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
    __m256i rounded =
        _mm256_add_epi32(x, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(x, 16), lsb_mask)));
    __m256i r = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, _mm256_or_si256(x, quiet), is_nan), 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  }
  static float widen_one(uint16_t h) { return bf16_to_f32_scalar(h); }
  static uint16_t narrow_one(float f) { return f32_to_bf16_scalar(f); }
};

template <class H>
void widen(float* dst, const uint16_t* src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, H::load(src + i));
  for (; i < n; ++i) dst[i] = H::widen_one(src[i]);
}
template <class H>
void add_widened(float* dst, const uint16_t* src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), H::load(src + i)));
  for (; i < n; ++i) dst[i] += H::widen_one(src[i]);
}
template <class H>
void narrow(uint16_t* dst, const float* src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), H::narrow(_mm256_loadu_ps(src + i)));
  for (; i < n; ++i) dst[i] = H::narrow_one(src[i]);
}

void f32_to_f64(double* dst, const float* src, size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) _mm256_storeu_pd(dst + i, _mm256_cvtps_pd(_mm_loadu_ps(src + i)));
  for (; i < n; ++i) dst[i] = src[i];
}
void f64_to_f32(float* dst, const double* src, size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(dst + i, _mm256_cvtpd_ps(_mm256_loadu_pd(src + i)));
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// mx8's 32-bit lanes for Mx8Blocks (common/kernels_mx8.h): F32x8's binary32 ones, the same 8 as
// integers, and masks as all-ones lanes.
struct Mx8Lanes : F32x8 {
  using VI = __m256i;
  using M = __m256i;
  static VI bits(V v) { return _mm256_castps_si256(v); }
  static V floats(VI v) { return _mm256_castsi256_ps(v); }
  static VI splat(uint32_t u) { return _mm256_set1_epi32(static_cast<int>(u)); }
  static VI and_(VI a, VI b) { return _mm256_and_si256(a, b); }
  static VI or_(VI a, VI b) { return _mm256_or_si256(a, b); }
  static VI add32(VI a, VI b) { return _mm256_add_epi32(a, b); }
  static VI sub32(VI a, VI b) { return _mm256_sub_epi32(a, b); }
  static VI min_u32(VI a, VI b) { return _mm256_min_epu32(a, b); }
  static VI max_u32(VI a, VI b) { return _mm256_max_epu32(a, b); }
  static VI shr(VI a, int n) { return _mm256_srli_epi32(a, n); }
  static VI shl(VI a, int n) { return _mm256_slli_epi32(a, n); }
  static M lt(VI a, VI b) { return _mm256_cmpgt_epi32(b, a); }  // lanes below 2^31: a signed compare
  static M eq(VI a, VI b) { return _mm256_cmpeq_epi32(a, b); }
  static VI blend(M m, VI a, VI b) { return _mm256_blendv_epi8(a, b, m); }
  static VI or_if(VI v, M m, VI c) { return _mm256_or_si256(v, _mm256_and_si256(m, c)); }
  static uint32_t reduce_max_u32(VI m) {
    m = _mm256_max_epu32(m, _mm256_permute2x128_si256(m, m, 1));
    m = _mm256_max_epu32(m, _mm256_shuffle_epi32(m, 0x4E));
    m = _mm256_max_epu32(m, _mm256_shuffle_epi32(m, 0xB1));
    return static_cast<uint32_t>(_mm256_cvtsi256_si32(m));
  }
  static VI load_bytes(const uint8_t* q) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
  }
  // The packs interleave the 128-bit halves, whose 4-byte groups the permutation puts back in order.
  static void store_bytes(uint8_t* out, const VI* e) {
    const VI packed = _mm256_packus_epi16(_mm256_packus_epi32(e[0], e[1]), _mm256_packus_epi32(e[2], e[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                        _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
};
using MX8 = Mx8Payload<Mx8Blocks<Mx8Lanes>>;

}  // namespace

extern const Kernels kAvx2Kernels = GRADSWITCH_KERNELS_TABLE("avx2", F32x8, F64x4, F16, BF16, MX8);

}  // namespace gradswitch
