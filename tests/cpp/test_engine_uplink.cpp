// The engine's side of two-level aggregation (docs/protocol.md §8): a leaf's job of some of the
// ranks sends a round complete in the rack up to the spine and takes the spine's RESULT back; a
// spine's job hears one rank per leaf. Members, the upward packet, its resend, the spine's answers
// (the expected one, a second one, one from elsewhere), 16-bit sums going up in fp32, and aborts.
// Both directions go through the one Engine::ingest(), which tells the spine's answers apart.
#include <cstring>
#include <vector>

#include "common/header.h"
#include "common/kernels.h"
#include "gradswitch/wire.h"
#include "harness.h"
#include "ingest_result.h"
#include "switch/engine/engine.h"

using namespace gradswitch;

namespace {

constexpr uint32_t kSpineJob = 0x00000305u, kSpineKey = 0x5EED5EEDu;
const Endpoint kSpinePort{0x0100007Fu, 0x1234};  // 127.0.0.1, the spine's data thread 0

// Where member `rank` of a job with these members joined from: the tests give member i (in rank
// order) the endpoint {i + 1, i + 1}.
Endpoint member_address(uint64_t members, uint16_t rank) {
  const uint32_t i = static_cast<uint32_t>(__builtin_popcountll(members & ((uint64_t{1} << rank) - 1)));
  return Endpoint{i + 1, static_cast<uint16_t>(i + 1)};
}

// A leaf of a 4-rank job serving ranks 1 and 2, going up as rank 1.
struct Leaf {
  Engine engine{EngineConfig{1, 4, /*leaf=*/true}};
  uint32_t id = 0, key = 0xABCD0001u;
  explicit Leaf(uint8_t wire = GS_ELEM_FLOAT32) {
    JobSpec spec;
    spec.name = "leaf";
    spec.world = 4;
    spec.members = 0b0110;
    spec.wire = wire;
    spec.slots = 4;
    spec.payload_bytes = 64;
    spec.key = key;
    spec.endpoints = {Endpoint{1, 1}, Endpoint{2, 2}};
    auto up = std::make_shared<UplinkSpec>();
    up->job_id = kSpineJob;
    up->key = kSpineKey;
    up->rank = 1;
    up->slots = 8;
    up->payload_bytes = 128;
    up->data_threads = {kSpinePort};
    spec.uplink = up;
    std::string err;
    id = engine.create_job(spec, &err);
  }
  // A member's DATA declares the window 34 - its rank.
  IngestResult data(uint16_t rank, uint8_t elem, const void* payload, uint16_t count, uint8_t flags = 0) {
    auto p = packet(GS_MSG_DATA, id, key, rank, elem, payload, count, flags);
    p[offsetof(gs_header, window) + 1] = static_cast<uint8_t>(34 - rank);
    return engine.ingest(0, p.data(), p.size(), 1, member_address(0b0110, rank));
  }
  IngestResult from_spine(uint8_t type, uint8_t elem, const void* payload, uint16_t count,
                          Endpoint from = kSpinePort, uint32_t job = kSpineJob, int8_t next_exp = GS_EXP_NONE,
                          uint16_t completer = 0, uint16_t window = 0) {
    auto p = packet(type, job, kSpineKey, completer, elem, payload, count, 0, next_exp);
    p[offsetof(gs_header, window)] = static_cast<uint8_t>(window >> 8);
    p[offsetof(gs_header, window) + 1] = static_cast<uint8_t>(window);
    return engine.ingest(0, p.data(), p.size(), 2, from);
  }
  static std::vector<uint8_t> packet(uint8_t type, uint32_t job, uint32_t key, uint16_t rank, uint8_t elem,
                                     const void* payload, uint16_t count, uint8_t flags = 0,
                                     int8_t next_exp = GS_EXP_NONE) {
    const size_t bytes = gs_payload_bytes(elem, count);
    std::vector<uint8_t> p(GS_HEADER_BYTES + bytes);
    HeaderBuilder(type, job, key)
        .rank(rank)
        .flags(flags)
        .elems(elem, count)
        .round(7, 32)
        .exps(next_exp, 0)
        .encode(p.data());
    if (bytes) std::memcpy(p.data() + GS_HEADER_BYTES, payload, bytes);
    return p;
  }
};

}  // namespace

TEST(only_members_contribute_and_a_complete_rack_round_goes_up) {
  Leaf leaf;
  CHECK(leaf.id != 0);
  const int32_t a[3] = {1, 2, 3}, b[3] = {10, 20, 30};
  CHECK(leaf.data(0, GS_ELEM_INT32, a, 3).reason == DropReason::kBadRank);  // rank 0 is another rack's
  CHECK(leaf.data(1, GS_ELEM_INT32, a, 3).kind == IngestResult::kAbsorbed);
  IngestResult up = leaf.data(2, GS_ELEM_INT32, b, 3, GS_FLAG_LAST);
  // rank 2's LAST differs from rank 1's: mismatch, aborted; use another leaf for the happy path
  CHECK(up.kind == IngestResult::kSend && up.type == GS_MSG_ABORT);

  Leaf ok;
  ok.data(1, GS_ELEM_INT32, a, 3);
  up = ok.data(2, GS_ELEM_INT32, b, 3);
  CHECK(up.kind == IngestResult::kSend && up.type == GS_MSG_DATA && up.world == 1);
  CHECK(up.endpoints[0].port_be == kSpinePort.port_be && up.len == GS_HEADER_BYTES + 12);
  gs_header h = header_of(up);
  CHECK(h.job_id == kSpineJob && h.key == kSpineKey && h.rank == 1 && h.seq == 7 && h.offset == 32);
  CHECK(h.elem_type == GS_ELEM_INT32 && h.count == 3 && h.type == GS_MSG_DATA);
  CHECK(h.window == 32);  // the smallest the rack's DATA declared (rank 2's; rank 1's was 33)
  int32_t partial[3];
  std::memcpy(partial, up.data + GS_HEADER_BYTES, 12);
  CHECK(partial[0] == 11 && partial[1] == 22 && partial[2] == 33);

  // A member's retransmission while the spine has not answered: held, not a new round; the
  // member is told so (HELD with DSACK: its contribution is here, the round waits for the spine), and
  // no other member is: the rack's round lacks none of them.
  IngestResult held = ok.data(1, GS_ELEM_INT32, a, 3, GS_FLAG_RETX);
  CHECK(held.kind == IngestResult::kSend && held.type == GS_MSG_HELD &&
        held.len == GS_HEADER_BYTES + GS_HELD_BODY_BYTES);
  CHECK(header_of(held).flags == GS_FLAG_DSACK && header_of(held).rank == GS_RANK_ALL);
  CHECK(destinations(held) == 0b01);  // rank 1 is the rack's first member
  CHECK(gs_held_contributors(held.data + GS_HEADER_BYTES) == 0b0110);
  SlotStatus s;
  CHECK(ok.engine.slot_status(ok.id, 0, 0, &s) && s.uplink && !s.complete);

  // The loss timer fired: the same bytes again, flagged RETX.
  IngestResult again = ok.engine.uplink_resend(0, ok.id, 0);
  CHECK(again.kind == IngestResult::kSend && header_of(again).flags == GS_FLAG_RETX && again.len == up.len);
  CHECK(ok.engine.uplink_resend(0, ok.id, 1).kind == IngestResult::kDropped);  // nothing waits in slot 1

  // The spine's result from elsewhere is not heard; from the spine it completes the round.
  const int32_t total[3] = {111, 222, 333};
  CHECK(ok.from_spine(GS_MSG_RESULT, GS_ELEM_INT32, total, 3, Endpoint{0x0100007Fu, 0x9999}).reason ==
        DropReason::kBadSource);
  CHECK(ok.from_spine(GS_MSG_RESULT, GS_ELEM_INT32, total, 3, kSpinePort, kSpineJob + 0x100).reason ==
        DropReason::kUnknownJob);
  IngestResult down =
      ok.from_spine(GS_MSG_RESULT, GS_ELEM_INT32, total, 3, kSpinePort, kSpineJob, GS_EXP_NONE,
                    /*completer=*/0, /*window=*/24);
  CHECK(down.kind == IngestResult::kSend && down.type == GS_MSG_RESULT && down.world == 2 && down.slot == 0);
  h = header_of(down);
  CHECK(h.job_id == ok.id && h.key == ok.key && h.count == 3);
  // The spine names rack 0: another rack completed the round. The window is the spine's: the
  // smallest over every rack's.
  CHECK(h.rank == GS_RANK_ALL && h.window == 24);
  CHECK(std::memcmp(down.data + GS_HEADER_BYTES, total, 12) == 0);
  // A second answer (to the resend) finds nothing waiting.
  CHECK(ok.from_spine(GS_MSG_RESULT, GS_ELEM_INT32, total, 3).reason == DropReason::kUplinkStale);
  // The result is the shadow copy: a member that lost it gets it alone, at its own endpoint index.
  IngestResult shadow = ok.data(2, GS_ELEM_INT32, b, 3, GS_FLAG_RETX);
  CHECK(shadow.kind == IngestResult::kSend && shadow.dest_rank == 1 &&
        header_of(shadow).rank == GS_RANK_ALL && header_of(shadow).window == 24 &&
        header_of(shadow).flags == (GS_FLAG_UNICAST | GS_FLAG_DSACK));
  CHECK(std::memcmp(shadow.data + GS_HEADER_BYTES, total, 12) == 0);
  CounterValues c = ok.engine.total_counters();
  CHECK(c.sent_up == 1 && c.resent_up == 1 && c.completed == 1);
}

TEST(float16_sums_go_up_in_fp32_and_come_down_rounded_once) {
  Leaf leaf(GS_ELEM_FLOAT16);
  // 2048 + 1 in fp16 rounds to 2048; the rack's sum goes up unrounded, as fp32.
  const uint16_t big = f32_to_f16_scalar(2048.0f), one = f32_to_f16_scalar(1.0f);
  leaf.data(1, GS_ELEM_FLOAT16, &big, 1);
  IngestResult up = leaf.data(2, GS_ELEM_FLOAT16, &one, 1);
  CHECK(up.kind == IngestResult::kSend && header_of(up).elem_type == GS_ELEM_FLOAT32 && up.len == 36);
  float partial;
  std::memcpy(&partial, up.data + GS_HEADER_BYTES, 4);
  CHECK(partial == 2049.0f);
  const float total = 2051.0f;  // + the other rack's 2
  // This rack (spine rank 1) completed the spine's round, and in the rack rank 2 completed it.
  IngestResult down = leaf.from_spine(GS_MSG_RESULT, GS_ELEM_FLOAT32, &total, 1, kSpinePort, kSpineJob,
                                      GS_EXP_NONE, /*completer=*/1, /*window=*/20);
  CHECK(down.kind == IngestResult::kSend && header_of(down).elem_type == GS_ELEM_FLOAT16 && down.len == 34);
  // The rack's completer; the spine's window (another rack declared less than this rack's 32).
  CHECK(header_of(down).rank == 2 && header_of(down).window == 20);
  uint16_t h;
  std::memcpy(&h, down.data + GS_HEADER_BYTES, 2);
  CHECK(f16_to_f32_scalar(h) == 2052.0f);  // 2051 rounded to nearest even in fp16 (spacing 2)
}

TEST(mx8_sums_go_up_in_fp32_and_come_down_narrowed_once) {
  Leaf leaf(GS_ELEM_MX8);
  // Blocks of one element: 1.0 = 256 units of 2^-8 (scale 0x77, code 0x78) and 0.0625 = 256 of 2^-12.
  const uint8_t one[2] = {0x77, 0x78}, sixteenth[2] = {0x73, 0x78};  // 256 * 2^-8, 256 * 2^-12
  leaf.data(1, GS_ELEM_MX8, one, 1);
  IngestResult up = leaf.data(2, GS_ELEM_MX8, sixteenth, 1);
  CHECK(up.kind == IngestResult::kSend && header_of(up).elem_type == GS_ELEM_FLOAT32 && up.len == 36);
  float partial;
  std::memcpy(&partial, up.data + GS_HEADER_BYTES, 4);
  CHECK(partial == 1.0625f);    // exact in fp32; in mx8 it would be a tie, rounded
  const float total = 1.1875f;  // + the other rack's 0.125: 304 units of 2^-8, between 288 and 320
  IngestResult down = leaf.from_spine(GS_MSG_RESULT, GS_ELEM_FLOAT32, &total, 1, kSpinePort, kSpineJob,
                                      GS_EXP_NONE, /*completer=*/1, /*window=*/20);
  CHECK(down.kind == IngestResult::kSend && header_of(down).elem_type == GS_ELEM_MX8 && down.len == 34);
  CHECK(down.data[GS_HEADER_BYTES] == 0x77 && down.data[GS_HEADER_BYTES + 1] == 0x7A);  // the tie: 320, even
}

TEST(fixed32_exponents_go_up_as_the_racks_maximum_and_come_down_as_the_spines) {
  Leaf leaf(GS_ELEM_FIXED32);
  auto bootstrap = [&](uint16_t rank, int8_t e) {
    auto p = Leaf::packet(GS_MSG_DATA, leaf.id, leaf.key, rank, GS_ELEM_FIXED32, nullptr, 0, 0, e);
    return leaf.engine.ingest(0, p.data(), p.size(), 1, member_address(0b0110, rank));
  };
  bootstrap(1, 3);
  IngestResult up = bootstrap(2, -5);
  CHECK(up.kind == IngestResult::kSend && header_of(up).next_exp == 3 && header_of(up).count == 0);
  IngestResult down = leaf.from_spine(GS_MSG_RESULT, GS_ELEM_FIXED32, nullptr, 0, kSpinePort, kSpineJob, 9);
  CHECK(down.kind == IngestResult::kSend && header_of(down).next_exp == 9);
}

TEST(the_spine_ending_its_job_ends_the_racks) {
  Leaf leaf;
  const int32_t a = 1;
  leaf.data(1, GS_ELEM_INT32, &a, 1);
  auto p =
      Leaf::packet(GS_MSG_ABORT, kSpineJob, kSpineKey, 3, GS_ELEM_INT32, nullptr, 0, 0, GS_ABORT_RANK_LEFT);
  IngestResult r = leaf.engine.ingest(0, p.data(), GS_HEADER_BYTES, 2, kSpinePort);
  CHECK(r.kind == IngestResult::kSend && r.type == GS_MSG_ABORT && r.dest_rank == GS_RANK_ALL &&
        r.world == 2);
  CHECK(header_of(r).next_exp == GS_ABORT_UPLINK && header_of(r).job_id == leaf.id);
  JobStatus s;
  CHECK(leaf.engine.job_status(leaf.id, &s) && s.aborted && s.abort_reason == GS_ABORT_UPLINK);
  CHECK(s.uplink_reason == GS_ABORT_RANK_LEFT && s.uplink_rank == 3);
  // Members that still send learn it too.
  IngestResult late = leaf.data(2, GS_ELEM_INT32, &a, 1);
  CHECK(late.type == GS_MSG_ABORT && header_of(late).next_exp == GS_ABORT_UPLINK && late.dest_rank == 1);
}

TEST(a_spine_job_hears_one_rank_per_leaf) {
  // Ranks 0-1 behind leaf A (going up as 0), 2-3 behind leaf B (as 2): members 0 and 2.
  Engine engine(EngineConfig{1, 4});
  JobSpec spec;
  spec.name = "spine";
  spec.world = 4;
  spec.members = 0b0101;
  spec.slots = 4;
  spec.payload_bytes = 64;
  spec.key = 5;
  spec.endpoints = {Endpoint{1, 1}, Endpoint{2, 2}};
  std::string err;
  uint32_t id = engine.create_job(spec, &err);
  CHECK(id != 0);
  const int32_t v = 4;
  auto send = [&](uint16_t rank) {
    auto p = Leaf::packet(GS_MSG_DATA, id, 5, rank, GS_ELEM_INT32, &v, 1);
    return engine.ingest(0, p.data(), p.size(), 1, member_address(0b0101, rank));
  };
  CHECK(send(1).reason == DropReason::kBadRank);
  CHECK(send(0).kind == IngestResult::kAbsorbed);
  IngestResult r = send(2);
  CHECK(r.kind == IngestResult::kSend && r.world == 2 && r.type == GS_MSG_RESULT);
  // Bad specs are refused with a reason.
  spec.members = 0b10000;
  CHECK(engine.create_job(spec, &err) == 0 && !err.empty());
  spec.members = 0b0111;  // three members, two endpoints
  CHECK(engine.create_job(spec, &err) == 0 && err.find("endpoint") != std::string::npos);
}

TEST(one_ingest_serves_both_directions_and_only_a_leaf_hears_a_spine) {
  Leaf leaf;
  const int32_t a = 1, b = 2, total = 7;
  IngestResult up0 = leaf.data(1, GS_ELEM_INT32, &a, 1);
  CHECK(up0.kind == IngestResult::kAbsorbed && !up0.from_spine);
  IngestResult up = leaf.data(2, GS_ELEM_INT32, &b, 1);
  CHECK(up.kind == IngestResult::kSend && up.type == GS_MSG_DATA && !up.from_spine);
  // The spine's HELD is absorbed, its RESULT comes down; both are marked as the spine's.
  IngestResult held = leaf.from_spine(GS_MSG_HELD, GS_ELEM_INT32, nullptr, 0);
  CHECK(held.kind == IngestResult::kAbsorbed && held.from_spine);
  IngestResult down = leaf.from_spine(GS_MSG_RESULT, GS_ELEM_INT32, &total, 1);
  CHECK(down.kind == IngestResult::kSend && down.type == GS_MSG_RESULT && down.from_spine && down.slot == 0);
  // A message type that is neither a rank's nor the spine's; a short datagram.
  CHECK(leaf.from_spine(GS_MSG_RING_PARTIAL, GS_ELEM_INT32, nullptr, 0).reason == DropReason::kBadType);
  auto p = Leaf::packet(GS_MSG_RESULT, kSpineJob, kSpineKey, 0, GS_ELEM_INT32, &total, 1);
  CHECK(leaf.engine.ingest(0, p.data(), GS_HEADER_BYTES - 1, 2, kSpinePort).reason ==
        DropReason::kShortPacket);

  // A switch that is not a leaf drops the same RESULT as a type it does not hear, even for a job
  // whose spec goes up (the engine was not told it is a leaf).
  Engine plain(EngineConfig{1, 4});
  CHECK(plain.ingest(0, p.data(), p.size(), 2, kSpinePort).reason == DropReason::kBadType);
  // A leaf with no job of that spine job: unknown job.
  Engine empty_leaf(EngineConfig{1, 4, true});
  CHECK(empty_leaf.ingest(0, p.data(), p.size(), 2, kSpinePort).reason == DropReason::kUnknownJob);
  CounterValues c = empty_leaf.total_counters();
  CHECK(c.pkts_in == 1 && c.drops_total() == 1);
}

GS_TEST_MAIN()
