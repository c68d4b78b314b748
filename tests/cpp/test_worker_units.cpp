// The worker's data-path units alone: chunk codec per wire type, the slot window, the stream
// schedule and the concede policy. (The loss detector and RTT estimator, in src/common, have
// test_common_loss.cpp.)
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/header.h"
#include "common/kernels.h"
#include "gradswitch/wire.h"
#include "harness.h"
#include "worker/chunk_codec.h"
#include "worker/errors.h"
#include "worker/stream_schedule.h"
#include "worker/switch/concede_policy.h"
#include "worker/window.h"

using namespace gradswitch;
using namespace gradswitch::worker;

TEST(chunking_sizes) {
  Chunking c = make_chunking(1000, GS_ELEM_FLOAT32, 1440);
  CHECK_EQ(c.per, 360u);
  CHECK_EQ(c.chunks, size_t{3});
  CHECK_EQ(c.offset(2), 720u);
  CHECK_EQ(static_cast<unsigned>(c.size(0)), 360u);
  CHECK_EQ(static_cast<unsigned>(c.size(2)), 280u);
  Chunking h = make_chunking(720, GS_ELEM_FLOAT16, 1440);
  CHECK_EQ(h.per, 720u);
  CHECK_EQ(h.chunks, size_t{1});
  // The header's count field caps a chunk at 65535 elements whatever the payload.
  Chunking big = make_chunking(200000, GS_ELEM_FLOAT16, 8940 * 100);
  CHECK_EQ(big.per, 65535u);
  CHECK_EQ(big.chunks, size_t{4});
}

TEST(shards_stripe_chunks_by_number) {
  // 10 chunks of 360 float32 (the last one 100 elements) over 3 switches: 0,3,6,9 / 1,4,7 / 2,5,8.
  Chunking whole = make_chunking(9 * 360 + 100, GS_ELEM_FLOAT32, 1440);
  CHECK_EQ(whole.chunks, size_t{10});
  Chunking a = shard_chunking(whole, 0, 3), b = shard_chunking(whole, 1, 3), c = shard_chunking(whole, 2, 3);
  CHECK_EQ(a.chunks, size_t{4});
  CHECK_EQ(b.chunks, size_t{3});
  CHECK_EQ(c.chunks, size_t{3});
  CHECK_EQ(a.offset(3), uint32_t{9 * 360});
  CHECK_EQ(a.size(3), uint16_t{100});
  CHECK_EQ(b.offset(2), uint32_t{7 * 360});
  CHECK_EQ(c.size(2), uint16_t{360});
  // A tensor of fewer chunks than switches leaves the last ones out.
  Chunking small = make_chunking(400, GS_ELEM_FLOAT32, 1440);
  CHECK_EQ(shard_chunking(small, 1, 3).chunks, size_t{1});
  CHECK_EQ(shard_chunking(small, 2, 3).chunks, size_t{0});
  // A shard's chunks encode and decode where they belong in the tensor.
  std::vector<float> x(whole.count), y(whole.count, 0.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  std::vector<uint8_t> payload(1440);
  for (const Chunking* s : {&a, &b, &c})
    for (size_t k = 0; k < s->chunks; ++k) {
      encode_chunk(*s, x.data(), k, 0, payload.data());
      decode_chunk(*s, payload.data(), k, 0, y.data());
    }
  CHECK(x == y);
}

TEST(codec_roundtrip_every_wire) {
  std::vector<float> src(700);
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = std::ldexp(static_cast<float>(static_cast<int>(i % 97) - 48), -3);
  for (uint8_t elem : {GS_ELEM_FLOAT32, GS_ELEM_FLOAT16, GS_ELEM_BFLOAT16, GS_ELEM_FIXED32}) {
    Chunking ch = make_chunking(src.size(), elem, 1440);
    std::vector<int8_t> exps;
    if (elem == GS_ELEM_FIXED32) block_exponents(ch, src.data(), &exps);
    std::vector<float> out(src.size(), -1.0f);
    std::vector<uint8_t> payload(1440);
    for (size_t c = 0; c < ch.chunks; ++c) {
      int scale = elem == GS_ELEM_FIXED32 ? 30 - exps[c] : 0;
      size_t len = encode_chunk(ch, src.data(), c, scale, payload.data());
      CHECK_EQ(len, gs_payload_bytes(ch.elem, ch.size(c)));
      decode_chunk(ch, payload.data(), c, scale, out.data());
    }
    // Multiples of 1/8 below 8 are exact in every wire type.
    CHECK(out == src);
  }
  std::vector<int32_t> isrc(500);
  for (size_t i = 0; i < isrc.size(); ++i) isrc[i] = static_cast<int32_t>(i * 2654435761u);
  Chunking ch = make_chunking(isrc.size(), GS_ELEM_INT32, 1440);
  std::vector<int32_t> iout(isrc.size());
  std::vector<uint8_t> payload(1440);
  for (size_t c = 0; c < ch.chunks; ++c) {
    encode_chunk(ch, isrc.data(), c, 0, payload.data());
    CHECK(std::memcmp(payload.data(), isrc.data() + ch.offset(c), ch.size(c) * 4) ==
          0);  // little-endian as is
    decode_chunk(ch, payload.data(), c, 0, iout.data());
  }
  CHECK(iout == isrc);
}

TEST(codec_mx8_chunks_are_whole_blocks) {
  // 3000 values: two full chunks of 43 blocks (1376 elements) and a last one of 248 (7 blocks and 24).
  std::vector<float> src(3000);
  std::vector<double> dsrc(src.size());
  for (size_t i = 0; i < src.size(); ++i) dsrc[i] = src[i] = std::sin(static_cast<float>(i)) * (1 + i % 7);
  Chunking ch = make_chunking(src.size(), GS_ELEM_MX8, 1440);
  Chunking dch = make_chunking(src.size(), GS_ELEM_MX8, 1440, DType::kFloat64);
  CHECK_EQ(ch.per, 1376u);
  CHECK_EQ(ch.chunks, 3u);
  std::vector<float> out(src.size());
  std::vector<double> dout(src.size());
  std::vector<uint8_t> payload(1440), dpayload(1440);
  for (size_t c = 0; c < ch.chunks; ++c) {
    const size_t len = encode_chunk(ch, src.data(), c, 0, payload.data());
    CHECK_EQ(len, size_t{ch.size(c)} + (size_t{ch.size(c)} + 31) / 32);
    // Doubles are rounded to float32 through a stage: the same bytes as the float32 tensor's.
    CHECK_EQ(encode_chunk(dch, dsrc.data(), c, 0, dpayload.data()), len);
    CHECK(std::memcmp(payload.data(), dpayload.data(), len) == 0);
    decode_chunk(ch, payload.data(), c, 0, out.data());
    decode_chunk(dch, payload.data(), c, 0, dout.data());
  }
  for (size_t i = 0; i < src.size(); ++i) {
    CHECK(std::fabs(out[i] - src[i]) <= 7 * 0x1p-4f);  // half a step of the largest block's binade
    CHECK_EQ(dout[i], static_cast<double>(out[i]));
  }
  bool refused = false;
  try {
    make_chunking(10, GS_ELEM_MX8, 32);  // no room for one block
  } catch (const InvalidArgument&) {
    refused = true;
  }
  CHECK(refused);
}

TEST(codec_float64_tensors_on_every_float_wire) {
  // Multiples of 1/8 below 8 are exact in every wire type; one value needs float64's precision.
  std::vector<double> src(500);
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = std::ldexp(static_cast<double>(static_cast<int>(i % 97) - 48), -3);
  for (uint8_t elem :
       {GS_ELEM_FLOAT64, GS_ELEM_FLOAT32, GS_ELEM_FLOAT16, GS_ELEM_BFLOAT16, GS_ELEM_FIXED32}) {
    Chunking ch = make_chunking(src.size(), elem, 1440, DType::kFloat64);
    CHECK_EQ(ch.per, 1440u / gs_elem_size(elem));
    std::vector<int8_t> exps;
    if (elem == GS_ELEM_FIXED32) block_exponents(ch, src.data(), &exps);
    std::vector<double> out(src.size(), -1.0);
    std::vector<uint8_t> payload(1440 + 4);
    for (size_t c = 0; c < ch.chunks; ++c) {
      int scale = elem == GS_ELEM_FIXED32 ? 30 - exps[c] : 0;
      CHECK_EQ(encode_chunk(ch, src.data(), c, scale, payload.data()), gs_payload_bytes(ch.elem, ch.size(c)));
      // A received datagram may start 4 bytes off an 8-byte boundary: decoding copes.
      std::memmove(payload.data() + 4, payload.data(), gs_payload_bytes(ch.elem, ch.size(c)));
      decode_chunk(ch, payload.data() + 4, c, scale, out.data());
    }
    CHECK(out == src);
  }
  // On the float64 wire a double travels bit for bit; fixed32 from doubles keeps 30 bits.
  std::vector<double> fine = {1.0 + 0x1p-40, -3.0, 0.3};
  Chunking f64 = make_chunking(fine.size(), GS_ELEM_FLOAT64, 1440, DType::kFloat64);
  std::vector<uint8_t> payload(1440);
  encode_chunk(f64, fine.data(), 0, 0, payload.data());
  CHECK(std::memcmp(payload.data(), fine.data(), 24) == 0);
  Chunking fx = make_chunking(fine.size(), GS_ELEM_FIXED32, 1440, DType::kFloat64);
  std::vector<int8_t> exps;
  block_exponents(fx, fine.data(), &exps);
  CHECK_EQ(static_cast<int>(exps[0]), 2);  // 3 < 2^2
  std::vector<double> back(3);
  encode_chunk(fx, fine.data(), 0, 28, payload.data());
  decode_chunk(fx, payload.data(), 0, 28, back.data());
  CHECK(back[1] == -3.0 && std::fabs(back[2] - 0.3) <= 0x1p-29 && back[2] != static_cast<double>(0.3f));
  // A float32 tensor on the float64 wire: widened exactly, and back.
  std::vector<float> f32 = {0.1f, -2.5f, 3e38f};
  Chunking wide = make_chunking(f32.size(), GS_ELEM_FLOAT64, 1440, DType::kFloat32);
  encode_chunk(wide, f32.data(), 0, 0, payload.data());
  double d1;
  std::memcpy(&d1, payload.data(), 8);
  CHECK(d1 == static_cast<double>(0.1f));
  std::vector<float> f32_back(3);
  decode_chunk(wide, payload.data(), 0, 0, f32_back.data());
  CHECK(f32_back == f32);
}

TEST(block_exponents_and_rejection) {
  std::vector<float> v(720, 0.0f);
  v[5] = 3.0f;    // chunk 0: max 3 < 2^2
  v[400] = 0.5f;  // chunk 1: max 0.5 < 2^0
  Chunking ch = make_chunking(1000, GS_ELEM_FIXED32, 1440);
  v.resize(1000, 0.0f);  // chunk 2 all zero
  std::vector<int8_t> e;
  block_exponents(ch, v.data(), &e);
  CHECK_EQ(static_cast<int>(e[0]), 2);
  CHECK_EQ(static_cast<int>(e[1]), 0);
  CHECK_EQ(static_cast<int>(e[2]), GS_EXP_NONE);
  v[777] = INFINITY;
  std::string msg;
  try {
    block_exponents(ch, v.data(), &e);
  } catch (const InvalidArgument& ex) {
    msg = ex.what();
  }
  CHECK(msg.find("element 777") != std::string::npos);
  std::vector<double> d(1000, 0.0);
  d[999] = 1e300;  // finite, but beyond what fixed32 carries
  Chunking dch = make_chunking(d.size(), GS_ELEM_FIXED32, 1440, DType::kFloat64);
  msg.clear();
  try {
    block_exponents(dch, d.data(), &e);
  } catch (const InvalidArgument& ex) {
    msg = ex.what();
  }
  CHECK(msg.find("element 999") != std::string::npos);
}

TEST(codec_accumulate_per_wire) {
  std::vector<float> own = {1.5f, -0.25f, 3.0f, 1e-3f};
  std::vector<uint8_t> in(64), out(64);
  // int32: wrapping.
  std::vector<int32_t> iown = {INT32_MAX, 5, -7, 0};
  Chunking ci = make_chunking(4, GS_ELEM_INT32, 1440);
  int32_t iin[4] = {1, 10, 7, -3};
  std::memcpy(in.data(), iin, 16);
  accumulate_chunk(ci, iown.data(), 0, 0, in.data(), out.data());
  int32_t isum[4];
  std::memcpy(isum, out.data(), 16);
  CHECK(isum[0] == INT32_MIN && isum[1] == 15 && isum[2] == 0 && isum[3] == -3);
  // fixed32: the integer sum of the partial and this rank's quantised values.
  Chunking cx = make_chunking(4, GS_ELEM_FIXED32, 1440);
  int32_t xin[4] = {100, -100, 0, 1};
  std::memcpy(in.data(), xin, 16);
  accumulate_chunk(cx, own.data(), 0, 4, in.data(), out.data());  // scale 2^4
  int32_t xsum[4];
  std::memcpy(xsum, out.data(), 16);
  CHECK(xsum[0] == 124 && xsum[1] == -104 && xsum[2] == 48 && xsum[3] == 1);  // 1e-3 * 16 rounds to 0
  // float16: widened, added in fp32, rounded once.
  Chunking ch = make_chunking(4, GS_ELEM_FLOAT16, 1440);
  uint16_t hin[4];
  for (int i = 0; i < 4; ++i) hin[i] = f32_to_f16_scalar(0.1f * static_cast<float>(i + 1));
  std::memcpy(in.data(), hin, 8);
  accumulate_chunk(ch, own.data(), 0, 0, in.data(), out.data());
  uint16_t hsum[4];
  std::memcpy(hsum, out.data(), 8);
  for (int i = 0; i < 4; ++i) CHECK(hsum[i] == f32_to_f16_scalar(f16_to_f32_scalar(hin[i]) + own[i]));
}

TEST(codec_sums_travel_bit_exactly) {
  // fixed32 sums as floats (their integers are gone once in the tensor); others in their encoding.
  std::vector<float> sum = {0.1f, 1e30f, -3.0e-20f, 16777217.0f};
  std::vector<uint8_t> payload(64);
  for (uint8_t elem : {GS_ELEM_FIXED32, GS_ELEM_FLOAT32}) {
    Chunking c = make_chunking(4, elem, 1440);
    std::vector<float> back(4, 0.0f);
    CHECK_EQ(encode_sum(c, sum.data(), 0, payload.data()), size_t{16});
    decode_sum(c, payload.data(), 0, back.data());
    CHECK(std::memcmp(back.data(), sum.data(), 16) == 0);
  }
  std::vector<float> half = {0.5f, -2.0f, 65504.0f, 0.099975586f};  // float16 values
  Chunking c = make_chunking(4, GS_ELEM_FLOAT16, 1440);
  std::vector<float> back(4, 0.0f);
  CHECK_EQ(encode_sum(c, half.data(), 0, payload.data()), size_t{8});
  decode_sum(c, payload.data(), 0, back.data());
  CHECK(back == half);
}

TEST(window_versions_and_retransmission_flag) {
  Window w(4, 64);
  CHECK_EQ(w.slots(), 4u);
  CHECK_EQ(static_cast<int>(w.claim_version(1)), 0);
  CHECK_EQ(static_cast<int>(w.claim_version(1)), 1);
  CHECK_EQ(static_cast<int>(w.claim_version(1)), 0);
  CHECK_EQ(static_cast<int>(w.claim_version(2)), 0);  // slots flip independently
  gs_header h =
      HeaderBuilder(GS_MSG_DATA, 0, 0).slot(2).flags(1).elems(GS_ELEM_FLOAT32, 3).round(77, 1080).exps(5, -2);
  float vals[3] = {1.5f, -2.0f, 3.25f};
  std::memcpy(w.payload(2), vals, sizeof vals);
  w.seal(2, h, sizeof vals);
  CHECK_EQ(w.round(2).len, GS_HEADER_BYTES + 12u);
  std::vector<uint8_t> before(w.packet(2), w.packet(2) + w.round(2).len);
  w.mark_retransmission(2);
  gs_header got;
  gs_header_decode(w.packet(2), &got);
  CHECK_EQ(static_cast<int>(got.flags), 1 | GS_FLAG_RETX);
  CHECK_EQ(got.seq, 77u);
  CHECK_EQ(got.offset, 1080u);
  CHECK_EQ(static_cast<int>(got.next_exp), 5);
  CHECK_EQ(static_cast<int>(got.scale_exp), -2);
  CHECK(w.round(2).hdr.flags == (1 | GS_FLAG_RETX));
  // Only the flags byte changed.
  std::vector<uint8_t> after(w.packet(2), w.packet(2) + w.round(2).len);
  size_t diffs = 0;
  for (size_t i = 0; i < before.size(); ++i) diffs += before[i] != after[i];
  CHECK_EQ(diffs, size_t{1});
}

TEST(stream_schedule_numbers_chunks_across_allreduces) {
  // 4 slots; allreduce A has 6 chunks (numbers 0..5), B has 3 (6..8): number g uses slot g mod 4.
  StreamSchedule sched(4);
  AllreduceOp a, b;
  a.ch = make_chunking(6 * 360, GS_ELEM_FLOAT32, 1440);
  b.ch = make_chunking(3 * 360, GS_ELEM_FLOAT32, 1440);
  auto* fa = sched.admit(&a);
  size_t c = 99;
  CHECK(sched.next(3, &c) == fa && c == 3);
  CHECK(sched.next(1, &c) == fa && c == 1);
  CHECK(sched.first_in_slot(3) && !sched.first_in_slot(5));
  CHECK_EQ(sched.following(*fa, 1), size_t{5});  // chunk 1's slot carries chunk 5 next
  CHECK_EQ(sched.following(*fa, 2), SIZE_MAX);
  // Slot 2 finishes chunk 2: its next number (6) belongs to B, not admitted yet.
  CHECK(!sched.finish(2, fa));
  CHECK(sched.next(2, &c) == nullptr);
  auto* fb = sched.admit(&b);
  CHECK(sched.next(2, &c) == fb && c == 0);
  // A finishes when all its chunks did, whatever the order.
  for (unsigned s : {0u, 1u, 3u}) CHECK(!sched.finish(s, fa));
  CHECK(!sched.finish(0, fa));  // chunk 4
  CHECK(sched.finish(1, fa));   // chunk 5: the last
  CHECK(!sched.empty());
  CHECK(sched.next(0, &c) == fb && c == 2);  // slot 0 moved on to number 8 = B's chunk 2
}

GS_TEST_MAIN()

namespace {
// Chunks conceded among the next `n` the policy is asked about.
unsigned conceded_of(ConcedePolicy& p, unsigned n) {
  unsigned c = 0;
  for (unsigned i = 0; i < n; ++i) c += p.concede_next();
  return c;
}
}  // namespace

TEST(concede_policy_off_and_fixed_share) {
  ConcedePolicy off(false, 4);
  for (unsigned i = 0; i < 64; ++i) off.on_completed(true);
  CHECK_EQ(conceded_of(off, 1000), 0u);
  // A fixed share sent with data (the test hook): 1 in 4, per block of 64 chunks its first 16 with
  // data and the other 48 conceded (runs of one size keep GSO writes whole).
  ConcedePolicy fixed(false, 4, 0.25);
  unsigned conceded = 0;
  for (unsigned i = 0; i < 100 * ConcedePolicy::kBlock; ++i) {
    const bool c = fixed.concede_next();
    conceded += c;
    CHECK_EQ(c, i % ConcedePolicy::kBlock >= ConcedePolicy::kBlock / 4);
  }
  CHECK_EQ(conceded, 75 * ConcedePolicy::kBlock);
  for (unsigned i = 0; i < 64; ++i) fixed.on_completed(true);  // the policy does not move a fixed share
  CHECK_EQ(fixed.keep(), 0.25);
  ConcedePolicy all(false, 4, 1.0);
  CHECK_EQ(conceded_of(all, 100), 0u);
}

TEST(concede_policy_moves_the_blocks_from_allreduce_to_allreduce) {
  // A tensor of 3 blocks conceded at a fixed share of 1 in 4: each allreduce still concedes 3/4 of
  // its chunks in runs, but from a random place (restart()), so that from step to step every chunk
  // goes with data as often as the others: what error feedback keeps of a conceded chunk goes out
  // within about 1/keep steps. Without the restarts the same 48 chunks per block never would.
  constexpr unsigned kChunks = 3 * ConcedePolicy::kBlock, kSteps = 64;
  ConcedePolicy p(false, 4, 0.25, /*seed=*/7);
  std::vector<unsigned> sent(kChunks, 0);
  for (unsigned step = 0; step < kSteps; ++step) {
    p.restart();
    unsigned conceded = 0, runs = 0;
    bool last = false;
    for (unsigned c = 0; c < kChunks; ++c) {
      const bool conc = p.concede_next();
      conceded += conc;
      sent[c] += !conc;
      runs += c == 0 || conc != last;
      last = conc;
    }
    CHECK_EQ(conceded, 3 * kChunks / 4);  // whole blocks: the share is exact
    CHECK(runs <= 2 * 3 + 1);             // a run with data and one without per block, at most
  }
  for (unsigned c = 0; c < kChunks; ++c) {
    CHECK(sent[c] >= 4);  // a quarter of 64 steps is 16: every chunk goes now and then
    CHECK(sent[c] <= 32);
  }
  // The policy without a share to apply stays put: restart() draws nothing and concedes nothing.
  ConcedePolicy off(false, 4);
  off.restart();
  CHECK_EQ(conceded_of(off, kChunks), 0u);
}

TEST(concede_policy_restarts_at_the_first_chunk_of_each_newer_allreduce) {
  // p is told each chunk's allreduce; q, seeded alike, is restarted by hand where p must restart.
  ConcedePolicy p(false, 4, 0.5, /*seed=*/3), q(false, 4, 0.5, /*seed=*/3);
  unsigned conceded = 0;
  q.restart();
  for (unsigned c = 0; c < 2 * ConcedePolicy::kBlock; ++c) {  // two blocks' places: exactly half
    const bool pc = p.concede_next(7);
    CHECK_EQ(pc, q.concede_next());
    conceded += pc;
  }
  CHECK_EQ(conceded, ConcedePolicy::kBlock);
  for (unsigned c = 0; c < 10; ++c)  // an older allreduce's late chunks (fixed32) continue the blocks
    CHECK_EQ(p.concede_next(6), q.concede_next());
  q.restart();
  for (unsigned c = 0; c < 100; ++c) CHECK_EQ(p.concede_next(8), q.concede_next());  // the next one
}

TEST(concede_policy_cuts_while_this_rank_paces_the_job) {
  ConcedePolicy p(true, 4);
  CHECK_EQ(p.keep(), 1.0);
  CHECK_EQ(conceded_of(p, 2 * ConcedePolicy::kBlock), 0u);  // nothing conceded before any evidence
  // Every round this rank contributes to is completed by it: its DATA arrives last. The first sample
  // alone changes nothing, the second starts conceding half, then each one cuts the share by 30%.
  for (unsigned i = 0; i < ConcedePolicy::kSample; ++i) p.on_completed(true);
  CHECK_EQ(p.keep(), 1.0);
  for (unsigned i = 0; i < ConcedePolicy::kSample; ++i) p.on_completed(true);
  CHECK_EQ(p.keep(), ConcedePolicy::kStart);
  for (unsigned s = 1; s <= 4; ++s) {
    for (unsigned i = 0; i < ConcedePolicy::kSample; ++i) p.on_completed(true);
    CHECK(std::fabs(p.keep() - ConcedePolicy::kStart * std::pow(ConcedePolicy::kCut, s)) < 1e-12);
  }
  for (unsigned i = 0; i < 20 * ConcedePolicy::kSample; ++i) p.on_completed(true);
  CHECK_EQ(p.keep(), ConcedePolicy::kMinKeep);  // a floor keeps rounds with data: they carry the signal
  CHECK_EQ(conceded_of(p, 6400), 6300u);        // all but one chunk per block
  // It keeps up again (a quarter of its rounds, as a healthy rank of 4): the share rises by a tenth
  // per sample, back to every chunk.
  const double before = p.keep();
  for (unsigned i = 0; i < ConcedePolicy::kSample; ++i) p.on_completed(i % 4 == 0);
  CHECK(std::fabs(p.keep() - before * ConcedePolicy::kRaise) < 1e-12);
  for (unsigned i = 0; i < 100 * ConcedePolicy::kSample; ++i) p.on_completed(i % 4 == 0);
  CHECK_EQ(p.keep(), 1.0);
}

TEST(concede_policy_healthy_ranks_never_concede) {
  // A healthy rank completes about 1/N of its rounds; with N = 2, half of them, up to 11 of 16 (the
  // threshold is the midpoint between 1/N and all of them: 12 of 16 for N = 2).
  for (unsigned world : {2u, 4u, 8u}) {
    ConcedePolicy p(true, world);
    unsigned conceded = 0;
    for (unsigned i = 0; i < 100 * ConcedePolicy::kSample; ++i) {
      p.on_completed(world == 2 ? i % 16 < 11 : i % world == 0);
      conceded += p.concede_next();
    }
    CHECK_EQ(conceded, 0u);
  }
  // A rank of 2 past the midpoint (13 of 16), two samples in a row, is not conceding yet.
  ConcedePolicy two(true, 2);
  for (unsigned i = 0; i < 2 * ConcedePolicy::kSample; ++i) two.on_completed(i % 16 < 13);
  CHECK_EQ(two.keep(), 1.0);  // below 7 in 8 (3/4 of the way from 1/2 to all): it does not start
  for (unsigned i = 0; i < 2 * ConcedePolicy::kSample; ++i) two.on_completed(i % 16 < 15);
  CHECK_EQ(two.keep(), ConcedePolicy::kStart);
  // Once conceding, the midpoint decides: 13 of 16 cuts, 11 of 16 raises.
  for (unsigned i = 0; i < ConcedePolicy::kSample; ++i) two.on_completed(i % 16 < 13);
  CHECK(std::fabs(two.keep() - ConcedePolicy::kStart * ConcedePolicy::kCut) < 1e-12);
  for (unsigned i = 0; i < ConcedePolicy::kSample; ++i) two.on_completed(i % 16 < 11);
  CHECK(std::fabs(two.keep() - ConcedePolicy::kStart * ConcedePolicy::kCut * ConcedePolicy::kRaise) < 1e-12);
}

TEST(concede_policy_a_train_completed_by_one_rank_is_no_straggler) {
  // The rounds of one GRO/GSO train share their completer: a healthy rank of 4 completes every
  // round of one train in four (trains of 32), in any order of the trains. It never concedes.
  for (unsigned world : {2u, 4u}) {
    ConcedePolicy p(true, world);
    uint64_t state = 12345;
    unsigned conceded = 0, completer = 0;
    for (unsigned i = 0; i < 200 * ConcedePolicy::kSample; ++i) {
      if (i % 32 == 0) {  // the next train's completer: a pseudo-random rank
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        completer = static_cast<unsigned>(state >> 33) % world;
      }
      p.on_completed(completer == 0);
      conceded += p.concede_next();
    }
    CHECK_EQ(conceded, 0u);
  }
}
