// Every SIMD variant must give the scalar variant's bits, at every length (tails included).
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/fixed_point.h"
#include "common/kernels.h"
#include "harness.h"

using namespace gradswitch;

namespace {

std::vector<const Kernels*> variants() {
  std::vector<const Kernels*> v;
  for (const char* name : {"scalar", "avx2", "avx512"})
    if (const Kernels* k = kernels_named(name))
      v.push_back(k);
    else
      std::printf("  (variant %s not supported on this CPU: not compared)\n", name);
  return v;
}

template <typename T>
std::vector<T> random_values(size_t n, uint32_t seed, T scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<T> d(0, scale);
  std::vector<T> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
std::vector<float> random_floats(size_t n, uint32_t seed, float scale) {
  return random_values(n, seed, scale);
}
std::vector<double> random_doubles(size_t n, uint32_t seed, double scale) {
  return random_values(n, seed, scale);
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace

TEST(variants_agree_bitwise) {
  const Kernels& ref = *kernels_named("scalar");
  for (const Kernels* k : variants()) {
    for (size_t n : {0, 1, 7, 8, 15, 16, 17, 31, 33, 360, 720, 2235}) {
      auto a = random_floats(n, 1 + n, 1.0f), b = random_floats(n, 2 + n, 1000.0f);
      // Include values that stress rounding: halfway cases, subnormal halves, overflow.
      if (n > 4) {
        a[0] = 65520.0f;
        a[1] = 5.96046448e-08f;
        a[2] = 1.0f + 1.0f / 2048;
        a[3] = -INFINITY;
      }
      std::vector<float> s1 = a, s2 = a;
      ref.add_f32(s1.data(), b.data(), n);
      k->add_f32(s2.data(), b.data(), n);
      CHECK(same_bits(s1, s2));
      std::vector<uint16_t> h1(n), h2(n), bf1(n), bf2(n);
      ref.f32_to_f16(h1.data(), b.data(), n);
      k->f32_to_f16(h2.data(), b.data(), n);
      CHECK(same_bits(h1, h2));
      ref.f32_to_f16(h1.data(), a.data(), n);
      k->f32_to_f16(h2.data(), a.data(), n);
      CHECK(same_bits(h1, h2));
      ref.f32_to_bf16(bf1.data(), a.data(), n);
      k->f32_to_bf16(bf2.data(), a.data(), n);
      CHECK(same_bits(bf1, bf2));
      std::vector<float> w1(n, 1.5f), w2(n, 1.5f);
      ref.add_f16_to_f32(w1.data(), h1.data(), n);
      k->add_f16_to_f32(w2.data(), h1.data(), n);
      CHECK(same_bits(w1, w2));
      ref.add_bf16_to_f32(w1.data(), bf1.data(), n);
      k->add_bf16_to_f32(w2.data(), bf1.data(), n);
      CHECK(same_bits(w1, w2));
      ref.f16_to_f32(w1.data(), h1.data(), n);
      k->f16_to_f32(w2.data(), h1.data(), n);
      CHECK(same_bits(w1, w2));
      ref.bf16_to_f32(w1.data(), bf1.data(), n);
      k->bf16_to_f32(w2.data(), bf1.data(), n);
      CHECK(same_bits(w1, w2));
      std::vector<int32_t> q1(n), q2(n);
      ref.quantize(q1.data(), b.data(), n, 1024.0f);
      k->quantize(q2.data(), b.data(), n, 1024.0f);
      CHECK(same_bits(q1, q2));
      ref.add_i32(q1.data(), q1.data(), n);
      k->add_i32(q2.data(), q2.data(), n);
      CHECK(same_bits(q1, q2));
      std::vector<float> d1(n), d2(n);
      ref.dequantize(d1.data(), q1.data(), n, 1.0f / 1024);
      k->dequantize(d2.data(), q2.data(), n, 1.0f / 1024);
      CHECK(same_bits(d1, d2));
      if (n) CHECK(ref.max_abs(b.data(), n) == k->max_abs(b.data(), n));
    }
  }
}

TEST(float64_variants_agree_bitwise) {
  const Kernels& ref = *kernels_named("scalar");
  for (const Kernels* k : variants()) {
    for (size_t n : {0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 180, 1117, 2235}) {
      auto a = random_doubles(n, 11 + n, 1.0), b = random_doubles(n, 12 + n, 1e6);
      if (n > 8) {
        // Narrowing edge cases: a tie between two floats (to even), beyond the float range,
        // below the smallest float subnormal, negative zero, infinity, and a NaN with a payload.
        a[0] = 1.0 + 0x1p-24;
        a[1] = 1.0 + 3 * 0x1p-24;
        a[2] = 1e39;
        a[3] = -1e-50;
        a[4] = -0.0;
        a[5] = -INFINITY;
        a[6] = std::nan("0x123456789");
        a[7] = 0x1p-149 * 1.5;
      }
      std::vector<double> s1 = a, s2 = a;
      ref.add_f64(s1.data(), b.data(), n);
      k->add_f64(s2.data(), b.data(), n);
      CHECK(same_bits(s1, s2));
      std::vector<float> f1(n), f2(n);
      ref.f64_to_f32(f1.data(), a.data(), n);
      k->f64_to_f32(f2.data(), a.data(), n);
      CHECK(same_bits(f1, f2));
      std::vector<double> w1(n), w2(n);
      ref.f32_to_f64(w1.data(), f1.data(), n);
      k->f32_to_f64(w2.data(), f1.data(), n);
      CHECK(same_bits(w1, w2));
      std::vector<int32_t> q1(n), q2(n);
      ref.quantize_f64(q1.data(), b.data(), n, 0x1p-3);  // |b| < 2^31 / 2^-3 by far
      k->quantize_f64(q2.data(), b.data(), n, 0x1p-3);
      CHECK(same_bits(q1, q2));
      std::vector<double> d1(n), d2(n);
      ref.dequantize_f64(d1.data(), q1.data(), n, 0x1p3);
      k->dequantize_f64(d2.data(), q2.data(), n, 0x1p3);
      CHECK(same_bits(d1, d2));
      if (n) {
        CHECK(ref.max_abs_f64(b.data(), n) == k->max_abs_f64(b.data(), n));
        CHECK(std::isnan(k->max_abs_f64(a.data(), n)) == std::isnan(ref.max_abs_f64(a.data(), n)));
      }
    }
  }
}

TEST(float64_known_values) {
  for (const Kernels* k : variants()) {
    std::vector<double> a = {1.0 + 0x1p-24, 1.0 + 3 * 0x1p-24, 1e39, 0.1, -2.5, 0x1p-1074};
    std::vector<float> f(a.size());
    k->f64_to_f32(f.data(), a.data(), a.size());
    CHECK(f[0] == 1.0f);             // tie: to even (down)
    CHECK(f[1] == 1.0f + 0x1p-22f);  // tie: to even (up)
    CHECK(std::isinf(f[2]));
    CHECK(f[3] == 0.1f && f[4] == -2.5f && f[5] == 0.0f);
    // Summing in fp64 keeps what fp32 loses: 2^24 + 1 is exact.
    std::vector<double> x(9, 0x1p24), one(9, 1.0);
    k->add_f64(x.data(), one.data(), x.size());
    CHECK(x[0] == 16777217.0 && x[8] == 16777217.0);
    std::vector<int32_t> q(3);
    std::vector<double> v = {2.5, 3.5, -2.5};
    k->quantize_f64(q.data(), v.data(), 3, 1.0);
    CHECK(q[0] == 2 && q[1] == 4 && q[2] == -2);  // round half to even
    CHECK(k->max_abs_f64(v.data(), 3) == 3.5);
  }
}

TEST(int32_sum_wraps_without_ub) {
  for (const Kernels* k : variants()) {
    std::vector<int32_t> a(20, INT32_MAX), b(20, 1);
    k->add_i32(a.data(), b.data(), a.size());
    CHECK(a[0] == INT32_MIN && a[19] == INT32_MIN);
  }
}

TEST(half_conversions_known_values) {
  CHECK_EQ(f32_to_f16_scalar(1.0f), 0x3C00);
  CHECK_EQ(f32_to_f16_scalar(-2.0f), 0xC000);
  CHECK_EQ(f32_to_f16_scalar(65504.0f), 0x7BFF);
  CHECK_EQ(f32_to_f16_scalar(65520.0f), 0x7C00);            // ties to even: overflow
  CHECK_EQ(f32_to_f16_scalar(5.96046448e-08f), 0x0001);     // smallest subnormal
  CHECK_EQ(f32_to_f16_scalar(1.0f + 1.0f / 2048), 0x3C00);  // halfway: to even
  CHECK_EQ(f32_to_f16_scalar(1.0f + 3.0f / 2048), 0x3C02);  // halfway: to even (up)
  CHECK(f16_to_f32_scalar(0x3555) > 0.333f && f16_to_f32_scalar(0x3555) < 0.334f);
  CHECK_EQ(f32_to_bf16_scalar(1.0f), 0x3F80);
  CHECK_EQ(f32_to_bf16_scalar(1.00390625f), 0x3F80);  // halfway: to even
  CHECK_EQ(f32_to_bf16_scalar(1.01171875f), 0x3F82);  // halfway: to even (up)
  CHECK(bf16_to_f32_scalar(0x4049) == 3.140625f);
}

TEST(fixed_point_exponents) {
  CHECK_EQ(block_exponent(0.0f), GS_EXP_NONE);
  CHECK_EQ(block_exponent(1.0f), 1);   // 1 < 2^1
  CHECK_EQ(block_exponent(0.75f), 0);  // 0.75 < 2^0
  CHECK_EQ(block_exponent(1e-40f), kMinBlockExp);
  CHECK_EQ(ceil_log2(1), 0);
  CHECK_EQ(ceil_log2(3), 2);
  CHECK_EQ(ceil_log2(8), 3);
  // With E and N, every |q| <= 2^(30 - ceil(log2 N)): the sum of N fits in int32.
  CHECK_EQ(block_exponent(1.0), 1);
  CHECK_EQ(block_exponent(0x1p-200), kMinBlockExp);  // doubles below float range clamp like floats
  CHECK_EQ(block_exponent(0.0), GS_EXP_NONE);
  const int s = scale_exponent(block_exponent(1.0f), 8);
  CHECK_EQ(s, 26);
  CHECK(std::ldexp(1.0, s) * 8 <= 2147483647.0);
}

GS_TEST_MAIN()
