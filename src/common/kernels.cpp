// Scalar kernels, the shared scalar conversions, and the run-time choice of a variant.
#include "common/kernels.h"

#include <cpuid.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/kernels_mx8.h"
#include "common/kernels_table.h"

namespace gradswitch {

// Defined in kernels_avx2.cpp / kernels_avx512.cpp (compiled with those ISAs enabled).
extern const Kernels kAvx2Kernels;
extern const Kernels kAvx512Kernels;

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

// One template per operation for float and double elements, and per 16-bit format; the table
// names them as the SIMD files name theirs (common/kernels_table.h).
template <typename T>
void add(T* dst, const T* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}
template <typename T>
void quantize(int32_t* dst, const T* src, size_t n, T scale) {
  // std::lrint rounds to nearest even in the default rounding mode, like cvtps2dq / cvtpd2dq.
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<int32_t>(std::lrint(src[i] * scale));
}
template <typename T>
void dequantize(T* dst, const int32_t* src, size_t n, T scale) {
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]) * scale;
}
template <typename T>
T max_abs(const T* src, size_t n) {
  T m = 0;
  for (size_t i = 0; i < n; ++i) {
    T a = std::fabs(src[i]);
    if (std::isnan(a)) return a;
    if (a > m) m = a;
  }
  return m;
}
void f32_to_f64(double* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = src[i];
}
void f64_to_f32(float* dst, const double* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}
void add_i32(int32_t* dst, const int32_t* src, size_t n) {
  for (size_t i = 0; i < n; ++i)
    dst[i] = static_cast<int32_t>(static_cast<uint32_t>(dst[i]) + static_cast<uint32_t>(src[i]));
}

struct F16 {
  static float widen_one(uint16_t h) { return f16_to_f32_scalar(h); }
  static uint16_t narrow_one(float f) { return f32_to_f16_scalar(f); }
};
struct BF16 {
  static float widen_one(uint16_t h) { return bf16_to_f32_scalar(h); }
  static uint16_t narrow_one(float f) { return f32_to_bf16_scalar(f); }
};
template <class H>
void widen(float* dst, const uint16_t* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = H::widen_one(src[i]);
}
template <class H>
void add_widened(float* dst, const uint16_t* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += H::widen_one(src[i]);
}
template <class H>
void narrow(uint16_t* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = H::narrow_one(src[i]);
}

// The reference itself (common/kernels_mx8.cpp).
struct MX8 {
  static constexpr auto encode = f32_to_mx8_scalar;
  static constexpr auto decode = mx8_to_f32_scalar;
  static constexpr auto add = add_mx8_to_f32_scalar;
};

const Kernels kScalarKernels = GRADSWITCH_KERNELS_TABLE("scalar", float, double, F16, BF16, MX8);

// F16C straight from CPUID (leaf 1, ECX bit 29): not every compiler's __builtin_cpu_supports knows it.
bool cpu_has_f16c() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
}
bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && cpu_has_f16c();
}

const Kernels* choose() {
  if (const char* forced = std::getenv("GRADSWITCH_SIMD"); forced && *forced) {
    if (const Kernels* k = kernels_named(forced)) return k;
  }
  if (cpu_has_avx512()) return &kAvx512Kernels;
  if (cpu_has_avx2()) return &kAvx2Kernels;
  return &kScalarKernels;
}

}  // namespace

uint16_t f32_to_f16_scalar(float f) {
  uint32_t x = bits_of(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or NaN: NaN keeps its top payload bits and stays quiet
    if (abs == 0x7F800000u) return sign | 0x7C00u;
    return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  }
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {                        // below the smallest normal half: subnormal
    if (abs < 0x33000000u) return sign;           // < 2^-25 rounds to zero
    uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
    int shift = 126 - static_cast<int>(abs >> 23);  // 14 + (113 - exp)
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t h = ((abs - 0x38000000u) >> 13);  // rebias exponent 127 -> 15
  uint32_t rem = abs & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float f16_to_f32_scalar(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return float_of(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return float_of(sign);
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  return float_of(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t f32_to_bf16_scalar(float f) {
  uint32_t x = bits_of(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

float bf16_to_f32_scalar(uint16_t h) {
  return float_of(static_cast<uint32_t>(h) << 16);
}

const Kernels* kernels_named(std::string_view name) {
  if (name == "scalar") return &kScalarKernels;
  if (name == "avx2") return cpu_has_avx2() ? &kAvx2Kernels : nullptr;
  if (name == "avx512") return cpu_has_avx512() ? &kAvx512Kernels : nullptr;
  return nullptr;
}

const Kernels& kernels() {
  static const Kernels* chosen = choose();
  return *chosen;
}

}  // namespace gradswitch
