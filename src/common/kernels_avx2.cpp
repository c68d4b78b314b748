// AVX2 + F16C variant. This file alone is compiled with -mavx2 -mf16c -mfma; kernels.cpp only
// calls into it after checking the CPU.
#include <immintrin.h>

#include <cmath>

#include "common/kernels.h"

namespace gradswitch {
namespace {

void add_f32(float* dst, const float* src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_loadu_ps(src + i)));
  for (; i < n; ++i) dst[i] += src[i];
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

__m256 load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
__m256 load_bf16(const uint16_t* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

void f16_to_f32(float* dst, const uint16_t* src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_f16(src + i));
  for (; i < n; ++i) dst[i] = f16_to_f32_scalar(src[i]);
}
void add_f16_to_f32(float* dst, const uint16_t* src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), load_f16(src + i)));
  for (; i < n; ++i) dst[i] += f16_to_f32_scalar(src[i]);
}
void f32_to_f16(uint16_t* dst, const float* src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(dst + i),
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) dst[i] = f32_to_f16_scalar(src[i]);
}
void bf16_to_f32(float* dst, const uint16_t* src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16(src + i));
  for (; i < n; ++i) dst[i] = bf16_to_f32_scalar(src[i]);
}
void add_bf16_to_f32(float* dst, const uint16_t* src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), load_bf16(src + i)));
  for (; i < n; ++i) dst[i] += bf16_to_f32_scalar(src[i]);
}
void f32_to_bf16(uint16_t* dst, const float* src, size_t n) {
  // Round to nearest even on the bit pattern; NaNs are made quiet (as the scalar version).
  const __m256i lsb_mask = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7FFF);
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
  const __m256i quiet = _mm256_set1_epi32(0x00400000);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i x = _mm256_castps_si256(_mm256_loadu_ps(src + i));
    __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
    __m256i rounded =
        _mm256_add_epi32(x, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(x, 16), lsb_mask)));
    __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(x, quiet), is_nan);
    r = _mm256_srli_epi32(r, 16);
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), packed);
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16_scalar(src[i]);
}
void quantize(int32_t* dst, const float* src, size_t n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + i), s)));
  for (; i < n; ++i) dst[i] = static_cast<int32_t>(std::lrintf(src[i] * scale));
}
void dequantize(float* dst, const int32_t* src, size_t n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(
        dst + i,
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))), s));
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]) * scale;
}
float max_abs(const float* src, size_t n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 m = _mm256_setzero_ps();
  __m256 nan_seen = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 a = _mm256_and_ps(_mm256_loadu_ps(src + i), abs_mask);
    nan_seen = _mm256_or_ps(nan_seen, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    m = _mm256_max_ps(m, a);
  }
  if (_mm256_movemask_ps(nan_seen)) return NAN;
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float r = 0.0f;
  for (float v : lanes) r = v > r ? v : r;
  for (; i < n; ++i) {
    float a = std::fabs(src[i]);
    if (std::isnan(a)) return a;
    if (a > r) r = a;
  }
  return r;
}

void add_f64(double* dst, const double* src, size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    _mm256_storeu_pd(dst + i, _mm256_add_pd(_mm256_loadu_pd(dst + i), _mm256_loadu_pd(src + i)));
  for (; i < n; ++i) dst[i] += src[i];
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
void quantize_f64(int32_t* dst, const double* src, size_t n, double scale) {
  const __m256d s = _mm256_set1_pd(scale);
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtpd_epi32(_mm256_mul_pd(_mm256_loadu_pd(src + i), s)));
  for (; i < n; ++i) dst[i] = static_cast<int32_t>(std::lrint(src[i] * scale));
}
void dequantize_f64(double* dst, const int32_t* src, size_t n, double scale) {
  const __m256d s = _mm256_set1_pd(scale);
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    _mm256_storeu_pd(
        dst + i,
        _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))), s));
  for (; i < n; ++i) dst[i] = static_cast<double>(src[i]) * scale;
}
double max_abs_f64(const double* src, size_t n) {
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFll));
  __m256d m = _mm256_setzero_pd();
  __m256d nan_seen = _mm256_setzero_pd();
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    __m256d a = _mm256_and_pd(_mm256_loadu_pd(src + i), abs_mask);
    nan_seen = _mm256_or_pd(nan_seen, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
    m = _mm256_max_pd(m, a);
  }
  if (_mm256_movemask_pd(nan_seen)) return NAN;
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, m);
  double r = 0.0;
  for (double v : lanes) r = v > r ? v : r;
  for (; i < n; ++i) {
    double a = std::fabs(src[i]);
    if (std::isnan(a)) return a;
    if (a > r) r = a;
  }
  return r;
}

}  // namespace

extern const Kernels kAvx2Kernels = {
    "avx2",      add_f32,         add_i32,     f16_to_f32,   add_f16_to_f32, f32_to_f16,
    bf16_to_f32, add_bf16_to_f32, f32_to_bf16, quantize,     dequantize,     max_abs,
    add_f64,     f32_to_f64,      f64_to_f32,  quantize_f64, dequantize_f64, max_abs_f64,
};

}  // namespace gradswitch
