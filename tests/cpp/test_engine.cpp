// Engine behaviour beyond the golden tables: element types, header validation, abort, lifecycle.
#include <arpa/inet.h>

#include <cstddef>
#include <cstring>
#include <thread>
#include <vector>

#include "common/header.h"
#include "common/kernels.h"
#include "gradswitch/wire.h"
#include "harness.h"
#include "switch/engine/engine.h"

using namespace gradswitch;

namespace {

// A DATA packet marked as a resend (RETX): only those get an answer from a completed round.
std::vector<uint8_t> resend(std::vector<uint8_t> p) {
  p[offsetof(gs_header, flags)] |= GS_FLAG_RETX;
  return p;
}

struct Fixture {
  Engine engine{EngineConfig{2, 4}};
  uint32_t id = 0;
  uint32_t key = 0xC0FFEEu;
  explicit Fixture(uint16_t world = 2, uint32_t payload = 1440) {
    JobSpec spec;
    spec.name = "t";
    spec.world = world;
    spec.slots = 8;
    spec.payload_bytes = payload;
    spec.key = key;
    spec.elem_types = 0x7E;  // every element type: these tests are about the sums
    spec.endpoints.resize(world);
    std::string err;
    id = engine.create_job(spec, &err);
  }
  std::vector<uint8_t> packet(uint16_t rank, uint16_t slot, uint8_t elem_type, const void* payload,
                              uint16_t count, int8_t next_exp = GS_EXP_NONE, int8_t scale_exp = 0) {
    size_t bytes = gs_payload_bytes(elem_type, count);
    std::vector<uint8_t> p(GS_HEADER_BYTES + bytes);
    HeaderBuilder(GS_MSG_DATA, id, key)
        .rank(rank)
        .slot(slot)
        .elems(elem_type, count)
        .exps(next_exp, scale_exp)
        .encode(p.data());
    if (bytes) std::memcpy(p.data() + GS_HEADER_BYTES, payload, bytes);
    return p;
  }
  IngestResult ingest(const std::vector<uint8_t>& p, unsigned thread = 0) {
    return engine.ingest(thread, p.data(), p.size(), 1, Endpoint{});  // the ranks joined from {0, 0}
  }
};

// A job of one rank with the engine's defaults otherwise.
JobSpec one_rank_spec() {
  JobSpec spec;
  spec.world = 1;
  spec.endpoints.resize(1);
  return spec;
}

}  // namespace

TEST(float32_sum) {
  Fixture f;
  std::vector<float> a(360), b(360);
  for (int i = 0; i < 360; ++i) a[i] = 0.5f * i, b[i] = -0.25f * i;
  CHECK(f.ingest(f.packet(0, 0, GS_ELEM_FLOAT32, a.data(), 360)).kind == IngestResult::kAbsorbed);
  IngestResult r = f.ingest(f.packet(1, 0, GS_ELEM_FLOAT32, b.data(), 360));
  CHECK(r.kind == IngestResult::kSend && r.len == 32 + 1440);
  const float* out = reinterpret_cast<const float*>(r.data + 32);
  bool ok = true;
  for (int i = 0; i < 360; ++i) ok &= out[i] == 0.25f * i;
  CHECK(ok);
}

TEST(float16_and_bfloat16_accumulate_in_fp32) {
  // 2048 + 1 + 1 in fp16 would round to 2048 at each step; summed in fp32 it is 2050.
  Fixture f(3);
  uint16_t big = f32_to_f16_scalar(2048.0f), one = f32_to_f16_scalar(1.0f);
  f.ingest(f.packet(0, 0, GS_ELEM_FLOAT16, &big, 1));
  f.ingest(f.packet(1, 0, GS_ELEM_FLOAT16, &one, 1));
  IngestResult r = f.ingest(f.packet(2, 0, GS_ELEM_FLOAT16, &one, 1));
  CHECK(r.kind == IngestResult::kSend && r.len == 34);
  uint16_t h;
  std::memcpy(&h, r.data + 32, 2);
  CHECK(f16_to_f32_scalar(h) == 2050.0f);

  uint16_t b256 = f32_to_bf16_scalar(256.0f), b1 = f32_to_bf16_scalar(1.0f);
  f.ingest(f.packet(0, 2, GS_ELEM_BFLOAT16, &b256, 1));
  f.ingest(f.packet(1, 2, GS_ELEM_BFLOAT16, &b1, 1));
  r = f.ingest(f.packet(2, 2, GS_ELEM_BFLOAT16, &b1, 1));
  std::memcpy(&h, r.data + 32, 2);
  CHECK(bf16_to_f32_scalar(h) == 258.0f);
}

TEST(float64_sum_from_unaligned_packets) {
  // A DPDK frame puts the payload 42 + 32 bytes into the buffer: 8-byte elements arrive on a
  // 2-byte boundary and must still be summed as doubles (copied aside, never read misaligned).
  Fixture f;
  std::vector<double> a(180), b(180);
  for (int i = 0; i < 180; ++i) a[i] = 0x1p40 + i, b[i] = 0.5 + i;
  for (size_t shift : {0, 2, 4}) {
    auto pa = f.packet(0, 1, GS_ELEM_FLOAT64, a.data(), 180),
         pb = f.packet(1, 1, GS_ELEM_FLOAT64, b.data(), 180);
    std::vector<uint8_t> buf(pb.size() + 8);
    std::memcpy(buf.data() + shift, pb.data(), pb.size());
    gs_header h;
    gs_header_decode(pa.data(), &h);
    h.seq = static_cast<uint32_t>(shift);  // a new round each time
    gs_header_encode(&h, pa.data());
    gs_header_encode(&h, buf.data() + shift);
    std::memcpy(buf.data() + shift + offsetof(gs_header, rank), pb.data() + offsetof(gs_header, rank), 2);
    CHECK(f.ingest(pa, 1).kind == IngestResult::kAbsorbed);
    IngestResult r = f.engine.ingest(1, buf.data() + shift, pb.size(), 1, Endpoint{});
    CHECK(r.kind == IngestResult::kSend && r.len == 32 + 1440);
    if (r.kind != IngestResult::kSend) continue;
    std::vector<double> out(180);
    std::memcpy(out.data(), r.data + 32, 1440);
    bool ok = true;
    for (int i = 0; i < 180; ++i) ok &= out[i] == 0x1p40 + 0.5 + 2 * i;  // exact in fp64, not in fp32
    CHECK(ok);
  }
}

TEST(float64_round_rejects_other_element_types_and_oversized_payloads) {
  Fixture f;
  double d[2] = {1.0, 2.0};
  int32_t i[2] = {1, 2};
  std::vector<double> big(181, 1.0);
  CHECK(f.ingest(f.packet(0, 0, GS_ELEM_FLOAT64, big.data(), 181)).reason == DropReason::kBadLength);
  CHECK(f.ingest(f.packet(0, 0, GS_ELEM_FLOAT64, d, 2)).kind == IngestResult::kAbsorbed);
  auto short_pkt = f.packet(1, 0, GS_ELEM_FLOAT64, d, 2);
  short_pkt.pop_back();  // 15 bytes of payload for 2 doubles
  CHECK(f.ingest(short_pkt).reason == DropReason::kBadLength);
  IngestResult r = f.ingest(f.packet(1, 0, GS_ELEM_FLOAT64, d, 2));
  CHECK(r.kind == IngestResult::kSend && r.len == 32 + 16);
  gs_header h;
  gs_header_decode(r.data, &h);
  CHECK(h.elem_type == GS_ELEM_FLOAT64 && h.count == 2);
  // An int32 contribution to a float64 round: the ranks disagree, the job is aborted.
  CHECK(f.ingest(f.packet(0, 2, GS_ELEM_FLOAT64, d, 2)).kind == IngestResult::kAbsorbed);
  CHECK(f.ingest(f.packet(1, 2, GS_ELEM_INT32, i, 2)).reason == DropReason::kInconsistent);
}

TEST(fixed32_keeps_the_maximum_exponent) {
  Fixture f(3);
  int32_t v = 5;
  f.ingest(f.packet(0, 0, GS_ELEM_FIXED32, &v, 1, /*next_exp=*/3, /*scale=*/20));
  f.ingest(f.packet(1, 0, GS_ELEM_FIXED32, &v, 1, 9, 20));
  IngestResult r = f.ingest(f.packet(2, 0, GS_ELEM_FIXED32, &v, 1, GS_EXP_NONE, 20));
  gs_header h;
  gs_header_decode(r.data, &h);
  CHECK(h.next_exp == 9 && h.scale_exp == 20 && h.elem_type == GS_ELEM_FIXED32);
  int32_t sum;
  std::memcpy(&sum, r.data + 32, 4);
  CHECK(sum == 15);
}

TEST(bootstrap_round_with_no_elements) {
  Fixture f(2);
  f.ingest(f.packet(0, 0, GS_ELEM_FIXED32, nullptr, 0, 4));
  IngestResult r = f.ingest(f.packet(1, 0, GS_ELEM_FIXED32, nullptr, 0, -3));
  CHECK(r.kind == IngestResult::kSend && r.len == 32);
  gs_header h;
  gs_header_decode(r.data, &h);
  CHECK(h.next_exp == 4 && h.count == 0);
}

TEST(header_validation_reasons) {
  Fixture f;
  int32_t v = 1;
  auto p = f.packet(0, 0, GS_ELEM_INT32, &v, 1);
  CHECK(f.engine.ingest(0, p.data(), 31, 1, Endpoint{}).reason == DropReason::kShortPacket);
  // Why the engine drops `p` with byte `at` set to `value`.
  const auto with_byte = [&](size_t at, uint8_t value) {
    auto bad = p;
    bad[at] = value;
    return f.ingest(bad).reason;
  };
  CHECK(with_byte(0, p[0] ^ 0xFF) == DropReason::kBadMagic);
  CHECK(with_byte(2, 9) == DropReason::kBadVersion);
  CHECK(with_byte(3, GS_MSG_RESULT) == DropReason::kBadType);
  CHECK(with_byte(4, p[4] ^ 0x40) == DropReason::kUnknownJob);
  CHECK(with_byte(17, 99) == DropReason::kBadElemType);
  CHECK(with_byte(19, 2) == DropReason::kBadLength);  // count 2 but one element present
  CHECK(f.ingest(f.packet(0, 1, GS_ELEM_INT32, &v, 1), 0).reason == DropReason::kWrongThread);
  CounterValues c = f.engine.total_counters();
  CHECK_EQ(c.drops_total(), 8u);
  CHECK_EQ(c.drops[size_t(DropReason::kBadMagic)], 1u);
  JobStatus st;
  CHECK(f.engine.job_status(f.id, &st));
  CHECK_EQ(st.counters.drops[size_t(DropReason::kWrongThread)], 1u);
  CHECK_EQ(st.counters.drops[size_t(DropReason::kUnknownJob)], 0u);  // not attributed to this job
}

TEST(abort_answers_every_packet) {
  Fixture f;
  int32_t v = 1;
  f.engine.abort_job(f.id, GS_ABORT_RANK_LEFT, 1);
  IngestResult r = f.ingest(f.packet(0, 0, GS_ELEM_INT32, &v, 1));
  CHECK(r.kind == IngestResult::kSend && r.dest_rank == 0 && r.len == GS_HEADER_BYTES);
  gs_header h;
  gs_header_decode(r.data, &h);
  CHECK(h.type == GS_MSG_ABORT && h.rank == 1 && h.next_exp == GS_ABORT_RANK_LEFT);
  CHECK(r.type == GS_MSG_ABORT && r.seq == h.seq && r.count == 0);  // described without reading the header
}

// Contributions to one round that cannot be summed abort the job and tell every rank at once.
TEST(mismatch_aborts_the_job_for_every_rank) {
  struct Case {
    const char* name;
    uint8_t elem;
    uint16_t count;
    int8_t scale;
    uint8_t flags;
  };
  const Case cases[] = {
      {"shorter tensor (count)", GS_ELEM_FIXED32, 1, 20, 0},
      {"other element type", GS_ELEM_INT32, 2, 20, 0},
      {"other fixed32 scale", GS_ELEM_FIXED32, 2, 21, 0},
      {"tensor ends here (LAST) for one rank only", GS_ELEM_FIXED32, 2, 20, GS_FLAG_LAST},
  };
  for (const Case& c : cases) {
    const int before = gs_test::failures();
    Fixture f(3);
    int32_t v[2] = {5, 6};
    CHECK(f.ingest(f.packet(1, 0, GS_ELEM_FIXED32, v, 2, GS_EXP_NONE, 20)).kind == IngestResult::kAbsorbed);
    auto p = f.packet(2, 0, c.elem, v, c.count, GS_EXP_NONE, c.scale);
    p[16] |= c.flags;
    IngestResult r = f.ingest(p);
    CHECK(r.kind == IngestResult::kSend && r.dest_rank == GS_RANK_ALL && r.len == GS_HEADER_BYTES);
    CHECK(r.reason == DropReason::kInconsistent);
    gs_header h;
    gs_header_decode(r.data, &h);
    CHECK(h.type == GS_MSG_ABORT && h.rank == 2 && h.next_exp == GS_ABORT_MISMATCH);
    JobStatus st;
    CHECK(f.engine.job_status(f.id, &st));
    CHECK(st.aborted && st.abort_reason == GS_ABORT_MISMATCH && st.abort_rank == 2);
    CHECK(st.mismatch.held.rank == 1 && st.mismatch.held.count == 2 && !st.mismatch.held.last);
    CHECK(st.mismatch.arriving.rank == 2 && st.mismatch.arriving.count == c.count);
    CHECK(st.mismatch.arriving.elem_type == c.elem && st.mismatch.arriving.scale_exp == c.scale);
    CHECK(st.mismatch.arriving.last == (c.flags != 0));
    // The control plane cannot abort it a second time with another reason.
    CHECK(!f.engine.abort_job(f.id, GS_ABORT_OPERATOR, GS_RANK_ALL));
    if (gs_test::failures() != before) std::fprintf(stderr, "  case: %s\n", c.name);
  }
}

TEST(agreeing_last_flags_complete) {
  Fixture f(2);
  int32_t v = 3;
  auto a = f.packet(0, 1, GS_ELEM_INT32, &v, 1);
  auto b = f.packet(1, 1, GS_ELEM_INT32, &v, 1);
  a[16] |= GS_FLAG_LAST;
  b[16] |= GS_FLAG_LAST;
  f.ingest(a, 1);
  CHECK(f.ingest(b, 1).kind == IngestResult::kSend);
}

TEST(aborted_job_still_answers_retransmissions_of_completed_rounds) {
  Fixture f(2);
  int32_t v = 4;
  f.ingest(f.packet(0, 0, GS_ELEM_INT32, &v, 1));
  CHECK(f.ingest(f.packet(1, 0, GS_ELEM_INT32, &v, 1)).dest_rank == GS_RANK_ALL);
  CHECK(f.engine.abort_job(f.id, GS_ABORT_RANK_LEFT, 0));
  IngestResult r = f.ingest(resend(f.packet(1, 0, GS_ELEM_INT32, &v, 1)));  // its result was lost
  CHECK(r.kind == IngestResult::kSend && r.dest_rank == 1 && r.len == GS_HEADER_BYTES + 4);
  if (r.kind != IngestResult::kSend) return;
  int32_t sum;
  std::memcpy(&sum, r.data + GS_HEADER_BYTES, 4);
  CHECK(sum == 8);
  r = f.ingest(f.packet(1, 2, GS_ELEM_INT32, &v, 1));  // a new round gets ABORT
  CHECK(r.kind == IngestResult::kSend && r.len == GS_HEADER_BYTES && r.dest_rank == 1);
}

TEST(leave_aborts_only_rounds_that_need_the_rank) {
  Fixture f(3);
  int32_t v = 1;
  // Slot 0: complete. Slot 2: rank 0 contributed, waiting for 1 and 2.
  for (uint16_t r = 0; r < 3; ++r) f.ingest(f.packet(r, 0, GS_ELEM_INT32, &v, 1));
  f.ingest(f.packet(0, 2, GS_ELEM_INT32, &v, 1));
  // Rank 0 leaving: the open round has its contribution, nothing waits for it.
  CHECK(!f.engine.rank_left(f.id, 0));
  JobStatus st;
  CHECK(f.engine.job_status(f.id, &st) && !st.aborted && st.left == 1u);
  CHECK(f.ingest(f.packet(1, 2, GS_ELEM_INT32, &v, 1)).kind == IngestResult::kAbsorbed);
  CHECK(f.ingest(resend(f.packet(2, 0, GS_ELEM_INT32, &v, 1))).dest_rank == 2);  // shadow answer
  // A new round needs rank 0: every rank is told at once.
  IngestResult r = f.ingest(f.packet(1, 4, GS_ELEM_INT32, &v, 1));
  CHECK(r.kind == IngestResult::kSend && r.dest_rank == GS_RANK_ALL && r.len == GS_HEADER_BYTES);
  gs_header h;
  gs_header_decode(r.data, &h);
  CHECK(h.type == GS_MSG_ABORT && h.rank == 0 && h.next_exp == GS_ABORT_RANK_LEFT);

  // Rank 1 leaving while slot 2 waits for it: aborted by the LEAVE itself.
  Fixture g(3);
  g.ingest(g.packet(0, 2, GS_ELEM_INT32, &v, 1));
  CHECK(g.engine.rank_left(g.id, 1));
  CHECK(g.engine.job_status(g.id, &st) && st.aborted && st.abort_reason == GS_ABORT_RANK_LEFT &&
        st.abort_rank == 1);
}

TEST(status_tracks_ranks_and_slots) {
  Fixture f(3);
  int32_t v = 1;
  auto p = f.packet(2, 0, GS_ELEM_INT32, &v, 1);
  gs_header h;
  gs_header_decode(p.data(), &h);
  h.seq = 7;
  gs_header_encode(&h, p.data());
  f.ingest(p);
  JobStatus st;
  CHECK(f.engine.job_status(f.id, &st));
  CHECK(st.rank_last_seq.size() == 3 && st.rank_last_seq[0] == -1 && st.rank_last_seq[2] == 7);
  SlotStatus ss;
  CHECK(f.engine.slot_status(f.id, 0, 0, &ss));
  CHECK(ss.open && !ss.complete && ss.seen == 4u && ss.seq == 7);
}

TEST(destroy_waits_for_a_thread_inside_a_burst) {
  Fixture f;
  f.engine.begin_burst(1);
  std::atomic<bool> destroyed{false};
  std::thread control([&] {
    f.engine.destroy_job(f.id);
    destroyed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(!destroyed.load());  // thread 1 may still hold the job
  f.engine.end_burst(1);
  control.join();
  CHECK(destroyed.load());
  int32_t v = 1;
  CHECK(f.ingest(f.packet(0, 0, GS_ELEM_INT32, &v, 1)).reason == DropReason::kUnknownJob);
  CHECK(f.engine.job_ids().empty());
}

TEST(job_table_limits_and_ids_are_not_reused) {
  Engine e(EngineConfig{1, 2});
  JobSpec spec = one_rank_spec();
  std::string err;
  uint32_t a = e.create_job(spec, &err), b = e.create_job(spec, &err);
  CHECK(a && b && a != b);
  CHECK(e.create_job(spec, &err) == 0 && err.find("full") != std::string::npos);
  e.destroy_job(a);
  uint32_t c = e.create_job(spec, &err);
  CHECK(c != 0 && c != a);  // same table index, new generation: stale packets of `a` stay dead
  spec.world = 65;
  spec.endpoints.resize(65);
  CHECK(e.create_job(spec, &err) == 0);
}

TEST(a_rank_that_left_is_not_heard) {
  Fixture f(3);
  int32_t v = 1;
  for (uint16_t r = 0; r < 3; ++r) f.ingest(f.packet(r, 0, GS_ELEM_INT32, &v, 1));  // slot 0 complete
  CHECK(!f.engine.rank_left(f.id, 2));
  // Neither a retransmission of a completed round nor a new contribution of rank 2 counts.
  CHECK(f.ingest(f.packet(2, 0, GS_ELEM_INT32, &v, 1)).reason == DropReason::kRankLeft);
  CHECK(f.ingest(f.packet(2, 2, GS_ELEM_INT32, &v, 1)).reason == DropReason::kRankLeft);
  JobStatus st;
  CHECK(f.engine.job_status(f.id, &st) && !st.aborted &&
        st.counters.drops[size_t(DropReason::kRankLeft)] == 2);
  SlotStatus ss;
  CHECK(f.engine.slot_status(f.id, 2, 0, &ss) && !ss.open && !ss.complete);  // nothing opened
}

TEST(data_counts_only_from_the_address_its_rank_joined_from) {
  Engine e(EngineConfig{1, 4});
  JobSpec spec;
  spec.world = 2;
  spec.slots = 4;
  spec.payload_bytes = 64;
  spec.key = 77;
  spec.wire = GS_ELEM_INT32;
  spec.endpoints = {Endpoint{htonl(0x0A000001), htons(5000)}, Endpoint{htonl(0x0A000002), htons(5001)}};
  std::string err;
  const uint32_t id = e.create_job(spec, &err);
  int32_t v = 5;
  std::vector<uint8_t> p(GS_HEADER_BYTES + 4);
  HeaderBuilder(GS_MSG_DATA, id, 77).rank(1).elems(GS_ELEM_INT32, 1).encode(p.data());
  std::memcpy(p.data() + GS_HEADER_BYTES, &v, 4);
  // Rank 1's id, key and port, but rank 0's IP; rank 1's IP, another port; nobody's address.
  for (Endpoint from : {spec.endpoints[0], Endpoint{spec.endpoints[1].ipv4_be, htons(5000)},
                        Endpoint{htonl(0x0A000009), htons(5001)}}) {
    IngestResult r = e.ingest(0, p.data(), p.size(), 1, from);
    CHECK(r.kind == IngestResult::kDropped && r.reason == DropReason::kBadSource);
  }
  SlotStatus ss;
  CHECK(e.slot_status(id, 0, 0, &ss) && !ss.open);
  CHECK(e.ingest(0, p.data(), p.size(), 1, spec.endpoints[1]).kind == IngestResult::kAbsorbed);
  CHECK(e.total_counters().drops[size_t(DropReason::kBadSource)] == 3);
}

TEST(the_join_wire_binds_the_element_types_of_data) {
  Engine e(EngineConfig{1, 4});
  JobSpec spec = one_rank_spec();
  spec.slots = 4;
  spec.payload_bytes = 64;
  spec.wire = GS_ELEM_FLOAT16;
  std::string err;
  const uint32_t id = e.create_job(spec, &err);
  auto send = [&](uint8_t elem, uint16_t slot) {
    std::vector<uint8_t> p(GS_HEADER_BYTES + gs_elem_size(elem));
    HeaderBuilder(GS_MSG_DATA, id, 0).slot(slot).elems(elem, 1).encode(p.data());
    return e.ingest(0, p.data(), p.size(), 1, Endpoint{});
  };
  CHECK(send(GS_ELEM_FLOAT16, 0).kind == IngestResult::kSend);  // the wire
  CHECK(send(GS_ELEM_INT32, 1).kind == IngestResult::kSend);    // integer tensors, on any wire
  for (uint8_t other : {GS_ELEM_FLOAT32, GS_ELEM_FIXED32, GS_ELEM_BFLOAT16, GS_ELEM_FLOAT64, GS_ELEM_MX8})
    CHECK(send(other, 2).reason == DropReason::kBadElemType);
  CHECK(Engine::default_elem_types(GS_ELEM_FLOAT32, true) == 1u << GS_ELEM_FLOAT32);  // optimizer jobs
  spec.elem_types = 1u << 8;                                                          // not a type
  CHECK(e.create_job(spec, &err) == 0);
}

TEST(random_job_ids_are_found_and_collisions_refused) {
  Engine e(EngineConfig{1, 9});
  JobSpec spec = one_rank_spec();
  std::string err;
  std::vector<uint32_t> ids;
  uint32_t draw = 0x12345678u;
  while (ids.size() < 8) {
    draw = draw * 1664525u + 1013904223u;  // any ids will do; the control plane draws them at random
    if (!e.id_usable(draw)) continue;
    spec.id = draw;
    CHECK(e.create_job(spec, &err) == draw);
    ids.push_back(draw);
  }
  for (uint32_t id : ids) CHECK(!e.id_usable(id));
  spec.id = ids[3];
  CHECK(e.create_job(spec, &err) == 0 && err.find("in use") != std::string::npos);
  spec.id = 0;
  CHECK(!e.id_usable(0));
  // Every job has its own dense index (for backends' per-job arrays).
  uint64_t indices = 0;
  for (uint32_t id : ids) {
    std::vector<uint8_t> p(GS_HEADER_BYTES);
    HeaderBuilder(GS_MSG_DATA, id, 0).elems(GS_ELEM_INT32, 0).encode(p.data());
    IngestResult r = e.ingest(0, p.data(), p.size(), 1, Endpoint{});
    CHECK(r.job_id == id && r.job_index < 8);
    indices |= uint64_t{1} << r.job_index;
  }
  CHECK(indices == 0xFF);
  e.destroy_job(ids[5]);
  CHECK(e.id_usable(ids[5]));
  std::vector<uint8_t> p(GS_HEADER_BYTES);
  HeaderBuilder(GS_MSG_DATA, ids[5], 0).elems(GS_ELEM_INT32, 0).encode(p.data());
  CHECK(e.ingest(0, p.data(), p.size(), 1, Endpoint{}).reason == DropReason::kUnknownJob);
}

TEST(scale_exp_is_compared_only_in_fixed32_rounds) {
  Fixture f;
  const float a = 1.5f, b = 2.0f;
  // Two workers that write different values in scale_exp, which means nothing for float32.
  CHECK(f.ingest(f.packet(0, 0, GS_ELEM_FLOAT32, &a, 1, GS_EXP_NONE, 0)).kind == IngestResult::kAbsorbed);
  IngestResult r = f.ingest(f.packet(1, 0, GS_ELEM_FLOAT32, &b, 1, GS_EXP_NONE, GS_EXP_NONE));
  CHECK(r.kind == IngestResult::kSend && r.type == GS_MSG_RESULT);
  const int32_t q = 1 << 20;
  CHECK(f.ingest(f.packet(0, 2, GS_ELEM_FIXED32, &q, 1, GS_EXP_NONE, 20)).kind == IngestResult::kAbsorbed);
  CHECK(f.ingest(f.packet(1, 2, GS_ELEM_FIXED32, &q, 1, GS_EXP_NONE, 21)).reason ==
        DropReason::kInconsistent);
}

GS_TEST_MAIN()
