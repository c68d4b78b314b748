// The worker's data-path units alone: chunk codec per wire type, RTT estimation, the loss
// detector (RACK rule, probes, backoff, Karn) on a hand-made clock, and the slot window.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/header.h"
#include "common/kernels.h"
#include "common/loss_detector.h"
#include "gradswitch/wire.h"
#include "harness.h"
#include "worker/chunk_codec.h"
#include "worker/errors.h"
#include "worker/stream_schedule.h"
#include "worker/window.h"

using namespace gradswitch;
using namespace gradswitch::worker;

namespace {
constexpr int64_t kMs = 1'000'000;
}

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
      CHECK_EQ(len, ch.size(c) * ch.elem_bytes);
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
      CHECK_EQ(encode_chunk(ch, src.data(), c, scale, payload.data()), ch.size(c) * ch.elem_bytes);
      // A received datagram may start 4 bytes off an 8-byte boundary: decoding copes.
      std::memmove(payload.data() + 4, payload.data(), ch.size(c) * ch.elem_bytes);
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

TEST(loss_scan_with_stride_touches_only_its_rounds) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(6);
  for (auto& x : t) d.launch(x, 0);
  std::vector<unsigned> re;
  d.scan(t.data(), t.size(), 10 * kMs, &re, 1, 3);  // rounds 1 and 4
  CHECK(re.size() == 1 && (re[0] == 1 || re[0] == 4));
  for (unsigned i : {0u, 2u, 3u, 5u}) CHECK_EQ(t[i].deadline_ns, 4 * kMs);  // untouched
}

TEST(rtt_estimator_rfc6298) {
  RttEstimator r;
  CHECK(!r.has_sample());
  CHECK_EQ(r.initial_rto(4 * kMs, 200 * kMs), 4 * kMs);
  r.sample(10 * kMs);
  CHECK(r.srtt_ns() == 10.0 * kMs);
  CHECK(r.rttvar_ns() == 5.0 * kMs);
  CHECK_EQ(r.initial_rto(4 * kMs, 200 * kMs), 30 * kMs);  // 10 + 4 * 5
  r.sample(2 * kMs);
  CHECK(std::fabs(r.rttvar_ns() - (0.75 * 5 + 0.25 * 8) * kMs) < 1);
  CHECK(std::fabs(r.srtt_ns() - (0.875 * 10 + 0.125 * 2) * kMs) < 1);
  CHECK_EQ(r.initial_rto(4 * kMs, 20 * kMs), 20 * kMs);  // capped
}

TEST(loss_nothing_before_deadline) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(3);
  for (auto& x : t) d.launch(x, 0);
  std::vector<unsigned> re;
  int64_t next = d.scan(t.data(), t.size(), 3 * kMs, &re);
  CHECK(re.empty());
  CHECK_EQ(next, 4 * kMs);
}

TEST(loss_single_probe_when_nothing_delivered) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(3);
  d.launch(t[1], 0);
  d.launch(t[0], 1 * kMs);
  d.launch(t[2], 2 * kMs);
  std::vector<unsigned> re;
  d.scan(t.data(), t.size(), 10 * kMs, &re);
  // Only the oldest transmission goes out; the others back off without sending.
  CHECK(re.size() == 1 && re[0] == 1);
  CHECK_EQ(t[1].tries, 1u);
  CHECK_EQ(t[1].last_tx_ns, 10 * kMs);
  CHECK_EQ(t[0].tries, 0u);
  CHECK_EQ(t[0].deadline_ns, 18 * kMs);  // 10 + 2 * 4
  CHECK_EQ(t[1].deadline_ns, 18 * kMs);
}

TEST(loss_rack_resends_overtaken_rounds) {
  LossDetector d(100 * kMs, 1000 * kMs);  // timers far away: only RACK can act
  std::vector<RoundTimer> t(3);
  d.launch(t[0], 0);
  d.launch(t[1], 2 * kMs);
  d.launch(t[2], 4 * kMs);
  d.delivered(t[2], 5 * kMs);  // srtt = 1 ms; reorder window max(srtt/4, 0.5 ms) = 0.5 ms
  CHECK(!t[2].busy);
  std::vector<unsigned> re;
  d.scan(t.data(), t.size(), 5 * kMs, &re);
  // Both earlier rounds were overtaken by a later one and srtt + reorder (1.5 ms) has passed.
  CHECK(re.size() == 2 && re[0] == 0 && re[1] == 1);
  // Their retransmissions are now the newest sends: not resent again at once.
  re.clear();
  d.scan(t.data(), t.size(), 6 * kMs, &re);
  CHECK(re.empty());
}

// A window sent at one instant (an allreduce's start): answers to rounds later in the batch overtake
// the rounds before them, as RFC 8985 orders segments sent together by sequence.
TEST(loss_rack_orders_a_batch_by_its_send_order) {
  LossDetector d(100 * kMs, 1000 * kMs);  // timers far away: only RACK can act
  std::vector<RoundTimer> t(3);
  for (auto& x : t) d.launch(x, 0);
  d.delivered(t[1], 1 * kMs);  // srtt 1 ms, reorder window 0.5 ms
  std::vector<unsigned> re;
  d.scan(t.data(), t.size(), 1 * kMs, &re);
  CHECK(re.empty());  // not before srtt + the reordering window after its send
  d.scan(t.data(), t.size(), 2 * kMs, &re);
  CHECK(re.size() == 1 && re[0] == 0);  // round 0 went before round 1; round 2 after it
  CHECK(t[0].cause == RetxCause::kRack && t[2].tries == 0);
}

// Probes with nothing answered go in send order: the batch's first round is the oldest.
TEST(loss_probes_a_batch_in_its_send_order) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(3);
  d.launch(t[2], 0);
  d.launch(t[0], 0);
  d.launch(t[1], 0);
  std::vector<unsigned> re;
  d.scan(t.data(), t.size(), 10 * kMs, &re);
  CHECK(re.size() == 1 && re[0] == 2);
}

// The switch says a round lacks this sender's data: resent unless it just went (the request may
// have crossed that transmission).
TEST(loss_asked_resends_unless_just_sent) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(1);
  d.launch(t[0], 0);
  CHECK(!d.asked(t[0], 50'000));  // 50 us after the send: RACK would still wait (0.5 ms)
  CHECK(d.asked(t[0], 1 * kMs));
  CHECK(t[0].tries == 1 && t[0].cause == RetxCause::kAsked && t[0].last_tx_ns == 1 * kMs);
  CHECK(!d.asked(t[0], 1 * kMs + 50'000));
  d.delivered(t[0], 2 * kMs);
  CHECK(!d.asked(t[0], 3 * kMs));  // delivered: nothing to resend
}

// Results to this rank come 30 ms late (a stalled path): the switch's request for a round, sent
// before this rank's DATA reached it, comes 20 ms after that DATA went. Resent, and the resend proven
// spurious (DSACK, its round trip 30 ms): the timer's floor learns the stall, and requests for rounds
// sent within it are taken as crossing them from then on, until the floor decays.
TEST(loss_a_stale_request_teaches_the_floor_and_the_request_gap) {
  LossDetector d(4 * kMs, 200 * kMs);
  RoundTimer t;
  d.launch(t, 0);
  CHECK(d.ask_gap_ns() == 500'000);  // RACK's wait: the reordering window's base
  CHECK(d.asked(t, 20 * kMs));
  d.delivered(t, 30 * kMs);
  d.spurious(RetxCause::kAsked, 0, 30 * kMs, 50 * kMs);
  CHECK_EQ(d.rto_floor_ns(), 8 * kMs);  // at most a doubling per lesson, as for a timeout
  CHECK_EQ(d.ask_gap_ns(), 8 * kMs);
  for (int i = 0; i < 3; ++i) d.spurious(RetxCause::kAsked, 0, 30 * kMs, 50 * kMs);
  CHECK_EQ(d.ask_gap_ns(), 30 * kMs + 30 * kMs / 4);
  d.launch(t, 100 * kMs);
  CHECK(!d.asked(t, 120 * kMs));  // the same stall again: the request crossed the DATA
  CHECK(d.asked(t, 140 * kMs));   // older than the stall: the round needs the resend
  // The floor halves after 2 s without a lesson, and the gap with it.
  d.launch(t, 2'100 * kMs);
  CHECK_EQ(d.ask_gap_ns(), (30 * kMs + 30 * kMs / 4) / 2);
}

TEST(loss_rack_waits_for_reorder_window) {
  LossDetector d(100 * kMs, 1000 * kMs);
  std::vector<RoundTimer> t(2);
  d.launch(t[0], 0);
  d.launch(t[1], 400'000);  // 0.4 ms later: within the reordering window (srtt / 4 = 2.4 ms)
  d.delivered(t[1], 10 * kMs);
  std::vector<unsigned> re;
  d.scan(t.data(), t.size(), 11 * kMs, &re);
  CHECK(re.empty());
}

TEST(loss_karn_and_backoff_cap) {
  LossDetector d(4 * kMs, 10 * kMs);
  std::vector<RoundTimer> t(1);
  d.launch(t[0], 0);
  std::vector<unsigned> re;
  int64_t now = 0;
  for (int i = 0; i < 5; ++i) {
    now = t[0].deadline_ns;
    re.clear();
    d.scan(t.data(), 1, now, &re);
    CHECK(re.size() == 1);
  }
  CHECK_EQ(t[0].rto_ns, 10 * kMs);  // 4, 8, then capped at 10
  CHECK_EQ(t[0].tries, 5u);
  d.delivered(t[0], now + 1 * kMs);
  CHECK(!d.rtt().has_sample());  // a resent round gives no RTT sample
}

// Issue #17: a round sent once whose RESULT says a resend completed it (RETX) waited for another
// rank's loss recovery. Sampled, those waits (several ms each at 10% loss, most rounds having a lost
// contribution somewhere) made srtt and rttvar, so every timer, the others' recovery times.
TEST(loss_a_round_completed_by_a_resend_gives_no_rtt_sample) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(2);
  d.launch(t[0], 0);
  d.launch(t[1], 0);
  d.delivered(t[0], 12 * kMs, /*after_recovery=*/true);
  CHECK(!d.rtt().has_sample());
  CHECK(!t[0].busy);
  d.delivered(t[1], 300'000);  // completed by the originals: this path's round trip
  CHECK(d.rtt().srtt_ns() == 300'000.0);
}

// Issue #17: at 10% loss a round that needs five tries is common in an allreduce of 10,000 rounds;
// doubling its timer each time (4, 8, 16, 32, 64 ms) made it the allreduce's tail while every other
// round was answered. While answers flow it waits at most 2 base timers; once nothing was answered
// for rto_max (a dead path) it backs off exponentially again.
TEST(loss_backoff_stays_short_while_answers_flow) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(2);
  d.launch(t[0], 0);
  d.launch(t[1], 0);
  d.delivered(t[1], 1 * kMs);  // srtt 1 ms: the base timer is rto_min, 4 ms
  std::vector<unsigned> re;
  int64_t now = 0;
  for (int i = 0; i < 6; ++i) {
    now = t[0].deadline_ns;
    re.clear();
    d.scan(t.data(), 1, now, &re);
    CHECK(re.size() == 1);
    CHECK_EQ(t[0].rto_ns, 8 * kMs);  // 4, then 8 and no more
    d.launch(t[1], now);             // the other rounds go on being answered
    d.delivered(t[1], now + 1 * kMs);
  }
  // Nothing answered for rto_max: the path may be dead, back off.
  const int64_t last_answer = now + 1 * kMs;
  while (t[0].deadline_ns - last_answer < 200 * kMs) {
    now = t[0].deadline_ns;
    re.clear();
    d.scan(t.data(), 1, now, &re);
    CHECK_EQ(t[0].rto_ns, 8 * kMs);
  }
  now = t[0].deadline_ns;
  d.scan(t.data(), 1, now, &re);
  CHECK_EQ(t[0].rto_ns, 16 * kMs);
  now = t[0].deadline_ns;
  d.scan(t.data(), 1, now, &re);
  CHECK_EQ(t[0].rto_ns, 32 * kMs);
}

// A held round waits for its result; when that is lost (the round completed) only its timer finds
// out, so its timer too stays short while the peer answers. (While a rank recovers, nothing newer
// is delivered either: the scan sends one probe per expiry, not one per held round.)
TEST(loss_held_rounds_probe_at_two_base_timers_while_answers_flow) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(1);
  d.launch(t[0], 0);
  std::vector<unsigned> re;
  d.scan(t.data(), 1, 4 * kMs, &re);  // probe: 8 ms
  CHECK(d.held(t[0], 5 * kMs));       // the answer says the switch holds it
  for (int i = 0; i < 3; ++i) {
    re.clear();
    d.scan(t.data(), 1, t[0].deadline_ns, &re);
    CHECK(re.size() == 1);
    CHECK_EQ(t[0].rto_ns, 8 * kMs);
  }
  while (t[0].deadline_ns - 5 * kMs < 200 * kMs) d.scan(t.data(), 1, t[0].deadline_ns, &re);
  d.scan(t.data(), 1, t[0].deadline_ns, &re);
  CHECK_EQ(t[0].rto_ns, 16 * kMs);  // nothing answered for rto_max: backing off
}

// Issue #9: a switch stalled past the timer; the oldest round was probed at 4 ms; at 10 ms the
// stall ends and the original result of that round arrives first, the others' still queued. The
// answer may be the original's, so the round counts at its first send: the rounds sent with it
// were not overtaken. (Counting it at the probe's time made every round of the window look
// overtaken and resent the whole window.)
TEST(loss_a_resent_round_counts_at_its_first_send) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(8);
  for (auto& x : t) d.launch(x, 0);
  std::vector<unsigned> re;
  d.scan(t.data(), t.size(), 4 * kMs, &re);
  CHECK(re.size() == 1 && re[0] == 0);
  CHECK(t[0].cause == RetxCause::kProbe);
  d.delivered(t[0], 10 * kMs);
  re.clear();
  d.scan(t.data(), t.size(), 10 * kMs, &re);
  CHECK(re.empty());
  CHECK(!d.rtt().has_sample());  // Karn: the answer may be the probe's
  // Answered 6 ms after the probe, far past a round trip: the stalled switch's answer to the
  // original, so it is no evidence that the rounds sent before the probe were lost.
  re.clear();
  d.scan(t.data(), t.size(), 11 * kMs, &re);  // (their backed-off timers are due at 12 ms)
  CHECK(re.empty());
}

// A lost tail: the last rounds of a stream are lost, nothing later comes back, the timer probes
// the oldest. Its answer comes within a round trip of the probe: the path works, so the rounds
// sent before the probe are lost too and go out a round trip and a reordering window later, not
// one probe per doubled timeout.
TEST(loss_an_answered_probe_resends_the_rest_of_a_lost_tail) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(5);
  d.launch(t[4], 0);
  d.delivered(t[4], 200'000);  // srtt = min_rtt = 0.2 ms; reordering window 0.5 ms
  for (int i = 0; i < 4; ++i) d.launch(t[i], 1 * kMs);
  std::vector<unsigned> re;
  d.scan(t.data(), 4, 5 * kMs, &re);  // rto floor 4 ms: round 0 probed, the others back off to 13 ms
  CHECK(re.size() == 1 && re[0] == 0);
  d.delivered(t[0], 5 * kMs + 300'000);
  re.clear();
  int64_t next = d.scan(t.data(), 4, 5 * kMs + 300'000, &re);
  CHECK(re.empty());
  CHECK_EQ(next, 6 * kMs);  // the caller wakes when RACK's wait ends, before any timer
  d.scan(t.data(), 4, 6 * kMs, &re);
  CHECK(re.size() == 3 && re[0] == 1 && re[2] == 3);
  CHECK(t[1].cause == RetxCause::kRack);
  // The three went out together; one is answered, so the other two, lost again, go once more a
  // round trip and a reordering window later (no timer: theirs is due at 13 + 16 ms).
  d.delivered(t[1], 6 * kMs + 300'000);
  re.clear();
  CHECK_EQ(d.scan(t.data(), 4, 6 * kMs + 300'000, &re), 7 * kMs);
  CHECK(re.empty());
  d.scan(t.data(), 4, 7 * kMs, &re);
  CHECK(re.size() == 2 && re[0] == 2 && re[1] == 3);
}

TEST(loss_held_round_leaves_rack_and_teaches_the_timer) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(3);
  d.launch(t[0], 0);
  d.launch(t[1], 0);
  std::vector<unsigned> re;
  d.scan(t.data(), 2, 4 * kMs, &re);  // round 0 probed
  CHECK(re.size() == 1 && re[0] == 0);
  CHECK(d.held(t[0], 5 * kMs));   // the switch holds it: the probe was spurious
  CHECK(!d.held(t[0], 5 * kMs));  // counted once
  CHECK(t[0].held && t[0].busy);
  d.launch(t[2], 5 * kMs);
  d.delivered(t[2], 6 * kMs);  // sent after round 0's probe, answered first
  d.delivered(t[1], 6 * kMs);
  re.clear();
  d.scan(t.data(), 3, 8 * kMs, &re);
  CHECK(re.empty());  // overtaken, but held: it waits for other ranks, it is not lost
  d.delivered(t[0], 30 * kMs);
  // It waited for another rank: neither an RTT sample nor a lesson for the timer's floor.
  CHECK_EQ(d.rto_floor_ns(), 4 * kMs);
  CHECK_EQ(d.rtt().min_ns(), 1 * kMs);
}

// Ranks send their rounds in different orders, so the round whose data is missing at the switch
// is not always this rank's oldest: probes must move on from a round the switch holds.
TEST(loss_probes_rotate_past_held_rounds) {
  LossDetector d(4 * kMs, 200 * kMs);
  std::vector<RoundTimer> t(2);
  d.launch(t[0], 0);
  d.launch(t[1], 1 * kMs);
  std::vector<unsigned> re;
  d.scan(t.data(), 2, 6 * kMs, &re);
  CHECK(re.size() == 1 && re[0] == 0);
  d.held(t[0], 7 * kMs);  // HELD: re-armed at 7 + 8 ms
  re.clear();
  d.scan(t.data(), 2, 14 * kMs, &re);  // round 1 (backed off to 6 + 8 ms) is due
  CHECK(re.size() == 1 && re[0] == 1);
  // Both due: the one not held goes first, even though the held one was sent earlier.
  re.clear();
  d.scan(t.data(), 2, 40 * kMs, &re);
  CHECK(re.size() == 1 && re[0] == 1);
}

TEST(loss_a_late_original_answer_teaches_the_timer) {
  LossDetector d(4 * kMs, 200 * kMs);
  RoundTimer t;
  d.launch(t, 0);
  std::vector<unsigned> re;
  d.scan(&t, 1, 4 * kMs, &re);  // probed; the switch was stalled, not lossy
  d.delivered(t, 30 * kMs);     // by the answer to the probe, or the late original: unknown yet
  CHECK(!d.rtt().has_sample());
  // Then the other answer arrives: the probe was spurious. The caller passes the probe's own round
  // trip (here 27 ms: the stalled switch answered it that late): the floor learns 1.25x it.
  d.spurious(RetxCause::kProbe, 30 * kMs, 27 * kMs, 31 * kMs);
  CHECK(d.rtt().srtt_ns() == 30.0 * kMs);
  // At most a doubling per lesson (one outlier does not put the floor at rto_max): 4 -> 8 ms; the
  // same stall again -> 16, 32, then 1.25 x 27 ms.
  CHECK_EQ(d.rto_floor_ns(), 8 * kMs);
  d.spurious(RetxCause::kProbe, 0, 27 * kMs, 31 * kMs);
  CHECK_EQ(d.rto_floor_ns(), 16 * kMs);
  d.spurious(RetxCause::kProbe, 0, 27 * kMs, 31 * kMs);
  d.spurious(RetxCause::kProbe, 0, 27 * kMs, 31 * kMs);
  CHECK_EQ(d.rto_floor_ns(), 27 * kMs + 27 * kMs / 4);
  // A shorter wait lowers nothing; a RACK resend teaches the timer nothing.
  d.spurious(RetxCause::kProbe, 0, 1 * kMs, 31 * kMs);
  d.spurious(RetxCause::kRack, 0, 60 * kMs, 31 * kMs);
  CHECK_EQ(d.rto_floor_ns(), 27 * kMs + 27 * kMs / 4);
  d.launch(t, 32 * kMs);
  CHECK(t.rto_ns >= 27 * kMs + 27 * kMs / 4);
  // Two seconds without another spurious probe halve it.
  d.launch(t, 31 * kMs + 2'000 * kMs);
  CHECK_EQ(d.rto_floor_ns(), (27 * kMs + 27 * kMs / 4) / 2);
}

// The switch path keeps a detector per switch thread; a stall of this host (or of the switch's)
// delays every thread's answers. Seen under CPU load: one thread's detector learned the 30 ms stall,
// the other's first lessons came late in the stall (17 ms) and its next stall cost resends again.
// Detectors of one path share the floor; a detector of its own keeps its own.
TEST(loss_detectors_sharing_a_floor_learn_a_stall_together) {
  auto floor = std::make_shared<TimerFloor>(4 * kMs, 200 * kMs);
  LossDetector a(4 * kMs, 200 * kMs, floor), b(4 * kMs, 200 * kMs, floor), alone(4 * kMs, 200 * kMs);
  a.spurious(RetxCause::kProbe, 0, 27 * kMs, 31 * kMs);
  alone.spurious(RetxCause::kProbe, 0, 27 * kMs, 31 * kMs);
  b.spurious(RetxCause::kTimeout, 0, 27 * kMs, 32 * kMs);  // each lesson at most doubles the shared floor
  CHECK_EQ(a.rto_floor_ns(), 16 * kMs);
  CHECK_EQ(b.rto_floor_ns(), 16 * kMs);
  CHECK_EQ(alone.rto_floor_ns(), 8 * kMs);
  RoundTimer t;
  b.launch(t, 33 * kMs);
  CHECK_EQ(t.rto_ns, 16 * kMs);  // no RTT sample yet: the timer starts at the floor
  CHECK(b.ask_gap_ns() >= 16 * kMs);
  // Two seconds without a lesson halve it for both.
  a.launch(t, 32 * kMs + 2'000 * kMs);
  CHECK_EQ(b.rto_floor_ns(), 8 * kMs);
}

TEST(loss_spurious_rack_widens_the_reordering_window) {
  LossDetector d(4 * kMs, 200 * kMs);
  RoundTimer x;
  d.launch(x, 0);
  d.delivered(x, 10 * kMs);  // srtt 10 ms, min 10 ms: base max(2.5 ms, 0.5 ms)
  CHECK_EQ(d.reorder_window_ns(), 2500 * 1000LL);
  d.spurious(RetxCause::kRack, 0, 0, 20 * kMs);
  CHECK_EQ(d.reorder_mult(), 2u);
  CHECK_EQ(d.reorder_window_ns(), 5 * kMs);
  d.spurious(RetxCause::kRack, 0, 0, 21 * kMs);  // same round trip: once
  CHECK_EQ(d.reorder_mult(), 2u);
  d.spurious(RetxCause::kRack, 0, 0, 40 * kMs);
  d.spurious(RetxCause::kRack, 0, 0, 60 * kMs);
  d.spurious(RetxCause::kRack, 0, 0, 80 * kMs);
  CHECK_EQ(d.reorder_window_ns(), 10 * kMs);  // at most srtt
  // 16 RACK losses without a spurious one: back to one step.
  std::vector<RoundTimer> t(17);
  for (auto& r : t) d.launch(r, 100 * kMs);
  d.launch(t[16], 130 * kMs);
  d.delivered(t[16], 131 * kMs);
  std::vector<unsigned> re;
  d.scan(t.data(), 16, 150 * kMs, &re);
  CHECK_EQ(re.size(), size_t{16});
  CHECK(t[0].cause == RetxCause::kRack);
  CHECK_EQ(d.reorder_mult(), 1u);
}

// A HELD answer to a RACK resend does not widen the reordering window (the round may wait for
// another rank's loss); `reordered` (a late rank's original completed it) does, up to srtt.
TEST(loss_held_does_not_widen_reordered_does) {
  LossDetector d(4 * kMs, 200 * kMs);
  RoundTimer x, y;
  d.launch(x, 0);
  d.delivered(x, 400'000);  // 0.4 ms
  d.launch(y, 1 * kMs);
  d.delivered(y, 11 * kMs);  // waited 10 ms for another rank
  std::vector<RoundTimer> t(2);
  d.launch(t[0], 20 * kMs);
  d.launch(t[1], 21 * kMs);
  d.delivered(t[1], 21 * kMs + 500'000);
  std::vector<unsigned> re;
  d.scan(t.data(), 1, 22 * kMs, &re);  // overtaken: resent by RACK
  CHECK(re.size() == 1 && t[0].cause == RetxCause::kRack);
  CHECK(d.held(t[0], 22 * kMs + 300'000));
  CHECK_EQ(d.reorder_mult(), 1u);
  for (int i = 0; i < 4; ++i) d.reordered(30 * kMs + i * 2 * kMs);  // at most once per srtt
  CHECK_EQ(d.reorder_mult(), 5u);
  // 5 x 0.5 ms, capped at srtt: 0.4, 10 and 0.5 ms smoothed = 1.4625 ms.
  CHECK_EQ(d.reorder_window_ns(), 1'462'500);
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
