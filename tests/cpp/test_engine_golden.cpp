// Engine conformance as declarative packet tables: each scenario is a list of input packets and
// the packet (or drop) each one must produce. These tables are the executable form of the
// switch algorithm in docs/protocol.md §3.
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/header.h"
#include "gradswitch/wire.h"
#include "harness.h"
#include "switch/engine/engine.h"

using namespace gradswitch;

namespace {

enum class Out { kNothing, kMulticast, kUnicast, kDrop, kAbort, kAbortAll, kHeld };

// The element type a table's values travel as.
template <typename T>
constexpr uint8_t elem_of();
template <>
constexpr uint8_t elem_of<int32_t>() {
  return GS_ELEM_INT32;
}
template <>
constexpr uint8_t elem_of<double>() {
  return GS_ELEM_FLOAT64;
}

template <typename T>
struct In {
  uint16_t rank;
  uint16_t slot;
  uint8_t version;  // the DATA's flags: VERSION, and RETX on a resend
  uint32_t seq;
  uint32_t offset;
  std::vector<T> values;
  int job = 0;  // index into the scenario's jobs (0 or 1)
  bool wrong_key = false;
};

template <typename T>
struct Expect {
  // A constructor rather than default member initializers: GCC 12 fails on those in this template.
  Expect(Out o, std::vector<T> v = std::vector<T>(), DropReason r = DropReason::kNone)
      : out(o), values(std::move(v)), reason(r) {}
  // A HELD to ranks `to` (bit r: rank r) naming the round's `contributors`, with DSACK or not.
  Expect(uint64_t to_ranks, uint64_t contributors_, bool dsack_)
      : out(Out::kHeld), to(to_ranks), contributors(contributors_), dsack(dsack_) {}
  Out out;
  std::vector<T> values;  // payload of a result
  DropReason reason = DropReason::kNone;
  uint64_t to = 0, contributors = 0;
  bool dsack = false;
};

template <typename T>
struct Step {
  In<T> in;
  Expect<T> expect;
  uint64_t at_ms = 0;  // the switch's clock at this packet; 0: 1 us after the previous step
};

template <typename T>
struct Scenario {
  const char* name;
  uint16_t world;
  std::vector<Step<T>> steps;
};

// The window every DATA of a rank declares here (rank 3's none): a RESULT must carry the smallest
// its round's DATA declared, which is neither the first nor the last rank's in every world.
uint16_t declared_window(uint16_t rank) {
  return rank == 3 ? 0 : static_cast<uint16_t>(40 + (rank + 1) % 3 * 5);
}

// A complete round holds every rank's DATA: the smallest window any of them declared.
uint16_t smallest_declared(uint16_t world) {
  uint16_t w = 0;
  for (uint16_t r = 0; r < world; ++r) w = gs_smaller_window(w, declared_window(r));
  return w;
}

template <typename T>
std::vector<uint8_t> data_packet(uint32_t job_id, uint32_t key, const In<T>& in) {
  std::vector<uint8_t> p(GS_HEADER_BYTES + in.values.size() * sizeof(T));
  HeaderBuilder(GS_MSG_DATA, job_id, key)
      .rank(in.rank)
      .slot(in.slot)
      .flags(in.version)
      .elems(elem_of<T>(), static_cast<uint16_t>(in.values.size()))
      .round(in.seq, in.offset)
      .window(declared_window(in.rank))
      .encode(p.data());
  if (!in.values.empty())
    std::memcpy(p.data() + GS_HEADER_BYTES, in.values.data(), in.values.size() * sizeof(T));
  return p;
}

std::vector<Endpoint> endpoints(uint16_t world) {
  std::vector<Endpoint> e(world);
  for (uint16_t r = 0; r < world; ++r) e[r] = Endpoint{0x7F000001u + r, static_cast<uint16_t>(9000 + r)};
  return e;
}

template <typename T>
void run(const Scenario<T>& sc) {
  Engine engine(EngineConfig{1, 8});
  uint32_t ids[2], keys[2] = {0xA5A5A5A5u, 0x12345678u};
  for (int j = 0; j < 2; ++j) {
    JobSpec spec;
    spec.name = "job" + std::to_string(j);
    spec.world = sc.world;
    spec.slots = 4;
    spec.payload_bytes = 64;
    spec.key = keys[j];
    spec.wire = elem_of<T>();  // int32 is accepted on any wire; float64 jobs are joined with it
    spec.endpoints = endpoints(sc.world);
    std::string err;
    ids[j] = engine.create_job(spec, &err);
    CHECK(ids[j] != 0);
  }
  int step_no = 0;
  uint64_t now_ns = 0;
  // The rank that completed each job's slot version's latest round (from its multicast RESULT): the
  // shadow copy's unicast answers name it too.
  std::map<std::tuple<int, unsigned, unsigned>, uint16_t> completer;
  for (const Step<T>& st : sc.steps) {
    ++step_no;
    const In<T>& in = st.in;
    auto pkt = data_packet(ids[in.job], in.wrong_key ? keys[in.job] ^ 1u : keys[in.job], in);
    const Endpoint from = in.rank < sc.world ? endpoints(sc.world)[in.rank] : Endpoint{};
    now_ns = st.at_ms ? st.at_ms * 1'000'000 : now_ns + 1000;
    IngestResult r = engine.ingest(0, pkt.data(), pkt.size(), now_ns, from);
    auto fail = [&](const char* what) {
      std::fprintf(stderr, "  scenario '%s' step %d (rank %u slot %u v%u seq %u off %u): %s\n", sc.name,
                   step_no, in.rank, in.slot, in.version, in.seq, in.offset, what);
      ++gs_test::failures();
    };
    switch (st.expect.out) {
      case Out::kNothing:
        if (r.kind != IngestResult::kAbsorbed) fail("expected the packet to be absorbed");
        continue;
      case Out::kDrop:
        if (r.kind != IngestResult::kDropped || r.reason != st.expect.reason)
          fail("expected a drop with the reason");
        continue;
      case Out::kAbort:
        if (r.kind != IngestResult::kSend || r.len != GS_HEADER_BYTES || r.dest_rank != in.rank)
          fail("expected ABORT");
        if (r.type != GS_MSG_ABORT || r.seq != in.seq || r.count != 0)
          fail("ABORT described wrongly in the result");
        continue;
      case Out::kAbortAll:
        if (r.kind != IngestResult::kSend || r.len != GS_HEADER_BYTES || r.dest_rank != GS_RANK_ALL)
          fail("expected ABORT to every rank");
        if (r.type != GS_MSG_ABORT || r.seq != in.seq || r.count != 0)
          fail("ABORT described wrongly in the result");
        continue;
      case Out::kHeld: {
        gs_header h{};
        if (r.kind == IngestResult::kSend) gs_header_decode(r.data, &h);
        if (r.kind != IngestResult::kSend || r.type != GS_MSG_HELD || h.type != GS_MSG_HELD ||
            r.len != GS_HEADER_BYTES + GS_HELD_BODY_BYTES) {
          fail("expected HELD");
          continue;
        }
        if (destinations(r) != st.expect.to) fail("HELD to the wrong ranks");
        if (gs_held_contributors(r.data + GS_HEADER_BYTES) != st.expect.contributors)
          fail("HELD names the wrong contributors");
        if (bool(h.flags & GS_FLAG_DSACK) != st.expect.dsack) fail("wrong DSACK flag");
        if (h.rank != GS_RANK_ALL || h.count != 0 || h.slot != in.slot || h.seq != in.seq ||
            h.offset != in.offset || (h.flags & GS_FLAG_VERSION) != (in.version & GS_FLAG_VERSION))
          fail("HELD header does not name the round");
        continue;
      }
      case Out::kMulticast:
      case Out::kUnicast:
        break;
    }
    if (r.kind != IngestResult::kSend) {
      fail("expected a result packet");
      continue;
    }
    const bool multicast = st.expect.out == Out::kMulticast;
    gs_header h;
    gs_header_decode(r.data, &h);
    if (r.dest_rank != (multicast ? GS_RANK_ALL : in.rank)) fail("wrong destination");
    if (h.type != GS_MSG_RESULT || h.job_id != ids[in.job] || h.key != keys[in.job])
      fail("wrong type/job/key");
    if ((h.flags & GS_FLAG_VERSION) != (in.version & GS_FLAG_VERSION)) fail("wrong version");
    if (bool(h.flags & GS_FLAG_UNICAST) == multicast) fail("wrong unicast flag");
    // A RESULT names the rank whose DATA completed it, carries the smallest window the round's DATA
    // declared, and says whether it was a resend (RETX).
    const auto round_key =
        std::make_tuple(in.job, unsigned{in.slot}, static_cast<unsigned>(in.version & GS_FLAG_VERSION));
    if (multicast) completer[round_key] = in.rank;
    const auto known = completer.find(round_key);
    if (known == completer.end() || h.rank != known->second) fail("wrong completer");
    if (h.window != smallest_declared(sc.world)) fail("wrong window");
    if (multicast && bool(h.flags & GS_FLAG_RETX) != bool(in.version & GS_FLAG_RETX)) fail("wrong RETX flag");
    if (!multicast && (h.flags & GS_FLAG_RETX)) fail("a UNICAST answer carries RETX");
    if (h.slot != in.slot || h.seq != in.seq || h.offset != in.offset) fail("wrong slot/seq/offset");
    if (h.elem_type != elem_of<T>()) fail("wrong element type");
    // The result describes what it carries (backends read these, never the header).
    if (r.type != h.type || r.seq != h.seq || r.count != h.count)
      fail("result fields disagree with its header");
    if (h.count != st.expect.values.size() || r.len != GS_HEADER_BYTES + h.count * sizeof(T)) {
      fail("wrong count");
      continue;
    }
    // Bitwise: the sums are specified exactly (for floats, additions in arrival order).
    if (h.count && std::memcmp(r.data + GS_HEADER_BYTES, st.expect.values.data(), h.count * sizeof(T)) != 0)
      fail("wrong sum");
  }
}

using V = std::vector<int32_t>;
using D = std::vector<double>;
constexpr auto kNothing = Out::kNothing;
constexpr auto kMulticast = Out::kMulticast;
constexpr auto kUnicast = Out::kUnicast;
constexpr auto kDrop = Out::kDrop;
constexpr auto kAbort = Out::kAbort;
constexpr auto kAbortAll = Out::kAbortAll;
constexpr uint8_t R = GS_FLAG_RETX;  // In's version byte is the DATA's flags: a resend

const std::vector<Scenario<int32_t>> kScenarios = {
    {"basic reduction, 2 workers",
     2,
     {
         {{0, 0, 0, 0, 0, V{1, 2, 3}}, {kNothing}},
         {{1, 0, 0, 0, 0, V{10, 20, 30}}, {kMulticast, V{11, 22, 33}}},
     }},
    {"basic reduction, 3 workers, arrival order 2-0-1",
     3,
     {
         {{2, 1, 0, 0, 16, V{100, -1}}, {kNothing}},
         {{0, 1, 0, 0, 16, V{1, -1}}, {kNothing}},
         {{1, 1, 0, 0, 16, V{10, -1}}, {kMulticast, V{111, -3}}},
     }},
    {"retransmission after reduction answered from the shadow copy",
     3,
     {
         {{0, 0, 0, 0, 0, V{1}}, {kNothing}},
         {{1, 0, 0, 0, 0, V{2}}, {kNothing}},
         {{2, 0, 0, 0, 0, V{4}}, {kMulticast, V{7}}},
         {{1, 0, R, 0, 0, V{2}}, {kUnicast, V{7}}},
         {{0, 0, R, 0, 0, V{1}}, {kUnicast, V{7}}},
         {{2, 0, 0, 0, 0, V{4}}, {kNothing}},  // a network duplicate (no RETX) is not answered
     }},
    {"a resend completes the round: the RESULT says so",
     3,
     {
         {{0, 1, 0, 0, 0, V{1}}, {kNothing}},
         {{2, 1, 0, 0, 0, V{4}}, {kNothing}},
         {{1, 1, R, 0, 0, V{2}}, {kMulticast, V{7}}},  // rank 1's original was lost
     }},
    {"reduction in the other version",
     2,
     {
         {{0, 2, 1, 0, 0, V{5}}, {kNothing}},
         {{1, 2, 1, 0, 0, V{6}}, {kMulticast, V{11}}},
     }},
    {"both versions in flight",
     2,
     {
         // Version 0 completes; worker 0 moves on to version 1 while worker 1's result was lost.
         {{0, 0, 0, 0, 0, V{1}}, {kNothing}},
         {{1, 0, 0, 0, 0, V{2}}, {kMulticast, V{3}}},
         {{0, 0, 1, 0, 4, V{10}}, {kNothing}},
         {{1, 0, R, 0, 0, V{2}}, {kUnicast, V{3}}},  // shadow of version 0 still there
         {{1, 0, 1, 0, 4, V{20}}, {kMulticast, V{30}}},
     }},
    {"slot reuse: version 0, 1, then 0 again with a new round",
     2,
     {
         {{0, 3, 0, 0, 0, V{1}}, {kNothing}},
         {{1, 3, 0, 0, 0, V{1}}, {kMulticast, V{2}}},
         {{0, 3, 1, 0, 4, V{2}}, {kNothing}},
         {{1, 3, 1, 0, 4, V{2}}, {kMulticast, V{4}}},
         {{1, 3, 0, 0, 8, V{3}}, {kNothing}},  // the first contributor initialises: no stale sum
         {{0, 3, 0, 0, 8, V{3}}, {kMulticast, V{6}}},
         {{0, 3, 1, 1, 0, V{7}}, {kNothing}},  // next allreduce (seq 1) reuses version 1
         {{1, 3, 1, 1, 0, V{8}}, {kMulticast, V{15}}},
     }},
    {"a resend to a round open 20 ms: HELD to the ranks the round lacks",
     3,
     {
         {{0, 2, 0, 0, 0, V{1}}, {kNothing}, 1},
         {{1, 2, R, 0, 0, V{2}}, {kNothing}, 20},            // rank 1's lost DATA, 19 ms on: not yet
         {{1, 2, R, 0, 0, V{2}}, {0b110, 0b011, true}, 21},  // open 20 ms: rank 2 lacks; rank 1: DSACK
         {{2, 2, 0, 0, 0, V{4}}, {kMulticast, V{7}}, 22},
     }},
    {"a resend to an open round: HELD to the resender (DSACK) and to the ranks the round lacks, 4 ranks",
     4,
     {
         {{0, 1, 0, 0, 0, V{1}}, {kNothing}, 10},
         {{2, 1, 0, 0, 0, V{4}}, {kNothing}, 11},
         {{0, 1, R, 0, 0, V{1}}, {0b0001, 0b0101, true}, 12},  // open 2 ms: to rank 0 alone
         {{0, 1, R, 0, 0, V{1}}, {0b1011, 0b0101, true}, 30},  // open 20 ms: ranks 1 and 3 are lacking
         {{1, 1, R, 0, 0, V{2}}, {kNothing}},                  // rank 1's lost DATA: rank 3 told 1 us ago
         {{2, 1, R, 0, 0, V{4}}, {0b1100, 0b0111, true}, 31},  // 1 ms later: rank 3 is told again
         {{2, 1, 0, 0, 0, V{4}}, {kNothing}},                  // a network duplicate: no answer
         {{3, 1, 0, 0, 0, V{8}}, {kMulticast, V{15}}},
         {{1, 1, R, 0, 0, V{2}}, {kUnicast, V{15}}},  // complete: the shadow copy answers, as before
     }},
    {"duplicates ignored",
     3,
     {
         {{0, 0, 0, 0, 0, V{1}}, {kNothing}},
         {{0, 0, 0, 0, 0, V{1}}, {kNothing}},
         {{1, 0, 0, 0, 0, V{2}}, {kNothing}},
         {{1, 0, 0, 0, 0, V{2}}, {kNothing}},
         {{2, 0, 0, 0, 0, V{4}}, {kMulticast, V{7}}},
     }},
    {"retransmission from the previous version",
     2,
     {
         {{0, 1, 0, 0, 0, V{1}}, {kNothing}},
         {{1, 1, 0, 0, 0, V{1}}, {kMulticast, V{2}}},
         {{0, 1, 1, 0, 4, V{5}}, {kNothing}},
         {{1, 1, 1, 0, 4, V{5}}, {kMulticast, V{10}}},
         // A late retransmission of the version-0 round is still answered from its shadow...
         {{0, 1, R, 0, 0, V{1}}, {kUnicast, V{2}}},
         // ...and version 1's shadow answers its own.
         {{1, 1, 1 | R, 0, 4, V{5}}, {kUnicast, V{10}}},
     }},
    {"slot reuse with retransmissions",
     2,
     {
         {{0, 0, 0, 0, 0, V{1}}, {kNothing}},
         {{0, 0, 0, 0, 0, V{1}}, {kNothing}},  // retransmitted before completion: a duplicate
         {{1, 0, 0, 0, 0, V{2}}, {kMulticast, V{3}}},
         {{1, 0, 1, 0, 4, V{4}}, {kNothing}},
         {{1, 0, 1, 0, 4, V{4}}, {kNothing}},
         {{0, 0, 1, 0, 4, V{8}}, {kMulticast, V{12}}},
         {{0, 0, 0, 0, 8, V{16}}, {kNothing}},                           // reuse of version 0
         {{0, 0, 0, 0, 0, V{1}}, {kDrop, {}, DropReason::kStaleRound}},  // old round while the new is open
         {{1, 0, 0, 0, 8, V{32}}, {kMulticast, V{48}}},
         {{1, 0, 0, 0, 0, V{2}}, {kDrop, {}, DropReason::kStaleRound}},  // older than the completed round
         {{1, 0, R, 0, 8, V{32}}, {kUnicast, V{48}}},
     }},
    {"packets of another job or with a wrong key ignored",
     2,
     {
         {{0, 0, 0, 0, 0, V{1}}, {kNothing}},
         {{1, 0, 0, 0, 0, V{1000}, 0, true}, {kDrop, {}, DropReason::kWrongKey}},
         {{1, 0, 0, 0, 0, V{500}, 1}, {kNothing}},  // job 1's slot 0 is separate
         {{1, 0, 0, 0, 0, V{2}}, {kMulticast, V{3}}},
         {{0, 0, 0, 0, 0, V{7}, 1}, {kMulticast, V{507}}},
     }},
    {"inconsistent count within a round aborts the job for every rank",
     2,
     {
         {{0, 0, 0, 0, 0, V{1, 2}}, {kNothing}},
         {{1, 0, 0, 0, 0, V{1}}, {kAbortAll}},
         {{1, 0, 0, 0, 0, V{1, 1}}, {kAbort}},
         {{0, 0, 0, 0, 0, V{1}, 1}, {kNothing}},  // the other job is unaffected
     }},
    {"rank and slot bounds",
     2,
     {
         {{2, 0, 0, 0, 0, V{1}}, {kDrop, {}, DropReason::kBadRank}},
         {{0, 4, 0, 0, 0, V{1}}, {kDrop, {}, DropReason::kSlotOutOfRange}},
         {{0, 0, 0, 0, 0, V(17, 1)}, {kDrop, {}, DropReason::kBadLength}},  // 68 bytes > 64-byte payload
     }},
    {"one worker: every contribution completes",
     1,
     {
         {{0, 0, 0, 0, 0, V{9}}, {kMulticast, V{9}}},
         {{0, 0, R, 0, 0, V{9}}, {kUnicast, V{9}}},
     }},
};

// float64: IEEE binary64 additions in arrival order. 1e16 + 1 is a tie between 1e16 and 1e16 + 2
// and rounds to even (1e16), so the order of arrival shows in the result, exactly as specified.
const std::vector<Scenario<double>> kFloat64Scenarios = {
    {"float64: the sum keeps what float32 would lose",
     2,
     {
         {{0, 0, 0, 0, 0, D{0x1p53, 0.5, -1.25}}, {kNothing}},
         {{1, 0, 0, 0, 0, D{2.0, 0.25, 1e-300}}, {kMulticast, D{0x1p53 + 2.0, 0.75, -1.25 + 1e-300}}},
     }},
    {"float64: additions in arrival order, 1 + 1 + 1e16",
     3,
     {
         {{0, 1, 0, 0, 8, D{1.0}}, {kNothing}},
         {{1, 1, 0, 0, 8, D{1.0}}, {kNothing}},
         {{2, 1, 0, 0, 8, D{1e16}}, {kMulticast, D{1e16 + 2.0}}},
     }},
    {"float64: additions in arrival order, 1e16 + 1 + 1",
     3,
     {
         {{2, 1, 0, 0, 8, D{1e16}}, {kNothing}},
         {{0, 1, 0, 0, 8, D{1.0}}, {kNothing}},
         {{1, 1, 0, 0, 8, D{1.0}}, {kMulticast, D{1e16}}},
     }},
    {"float64: retransmission answered from the shadow copy",
     2,
     {
         {{0, 2, 1, 4, 16, D{-0.0, 3.0}}, {kNothing}},
         {{1, 2, 1, 4, 16, D{-0.0, 4.0}}, {kMulticast, D{-0.0, 7.0}}},
         {{0, 2, 1 | R, 4, 16, D{-0.0, 3.0}}, {kUnicast, D{-0.0, 7.0}}},
     }},
    {"float64: a full payload (8 elements of 64 bytes) and one too many",
     2,
     {
         {{0, 3, 0, 0, 0, D(8, 1.5)}, {kNothing}},
         {{1, 3, 0, 0, 0, D(9, 1.5)}, {kDrop, {}, DropReason::kBadLength}},
         {{1, 3, 0, 0, 0, D(8, 2.5)}, {kMulticast, D(8, 4.0)}},
         {{0, 2, 0, 0, 0, D(8, 1.5)}, {kNothing}},
         {{1, 2, 0, 0, 0, D(7, 1.5)}, {kAbortAll}},  // a shorter chunk: the ranks disagree
     }},
};

template <typename T>
void run_all(const std::vector<Scenario<T>>& scenarios) {
  for (const Scenario<T>& sc : scenarios) {
    int before = gs_test::failures();
    run(sc);
    std::printf("  %-60s %s\n", sc.name, gs_test::failures() == before ? "ok" : "FAILED");
  }
}

}  // namespace

TEST(golden_tables) {
  run_all(kScenarios);
}

TEST(golden_tables_float64) {
  run_all(kFloat64Scenarios);
}

GS_TEST_MAIN()
