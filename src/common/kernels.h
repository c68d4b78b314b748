// Element kernels: summation and conversion, in a scalar, an AVX2 and an AVX-512 variant.
//
// One table of function pointers per variant; `kernels()` picks the best one the CPU runs,
// once, unless GRADSWITCH_SIMD=scalar|avx2|avx512 asks for a specific one. All variants give
// bitwise identical results (tests/cpp/test_kernels.cpp checks it), so the choice only
// changes speed. A new kernel is a field here, its entry in common/kernels_table.h (the one list of
// the tables' fields), and one definition under that entry's name in each variant's file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gradswitch {

struct Kernels {
  const char* name;
  // dst[i] += src[i]
  void (*add_f32)(float* dst, const float* src, size_t n);
  // dst[i] += src[i], two's complement wrap-around (no UB on overflow)
  void (*add_i32)(int32_t* dst, const int32_t* src, size_t n);
  // 16-bit floats: widen into / accumulate into fp32, narrow with round-to-nearest-even.
  void (*f16_to_f32)(float* dst, const uint16_t* src, size_t n);
  void (*add_f16_to_f32)(float* dst, const uint16_t* src, size_t n);
  void (*f32_to_f16)(uint16_t* dst, const float* src, size_t n);
  void (*bf16_to_f32)(float* dst, const uint16_t* src, size_t n);
  void (*add_bf16_to_f32)(float* dst, const uint16_t* src, size_t n);
  void (*f32_to_bf16)(uint16_t* dst, const float* src, size_t n);
  // fixed32: dst[i] = round_to_nearest_even(src[i] * scale); dequantize: dst[i] = src[i] * scale.
  void (*quantize)(int32_t* dst, const float* src, size_t n, float scale);
  void (*dequantize)(float* dst, const int32_t* src, size_t n, float scale);
  // max |src[i]|; NaN if any element is NaN, +inf if any is infinite.
  float (*max_abs)(const float* src, size_t n);

  // float64 (switch: the sum; worker: tensors of doubles on any wire).
  // dst[i] += src[i]
  void (*add_f64)(double* dst, const double* src, size_t n);
  // Widening is exact; narrowing rounds to nearest even (as a C cast), NaNs stay NaN.
  void (*f32_to_f64)(double* dst, const float* src, size_t n);
  void (*f64_to_f32)(float* dst, const double* src, size_t n);
  // fixed32 from/to doubles: as quantize/dequantize with a double scale (a power of two, so the
  // product is exact); the caller keeps |src[i] * scale| < 2^31.
  void (*quantize_f64)(int32_t* dst, const double* src, size_t n, double scale);
  void (*dequantize_f64)(double* dst, const int32_t* src, size_t n, double scale);
  double (*max_abs_f64)(const double* src, size_t n);

  // mx8 (docs/protocol.md 2.2; common/kernels_mx8.h): `count` fp32 values as a payload of
  // gs_payload_bytes(GS_ELEM_MX8, count) bytes; a payload widened into fp32, written or added.
  void (*f32_to_mx8)(uint8_t* payload, const float* src, size_t count);
  void (*mx8_to_f32)(float* dst, const uint8_t* payload, size_t count);
  void (*add_mx8_to_f32)(float* dst, const uint8_t* payload, size_t count);
};

// The variant in use (chosen at first call).
const Kernels& kernels();
// A named variant ("scalar", "avx2", "avx512"), or nullptr when unknown or not supported here.
const Kernels* kernels_named(std::string_view name);

// Scalar conversions, shared by the variants for their tails.
uint16_t f32_to_f16_scalar(float f);
float f16_to_f32_scalar(uint16_t h);
uint16_t f32_to_bf16_scalar(float f);
float bf16_to_f32_scalar(uint16_t h);

}  // namespace gradswitch
