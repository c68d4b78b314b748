// AVX-512 variant (F, BW, VL + F16C). This file alone is compiled with those flags; kernels.cpp
// only calls into it after checking the CPU. Tails use masked loads/stores, so no scalar tail.
#include <immintrin.h>

#include "common/kernels.h"

namespace gradswitch {
namespace {

inline __mmask16 tail_mask(size_t left) {
  return left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
}

void add_f32(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 k = tail_mask(n - i);
    __m512 a = _mm512_maskz_loadu_ps(k, dst + i), b = _mm512_maskz_loadu_ps(k, src + i);
    _mm512_mask_storeu_ps(dst + i, k, _mm512_add_ps(a, b));
  }
}
void add_i32(int32_t* dst, const int32_t* src, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 k = tail_mask(n - i);
    __m512i a = _mm512_maskz_loadu_epi32(k, dst + i), b = _mm512_maskz_loadu_epi32(k, src + i);
    _mm512_mask_storeu_epi32(dst + i, k, _mm512_add_epi32(a, b));
  }
}
inline __m512 load_f16(__mmask16 k, const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p));
}
inline __m512 load_bf16(__mmask16 k, const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p)), 16));
}
void f16_to_f32(float* dst, const uint16_t* src, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, k, load_f16(k, src + i));
  }
}
void add_f16_to_f32(float* dst, const uint16_t* src, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, dst + i), load_f16(k, src + i)));
  }
}
void f32_to_f16(uint16_t* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 k = tail_mask(n - i);
    __m256i h =
        _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_epi16(dst + i, k, h);
  }
}
void bf16_to_f32(float* dst, const uint16_t* src, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, k, load_bf16(k, src + i));
  }
}
void add_bf16_to_f32(float* dst, const uint16_t* src, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, k,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(k, dst + i), load_bf16(k, src + i)));
  }
}
void f32_to_bf16(uint16_t* dst, const float* src, size_t n) {
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7FFF);
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
  const __m512i quiet = _mm512_set1_epi32(0x00400000);
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 k = tail_mask(n - i);
    __m512i x = _mm512_castps_si512(_mm512_maskz_loadu_ps(k, src + i));
    __mmask16 is_nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, abs_mask), inf);
    __m512i rounded =
        _mm512_add_epi32(x, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(x, 16), one)));
    __m512i r = _mm512_mask_blend_epi32(is_nan, rounded, _mm512_or_si512(x, quiet));
    _mm256_mask_storeu_epi16(dst + i, k, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
  }
}
void quantize(int32_t* dst, const float* src, size_t n, float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_epi32(dst + i, k,
                             _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, src + i), s)));
  }
}
void dequantize(float* dst, const int32_t* src, size_t n, float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, k,
                          _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(k, src + i)), s));
  }
}
float max_abs(const float* src, size_t n) {
  __m512 m = _mm512_setzero_ps();
  __mmask16 nan_seen = 0;
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 k = tail_mask(n - i);
    __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(k, src + i));
    nan_seen |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    m = _mm512_max_ps(m, a);
  }
  if (nan_seen) return __builtin_nanf("");
  return _mm512_reduce_max_ps(m);
}

inline __mmask8 tail_mask8(size_t left) {
  return left >= 8 ? 0xFF : static_cast<__mmask8>((1u << left) - 1);
}

void add_f64(double* dst, const double* src, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    __mmask8 k = tail_mask8(n - i);
    __m512d a = _mm512_maskz_loadu_pd(k, dst + i), b = _mm512_maskz_loadu_pd(k, src + i);
    _mm512_mask_storeu_pd(dst + i, k, _mm512_add_pd(a, b));
  }
}
void f32_to_f64(double* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    __mmask8 k = tail_mask8(n - i);
    _mm512_mask_storeu_pd(dst + i, k, _mm512_cvtps_pd(_mm256_maskz_loadu_ps(k, src + i)));
  }
}
void f64_to_f32(float* dst, const double* src, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    __mmask8 k = tail_mask8(n - i);
    _mm256_mask_storeu_ps(dst + i, k, _mm512_cvtpd_ps(_mm512_maskz_loadu_pd(k, src + i)));
  }
}
void quantize_f64(int32_t* dst, const double* src, size_t n, double scale) {
  const __m512d s = _mm512_set1_pd(scale);
  for (size_t i = 0; i < n; i += 8) {
    __mmask8 k = tail_mask8(n - i);
    _mm256_mask_storeu_epi32(dst + i, k,
                             _mm512_cvtpd_epi32(_mm512_mul_pd(_mm512_maskz_loadu_pd(k, src + i), s)));
  }
}
void dequantize_f64(double* dst, const int32_t* src, size_t n, double scale) {
  const __m512d s = _mm512_set1_pd(scale);
  for (size_t i = 0; i < n; i += 8) {
    __mmask8 k = tail_mask8(n - i);
    _mm512_mask_storeu_pd(dst + i, k,
                          _mm512_mul_pd(_mm512_cvtepi32_pd(_mm256_maskz_loadu_epi32(k, src + i)), s));
  }
}
double max_abs_f64(const double* src, size_t n) {
  __m512d m = _mm512_setzero_pd();
  __mmask8 nan_seen = 0;
  for (size_t i = 0; i < n; i += 8) {
    __mmask8 k = tail_mask8(n - i);
    __m512d a = _mm512_abs_pd(_mm512_maskz_loadu_pd(k, src + i));
    nan_seen |= _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q);
    m = _mm512_max_pd(m, a);
  }
  if (nan_seen) return __builtin_nan("");
  return _mm512_reduce_max_pd(m);
}

}  // namespace

extern const Kernels kAvx512Kernels = {
    "avx512",    add_f32,         add_i32,     f16_to_f32,   add_f16_to_f32, f32_to_f16,
    bf16_to_f32, add_bf16_to_f32, f32_to_bf16, quantize,     dequantize,     max_abs,
    add_f64,     f32_to_f64,      f64_to_f32,  quantize_f64, dequantize_f64, max_abs_f64,
};

}  // namespace gradswitch
