// Every SIMD variant must give the scalar variant's bits, at every length (tails included), and at
// addresses that no vector width divides.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/fixed_point.h"
#include "common/kernels.h"
#include "gradswitch/wire.h"
#include "harness.h"
#include "kernel_variants.h"

using namespace gradswitch;

namespace {

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

namespace {

// mx8 encoder input: blocks of normal values of random magnitude (so every scale byte from 0 to
// 246 turns up), each block with a few of the values that need care: zeros of both signs, binary32
// subnormals, E4M3's ties and its saturation at 448 (relative to the block's scale), the largest
// floats, and in a few blocks a NaN or an infinity.
std::vector<float> mx8_input(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-150, 127), pick(0, 15);
  std::vector<float> x(n);
  int e = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i % GS_MX8_BLOCK == 0) e = ex(rng);
    const float t = std::ldexp(1.0f, e < -120 ? -120 : (e > 118 ? 118 : e));  // the block's unit
    float v = std::ldexp(d(rng), e);
    switch (pick(rng)) {
      case 0:
        v = (i & 1) ? -0.0f : 0.0f;
        break;
      case 1:
        v = std::ldexp(static_cast<float>(rng() % 64) - 32, -149);
        break;  // subnormal floats
      case 2:
        v = t * (1.0f + (2 * static_cast<float>(rng() % 8) + 1) / 16);
        break;  // an E4M3 tie
      case 3:
        v = t * 0x1p-9f * static_cast<float>(rng() % 16) / 2;
        break;  // subnormal codes, ties
      case 4:
        v = -t * (1.75f + static_cast<float>(rng() % 32) / 128);
        break;  // 1.75..2: saturates
      case 5:
        v = (i % 7 == 0) ? 3.4028235e38f : v;
        break;
      case 6:
        v = (i % 97 == 5) ? NAN : ((i % 89 == 3) ? -INFINITY : v);
        break;
      default:
        break;
    }
    x[i] = v;
  }
  return x;
}

// Random payload bytes: every element code, NaN codes included, under scale bytes that include
// 0 (a subnormal scale), 254 (products that overflow to infinity) and 255 (a NaN block).
std::vector<uint8_t> mx8_random_payload(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> p(gs_payload_bytes(GS_ELEM_MX8, n));
  for (auto& b : p) b = static_cast<uint8_t>(rng());
  const uint8_t scales[] = {0, 1, 2, 100, 127, 200, 246, 254, 255};
  for (size_t b = 0; b < p.size(); b += GS_MX8_BLOCK_BYTES)
    if (rng() % 2) p[b] = scales[rng() % sizeof scales];
  return p;
}

}  // namespace

TEST(mx8_variants_agree_bitwise) {
  const Kernels& ref = *kernels_named("scalar");
  for (const Kernels* k : variants()) {
    for (size_t n : {0, 1, 5, 31, 32, 33, 63, 64, 65, 100, 1375, 1376, 1377, 2752}) {
      for (size_t shift : {0, 1, 3}) {  // a float or byte offset, so no vector width divides the address
        const uint32_t seed = static_cast<uint32_t>(31 * n + shift);
        std::vector<float> x(n + shift);
        const std::vector<float> in = mx8_input(n, seed);
        std::copy(in.begin(), in.end(), x.begin() + static_cast<std::ptrdiff_t>(shift));
        const size_t bytes = gs_payload_bytes(GS_ELEM_MX8, n);
        std::vector<uint8_t> p1(bytes + shift), p2(bytes + shift);
        ref.f32_to_mx8(p1.data() + shift, x.data() + shift, n);
        k->f32_to_mx8(p2.data() + shift, x.data() + shift, n);
        CHECK(same_bits(p1, p2));
        // Decoding: the encoder's payload, and random bytes (what a peer could send).
        std::vector<uint8_t> r(shift);
        const std::vector<uint8_t> random = mx8_random_payload(n, seed);
        r.insert(r.end(), random.begin(), random.end());
        for (const std::vector<uint8_t>* p : {&p1, &r}) {
          std::vector<float> y1(n + shift, 7.0f), y2 = y1;
          ref.mx8_to_f32(y1.data() + shift, p->data() + shift, n);
          k->mx8_to_f32(y2.data() + shift, p->data() + shift, n);
          CHECK(same_bits(y1, y2));
          // Adding into a sum that holds normal values, infinities and NaNs.
          std::vector<float> s1 = mx8_input(n + shift, seed + 1), s2 = s1;
          ref.add_mx8_to_f32(s1.data() + shift, p->data() + shift, n);
          k->add_mx8_to_f32(s2.data() + shift, p->data() + shift, n);
          CHECK(same_bits(s1, s2));
        }
      }
    }
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
