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
    if (const Kernels* k = kernels_named(name)) v.push_back(k);
    else std::printf("  (variant %s not supported on this CPU: not compared)\n", name);
  return v;
}

std::vector<float> random_floats(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
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
  CHECK_EQ(f32_to_f16_scalar(65520.0f), 0x7C00);               // ties to even: overflow
  CHECK_EQ(f32_to_f16_scalar(5.96046448e-08f), 0x0001);        // smallest subnormal
  CHECK_EQ(f32_to_f16_scalar(1.0f + 1.0f / 2048), 0x3C00);     // halfway: to even
  CHECK_EQ(f32_to_f16_scalar(1.0f + 3.0f / 2048), 0x3C02);     // halfway: to even (up)
  CHECK(f16_to_f32_scalar(0x3555) > 0.333f && f16_to_f32_scalar(0x3555) < 0.334f);
  CHECK_EQ(f32_to_bf16_scalar(1.0f), 0x3F80);
  CHECK_EQ(f32_to_bf16_scalar(1.00390625f), 0x3F80);           // halfway: to even
  CHECK_EQ(f32_to_bf16_scalar(1.01171875f), 0x3F82);           // halfway: to even (up)
  CHECK(bf16_to_f32_scalar(0x4049) == 3.140625f);
}

TEST(fixed_point_exponents) {
  CHECK_EQ(block_exponent(0.0f), GS_EXP_NONE);
  CHECK_EQ(block_exponent(1.0f), 1);    // 1 < 2^1
  CHECK_EQ(block_exponent(0.75f), 0);   // 0.75 < 2^0
  CHECK_EQ(block_exponent(1e-40f), kMinBlockExp);
  CHECK_EQ(ceil_log2(1), 0);
  CHECK_EQ(ceil_log2(3), 2);
  CHECK_EQ(ceil_log2(8), 3);
  // With E and N, every |q| <= 2^(30 - ceil(log2 N)): the sum of N fits in int32.
  const int s = scale_exponent(block_exponent(1.0f), 8);
  CHECK_EQ(s, 26);
  CHECK(std::ldexp(1.0, s) * 8 <= 2147483647.0);
}

GS_TEST_MAIN()
