// The mx8 kernels (docs/protocol.md 2.2), every variant this CPU runs, against an independent
// reference: nearest E4M3 value by search over the code table, the block scale from std::frexp, and
// the spec's special cases.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/kernels_mx8.h"
#include "gradswitch/wire.h"
#include "harness.h"
#include "kernel_variants.h"

using namespace gradswitch;

namespace {

// The E4M3 value of a code, from the spec's formula (not the kernels' table).
double e4m3_value(unsigned b) {
  const unsigned e = (b >> 3) & 15, m = b & 7;
  const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, static_cast<int>(e) - 7);
  return (b & 0x80) ? -v : v;
}

// Nearest finite code to v by exhaustive search, ties to the even code, |v| > 448 saturating.
uint8_t reference_e4m3(double v) {
  const unsigned sign = std::signbit(v) ? 0x80 : 0;
  const double a = std::fabs(v);
  unsigned best = 0;
  for (unsigned b = 1; b <= 0x7E; ++b) {
    const double d = std::fabs(e4m3_value(b) - a), dbest = std::fabs(e4m3_value(best) - a);
    if (d < dbest || (d == dbest && b % 2 == 0)) best = b;
  }
  return static_cast<uint8_t>(sign | best);
}

// The spec's scale exponent of a finite, non-zero block maximum.
int reference_scale_exp(float amax) {
  int e;
  std::frexp(amax, &e);  // amax = f * 2^e, f in [0.5, 1): floor(log2 amax) = e - 1
  return std::max(e - 1 - 8, -127);
}

std::vector<uint8_t> encode(const Kernels& k, const std::vector<float>& x) {
  std::vector<uint8_t> p(gs_payload_bytes(GS_ELEM_MX8, x.size()));
  k.f32_to_mx8(p.data(), x.data(), x.size());
  return p;
}
std::vector<float> decode(const Kernels& k, const std::vector<uint8_t>& p, size_t n) {
  std::vector<float> y(n);
  k.mx8_to_f32(y.data(), p.data(), n);
  return y;
}

// Every code, every midpoint between neighbours (the ties), and the floats just beside each, with
// both signs; then random values of every E4M3 binade and the saturating ones.
std::vector<float> e4m3_probes() {
  std::vector<float> probes;
  for (unsigned b = 0; b < 0x7E; ++b) {
    const float lo = static_cast<float>(e4m3_value(b)), hi = static_cast<float>(e4m3_value(b + 1));
    const float mid = (lo + hi) / 2;
    for (float v : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      probes.push_back(v);
      probes.push_back(-v);
    }
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-520.0f, 520.0f);
  for (int i = 0; i < 20000; ++i) probes.push_back(d(rng) / static_cast<float>(1 << (i % 12)));
  for (float v : {448.0f, 463.99f, 464.0f, 470.0f, 511.9f}) probes.push_back(v);
  return probes;
}

}  // namespace

TEST(mx8_payload_sizes) {
  CHECK_EQ(gs_payload_bytes(GS_ELEM_MX8, 0), 0u);
  CHECK_EQ(gs_payload_bytes(GS_ELEM_MX8, 1), 2u);
  CHECK_EQ(gs_payload_bytes(GS_ELEM_MX8, 32), 33u);
  CHECK_EQ(gs_payload_bytes(GS_ELEM_MX8, 33), 35u);
  CHECK_EQ(gs_payload_bytes(GS_ELEM_FLOAT16, 33), 66u);
  CHECK_EQ(gs_max_count(GS_ELEM_MX8, 1440), 1376u);
  CHECK_EQ(gs_max_count(GS_ELEM_MX8, 68), 64u);
  CHECK_EQ(gs_max_count(GS_ELEM_FLOAT32, 1440), 360u);
}

TEST(e4m3_codes_decode_as_specified) {
  for (unsigned b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) {
      CHECK(std::isnan(e4m3_to_f32(static_cast<uint8_t>(b))));
      continue;
    }
    CHECK_EQ(static_cast<double>(e4m3_to_f32(static_cast<uint8_t>(b))), e4m3_value(b));
  }
  CHECK_EQ(e4m3_to_f32(0x7E), 448.0f);
  CHECK_EQ(e4m3_to_f32(0x08), 0x1p-6f);
  CHECK_EQ(e4m3_to_f32(0x01), 0x1p-9f);
}

TEST(e4m3_rounding_matches_exhaustive_search) {
  std::vector<float> probes = e4m3_probes();
  for (float v : {1e30f, INFINITY, -INFINITY}) probes.push_back(v);
  for (float v : probes) {
    const uint8_t got = e4m3_from_f32(v), want = reference_e4m3(v);
    if (got != want) std::printf("  %a: got 0x%02x, want 0x%02x\n", static_cast<double>(v), got, want);
    CHECK_EQ(got, want);
  }
}

TEST(e4m3_ties_go_to_even) {
  CHECK_EQ(e4m3_from_f32(1.0625f), 0x38);   // between 1 (0x38) and 1.125 (0x39): even 0x38
  CHECK_EQ(e4m3_from_f32(1.1875f), 0x3A);   // between 1.125 and 1.25 (0x3A)
  CHECK_EQ(e4m3_from_f32(0x1p-10f), 0x00);  // half the smallest subnormal: to zero
  CHECK_EQ(e4m3_from_f32(0x3p-10f), 0x02);  // between 2^-9 (0x01) and 2^-8 (0x02)
  CHECK_EQ(e4m3_from_f32(-0x3p-10f), 0x82);
  CHECK_EQ(e4m3_from_f32(464.0f), 0x7E);  // between 448 and the (absent) 480: saturates anyway
  CHECK_EQ(e4m3_from_f32(-1e30f), 0xFE);
}

TEST(mx8_block_elements_match_exhaustive_search_in_every_variant) {
  // The probes (all below 512) in blocks whose largest element is in [256, 512), so the block's
  // scale exponent is 0, then scaled by 2^k: each element byte is the nearest E4M3 code to its probe.
  // k spans the exponents at which every probe's bits stay a normal binary32.
  std::vector<float> probes;
  for (float v : e4m3_probes())
    if (std::fabs(v) < 512) probes.push_back(v);
  for (const Kernels* k : variants()) {
    for (int e : {-92, -40, -8, 0, 7, 60, 118}) {
      for (size_t first = 0; first < probes.size(); first += GS_MX8_BLOCK - 1) {
        std::vector<float> x = {std::ldexp(300.0f, e)};  // the block maximum's binade: scale 2^e
        for (size_t i = first; i < std::min(first + GS_MX8_BLOCK - 1, probes.size()); ++i)
          x.push_back(std::ldexp(probes[i], e));
        const auto p = encode(*k, x);
        CHECK_EQ(p[0], 127 + e);
        for (size_t i = 1; i < x.size(); ++i) {
          const uint8_t want = reference_e4m3(std::ldexp(static_cast<double>(x[i]), -e));
          if (p[1 + i] != want)
            std::printf("  %s: %a * 2^%d: got 0x%02x, want 0x%02x\n", k->name,
                        std::ldexp(static_cast<double>(x[i]), -e), e, p[1 + i], want);
          CHECK_EQ(p[1 + i], want);
        }
      }
    }
  }
}

TEST(mx8_block_scale_is_floor_log2_minus_8) {
  for (const Kernels* kp : variants()) {
    const Kernels& k = *kp;
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> mant(1.0f, 2.0f);
    std::uniform_int_distribution<int> ex(-140, 127);
    for (int i = 0; i < 2000; ++i) {
      std::vector<float> x(32, 0.0f);
      const float amax = std::ldexp(mant(rng), ex(rng));
      if (!std::isfinite(amax) || amax == 0) continue;
      x[static_cast<size_t>(i) % 32] = (i % 2) ? -amax : amax;
      const auto p = encode(k, x);
      CHECK_EQ(static_cast<int>(p[0]) - 127, reference_scale_exp(amax));
    }
    CHECK_EQ(encode(k, {1.0f})[0], 0x77);       // 2^0: exponent -8, byte 119
    CHECK_EQ(encode(k, {0x1p-130f})[0], 0x00);  // a subnormal block maximum clamps at -127
  }
}

TEST(mx8_elements_round_like_the_reference) {
  for (const Kernels* kp : variants()) {
    const Kernels& k = *kp;
    std::mt19937 rng(3);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<float> x(32);
      const float mag = std::ldexp(1.0f, trial % 60 - 30);
      for (auto& v : x) v = d(rng) * mag;
      const auto p = encode(k, x);
      const int s = static_cast<int>(p[0]) - 127;
      for (size_t i = 0; i < 32; ++i)
        CHECK_EQ(p[1 + i], reference_e4m3(std::ldexp(static_cast<double>(x[i]), -s)));
    }
  }
}

TEST(mx8_round_trip_bounds_and_saturation) {
  for (const Kernels* kp : variants()) {
    const Kernels& k = *kp;
    std::mt19937 rng(5);
    std::normal_distribution<float> d(0.0f, 3.0f);
    std::vector<float> x(1000);
    for (auto& v : x) v = d(rng);
    const auto y = decode(k, encode(k, x), x.size());
    for (size_t b = 0; b < x.size(); b += 32) {
      float amax = 0;
      for (size_t i = b; i < std::min(b + 32, x.size()); ++i) amax = std::max(amax, std::fabs(x[i]));
      const double q = std::ldexp(1.0, reference_scale_exp(amax));  // element unit: value = code * q
      for (size_t i = b; i < std::min(b + 32, x.size()); ++i) {
        const double err = std::fabs(static_cast<double>(y[i]) - x[i]);
        if (std::fabs(x[i]) > 464 * q) {
          CHECK_EQ(static_cast<double>(std::fabs(y[i])), 448 * q);  // saturated, sign kept
          CHECK(std::signbit(y[i]) == std::signbit(x[i]));
        } else {
          // Half an E4M3 step: 2^-4 relative among normals, 2^-10 * q among subnormals.
          CHECK(err <= std::max(std::fabs(x[i]) * 0x1p-4, 0x1p-10 * q));
        }
      }
    }
    // A block of values in [1.75, 2) * 2^k saturates them all to 1.75 * 2^k.
    const auto s = decode(k, encode(k, {1.9375f, -1.875f, 1.8f}), 3);
    CHECK(s == std::vector<float>({1.75f, -1.75f, 1.75f}));
  }
}

TEST(mx8_nan_and_infinity_poison_their_block_only) {
  for (const Kernels* kp : variants()) {
    const Kernels& k = *kp;
    std::vector<float> x(70, 1.5f);
    x[40] = NAN;
    x[69] = -INFINITY;
    const auto p = encode(k, x);
    CHECK_EQ(p.size(), 73u);
    CHECK_EQ(p[33], GS_MX8_SCALE_NAN);
    CHECK_EQ(p[66], GS_MX8_SCALE_NAN);
    const auto y = decode(k, p, x.size());
    for (size_t i = 0; i < 32; ++i) CHECK_EQ(y[i], 1.5f);
    for (size_t i = 32; i < 70; ++i) CHECK(std::isnan(y[i]));
  }
}

TEST(every_element_byte_decodes_as_specified_in_every_variant) {
  // A peer may send any byte, including 0x7F/0xFF (E4M3's NaN codes, which no encoder writes), under
  // any finite scale: each decodes as docs/protocol.md 2.2's formula, and decode and add agree.
  std::vector<uint8_t> payload;
  std::vector<float> want;
  for (unsigned scale : {1u, 64u, 120u, 127u, 130u, 200u, 254u}) {
    for (unsigned first = 0; first < 256; first += GS_MX8_BLOCK) {
      payload.push_back(static_cast<uint8_t>(scale));
      for (unsigned b = first; b < first + GS_MX8_BLOCK; ++b) {
        payload.push_back(static_cast<uint8_t>(b));
        const bool nan = (b & 0x7F) == 0x7F;
        want.push_back(nan ? NAN
                           : static_cast<float>(std::ldexp(e4m3_value(b), static_cast<int>(scale) - 127)));
      }
    }
  }
  for (const Kernels* k : variants()) {
    const auto y = decode(*k, payload, want.size());
    std::vector<float> sum(want.size(), 0.0f);
    k->add_mx8_to_f32(sum.data(), payload.data(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isnan(want[i])) {
        CHECK(std::isnan(y[i]));
        CHECK(std::isnan(sum[i]));
      } else {
        if (y[i] != want[i] || sum[i] != want[i])
          std::printf("  %s: element %zu: got %a / %a, want %a\n", k->name, i, y[i], sum[i], want[i]);
        CHECK_EQ(y[i], want[i]);
        CHECK_EQ(sum[i], want[i]);
      }
    }
  }
}

TEST(mx8_zero_block_and_partial_last_block) {
  for (const Kernels* kp : variants()) {
    const Kernels& k = *kp;
    std::vector<float> x(37, 0.0f);
    x[3] = -0.0f;
    x[33] = 3.0f;
    x[36] = -0.25f;
    const auto p = encode(k, x);
    CHECK_EQ(p.size(), 39u);   // a block of 32 and one of 5
    CHECK_EQ(p[0], 0x00);      // all-zero block: scale byte 0
    CHECK_EQ(p[1 + 3], 0x80);  // -0 keeps its sign
    for (size_t i = 0; i < 32; ++i)
      if (i != 3) CHECK_EQ(p[1 + i], 0x00);
    CHECK_EQ(p[33], 127 + 1 - 8);  // 3 = 1.5 * 2^1
    const auto y = decode(k, p, x.size());
    for (size_t i = 0; i < x.size(); ++i) CHECK_EQ(y[i], x[i]);  // all exact
    CHECK(std::signbit(y[3]));
    std::vector<float> acc(x.size(), 1.0f);
    k.add_mx8_to_f32(acc.data(), p.data(), x.size());
    CHECK_EQ(acc[33], 4.0f);
    CHECK_EQ(acc[36], 0.75f);
  }
}

TEST(mx8_reencoding_a_decoded_payload_gives_its_bytes) {
  for (const Kernels* kp : variants()) {
    const Kernels& k = *kp;
    std::mt19937 rng(9);
    std::normal_distribution<float> d(0.0f, 0.01f);
    std::vector<float> x(500);
    for (auto& v : x) v = d(rng);
    const auto p = encode(k, x);
    CHECK(encode(k, decode(k, p, x.size())) == p);
  }
}

GS_TEST_MAIN()
