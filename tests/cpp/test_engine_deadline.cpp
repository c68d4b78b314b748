// Bounded-time rounds (docs/protocol.md §3.1): a round closes at its deadline with the contributions
// present, its PARTIAL RESULT names them, late DATA is dropped, counted and answered with that same
// result, and a late contribution never reaches a later round. A job without a deadline is unchanged.
#include <climits>
#include <cstddef>
#include <cstring>
#include <vector>

#include "common/header.h"
#include "deadline_job.h"
#include "gradswitch/wire.h"
#include "harness.h"
#include "ingest_result.h"
#include "switch/engine/engine.h"

using namespace gradswitch;

namespace {

// §3.1's pins, with rounds as a worker sends them: slot 0's rounds seq 0, 1, 2, ... in versions 0, 1,
// 0, ... (it flips the version at each use of the slot), so a version's previous round is in the other.
uint8_t version_of(uint32_t seq) {
  return static_cast<uint8_t>(seq & 1);
}
uint64_t contributors(const IngestResult& r) {
  return r.data && r.len >= kTrailerAt + GS_PARTIAL_TRAILER_BYTES ? gs_held_contributors(r.data + kTrailerAt)
                                                                  : ~uint64_t{0};
}
}  // namespace

TEST(default_job_waits_for_every_rank_and_is_never_closed) {
  Job4 j(false);
  CHECK(j.id != 0);
  for (uint16_t r = 0; r < 3; ++r) CHECK_EQ(j.send(r, 0, 10, 1).deadline_ns, uint64_t{0});
  CHECK_EQ(int(j.close(0, kDeadlineNs * 10).kind), int(IngestResult::kDropped));  // nothing to close
  const IngestResult done = j.send(3, 0, 10, 2);
  CHECK_EQ(int(done.kind), int(IngestResult::kSend));
  CHECK_EQ(done.len, uint32_t{GS_HEADER_BYTES + 16});
  CHECK_EQ(int(header_of(done).flags & GS_FLAG_PARTIAL), 0);
  CHECK_EQ(header_of(done).rank, uint16_t{3});
  CHECK_EQ(j.element(done, 0), 4 * 10 + 0 + 1 + 2 + 3);
  CHECK_EQ(j.counters().partial, uint64_t{0});
}

TEST(round_closes_at_its_deadline_with_the_contributors) {
  Job4 j(true);
  CHECK_EQ(j.send(0, 0, 10, 100).deadline_ns, 100 + kDeadlineNs);  // the opener starts the clock
  CHECK_EQ(j.send(1, 0, 10, 200).deadline_ns, uint64_t{0});
  CHECK_EQ(j.send(2, 0, 10, 300).deadline_ns, uint64_t{0});
  const IngestResult r = j.close(0, 100 + kDeadlineNs);
  CHECK_EQ(int(r.kind), int(IngestResult::kSend));
  CHECK_EQ(r.dest_rank, uint16_t{GS_RANK_ALL});  // every rank, the one it lacks included
  const gs_header h = header_of(r);
  CHECK_EQ(int(h.flags), int(GS_FLAG_PARTIAL));
  CHECK_EQ(h.rank, uint16_t{GS_RANK_ALL});  // no DATA completed it
  CHECK_EQ(r.len, uint32_t{kTrailerAt + GS_PARTIAL_TRAILER_BYTES});
  CHECK_EQ(gs_held_contributors(r.data + kTrailerAt), uint64_t{0x7});
  CHECK_EQ(j.element(r, 0), 3 * 10 + 0 + 1 + 2);
  CHECK_EQ(j.element(r, 3), 3 * 13 + 0 + 1 + 2);
  const CounterValues c = j.counters();
  CHECK_EQ(c.partial, uint64_t{1});
  CHECK_EQ(c.missed, uint64_t{1});
  CHECK_EQ(c.completed, uint64_t{1});
}

TEST(late_data_is_dropped_counted_and_answered_with_the_same_result) {
  Job4 j(true);
  for (uint16_t r = 0; r < 3; ++r) j.send(r, 0, 10, 1);
  const IngestResult closed = j.close(0, 1 + kDeadlineNs);
  const std::vector<uint8_t> multicast(closed.data, closed.data + closed.len);
  const IngestResult late = j.send(3, 0, 10, 2 + kDeadlineNs);
  CHECK_EQ(int(late.kind), int(IngestResult::kSend));
  CHECK_EQ(late.dest_rank, uint16_t{3});
  CHECK_EQ(int(late.reason), int(DropReason::kLate));
  CHECK_EQ(int(header_of(late).flags), int(GS_FLAG_UNICAST | GS_FLAG_PARTIAL));  // not DSACK: it was not held
  CHECK_EQ(late.len, uint32_t(multicast.size()));
  // The elements and the trailer are the multicast's, bit for bit: every rank holds the same values.
  CHECK(std::memcmp(late.data + GS_HEADER_BYTES, multicast.data() + GS_HEADER_BYTES,
                    late.len - GS_HEADER_BYTES) == 0);
  // A network copy of the late DATA is not answered again; a resend is.
  CHECK_EQ(int(j.send(3, 0, 10, 3 + kDeadlineNs).kind), int(IngestResult::kDropped));
  CHECK_EQ(int(j.send(3, 0, 10, 4 + kDeadlineNs, GS_FLAG_RETX).kind), int(IngestResult::kSend));
  CHECK_EQ(j.counters().drops[size_t(DropReason::kLate)], uint64_t{3});
  // A contributor's resend gets the partial result too, with DSACK and the trailer.
  const IngestResult again = j.send(1, 0, 10, 5 + kDeadlineNs, GS_FLAG_RETX);
  CHECK_EQ(int(header_of(again).flags), int(GS_FLAG_UNICAST | GS_FLAG_DSACK | GS_FLAG_PARTIAL));
  CHECK_EQ(again.len, uint32_t(multicast.size()));
  CHECK_EQ(gs_held_contributors(again.data + kTrailerAt), uint64_t{0x7});
}

TEST(late_data_never_reaches_a_later_round) {
  Job4 j(true);
  for (uint16_t r = 0; r < 3; ++r) j.send(r, 0, 10, 1);
  j.close(0, 1 + kDeadlineNs);
  // The fast ranks' next round in this slot version waits until rank 3 has its result (pinned).
  const IngestResult early = j.send(0, 1, 1000, 2 + kDeadlineNs);
  CHECK_EQ(int(early.kind), int(IngestResult::kDropped));
  CHECK_EQ(int(early.reason), int(DropReason::kPinned));
  CHECK_EQ(int(j.send(3, 0, 10, 3 + kDeadlineNs).kind), int(IngestResult::kSend));  // answered...
  // ...which shows nothing (the answer may be lost): still pinned.
  CHECK_EQ(int(j.send(0, 1, 1000, 4 + kDeadlineNs, GS_FLAG_RETX).reason), int(DropReason::kPinned));
  // Rank 3's own next round in the version shows it holds the result: it opens the round.
  CHECK_EQ(int(j.send(3, 1, 1000, 5 + kDeadlineNs).kind), int(IngestResult::kAbsorbed));
  // A resend of rank 3's old round is older than the slot's round now: stale, summed nowhere.
  CHECK_EQ(int(j.send(3, 0, 10, 6 + kDeadlineNs, GS_FLAG_RETX).reason), int(DropReason::kStaleRound));
  for (uint16_t r = 0; r < 2; ++r)
    CHECK_EQ(int(j.send(r, 1, 1000, 7 + kDeadlineNs, GS_FLAG_RETX).kind), int(IngestResult::kAbsorbed));
  const IngestResult done = j.send(2, 1, 1000, 8 + kDeadlineNs);
  CHECK_EQ(int(done.kind), int(IngestResult::kSend));
  CHECK_EQ(int(sent(done).flags & GS_FLAG_PARTIAL), 0);  // complete: no trailer
  CHECK_EQ(done.len, uint32_t{GS_HEADER_BYTES + 16});
  for (int i = 0; i < 4; ++i) CHECK_EQ(j.element(done, i), 4 * (1000 + i) + 0 + 1 + 2 + 3);
  // Its deadline then finds it complete: nothing more goes out.
  CHECK_EQ(int(j.close(1, 10 * kDeadlineNs).kind), int(IngestResult::kAbsorbed));
}

TEST(a_rank_that_sends_a_newer_round_releases_its_pin) {
  Job4 j(true);
  for (uint16_t r = 0; r < 3; ++r) j.send(r, 0, 10, 1);
  j.close(0, 1 + kDeadlineNs);
  // Rank 3's DATA was lost but the multicast reached it: its next round in the version proves it.
  CHECK_EQ(int(j.send(3, 1, 1000, 2 + kDeadlineNs).kind), int(IngestResult::kAbsorbed));
  CHECK_EQ(int(j.send(0, 1, 1000, 3 + kDeadlineNs).kind), int(IngestResult::kAbsorbed));
}

// Rank 3 contributed to round 0 and lost its result; round 1 then closed at its deadline without it.
// Rank 3 has not shown that it holds round 0 (only its arrival at round 1 would): round 0 stays, and
// the others' round 2, which would overwrite it, waits.
TEST(a_contributor_that_lost_the_result_keeps_its_round_until_it_reaches_the_next) {
  Job4 j(true);
  for (uint16_t r = 0; r < 3; ++r) j.send(r, 0, 10, 1);
  const IngestResult round0 = j.send(3, 0, 10, 2);  // a default RESULT; rank 3's copy is lost
  CHECK_EQ(int(round0.kind), int(IngestResult::kSend));
  const std::vector<uint8_t> lost = body(round0);
  for (uint16_t r = 0; r < 3; ++r) j.send(r, 1, 100, 3, version_of(1));
  const IngestResult round1 = j.close(1, 3 + kDeadlineNs, version_of(1));
  CHECK_EQ(int(round1.kind), int(IngestResult::kSend));
  CHECK_EQ(contributors(round1), uint64_t{0x7});
  for (uint16_t r = 0; r < 3; ++r)
    CHECK_EQ(int(j.send(r, 2, 1000, 4 + kDeadlineNs).reason), int(DropReason::kPinned));
  CHECK_EQ(j.counters().drops[size_t(DropReason::kPinned)], uint64_t{3});
  // Rank 3's resend of round 0 finds it, with the bytes every other rank got.
  const IngestResult again = j.send(3, 0, 10, 5 + kDeadlineNs, GS_FLAG_RETX);
  CHECK_EQ(int(again.kind), int(IngestResult::kSend));
  CHECK_EQ(again.dest_rank, uint16_t{3});
  CHECK_EQ(int(sent(again).flags), int(GS_FLAG_UNICAST | GS_FLAG_DSACK));
  CHECK(body(again) == lost);
  // Answering it proves nothing (the answer may be lost too): still pinned.
  CHECK_EQ(int(j.send(0, 2, 1000, 6 + kDeadlineNs, GS_FLAG_RETX).reason), int(DropReason::kPinned));
  // Its late round 1 does: answered with round 1's result, and round 0 is released.
  const IngestResult late = j.send(3, 1, 100, 7 + kDeadlineNs, version_of(1));
  CHECK_EQ(int(late.reason), int(DropReason::kLate));
  CHECK(body(late) == body(round1));
  for (uint16_t r = 0; r < 3; ++r)
    CHECK_EQ(int(j.send(r, 2, 1000, 8 + kDeadlineNs, GS_FLAG_RETX).kind), int(IngestResult::kAbsorbed));
  const IngestResult done = j.send(3, 2, 1000, 9 + kDeadlineNs);
  CHECK_EQ(int(done.kind), int(IngestResult::kSend));
  CHECK_EQ(int(sent(done).flags), 0);
  CHECK_EQ(j.element(done, 0), 4 * 1000 + 0 + 1 + 2 + 3);
}

// Step 2' answers a late rank, but the answer may be lost: the round stays pinned for that rank until
// it arrives at the slot's next round (which it starts only with this round's result).
TEST(answering_late_data_keeps_the_pin_until_the_rank_reaches_the_next_round) {
  Job4 j(true);
  for (uint16_t r = 0; r < 3; ++r) j.send(r, 0, 10, 1);
  const IngestResult round0 = j.close(0, 1 + kDeadlineNs);
  for (uint16_t r = 0; r < 3; ++r) j.send(r, 1, 100, 2 + kDeadlineNs, version_of(1));
  const IngestResult round1 = j.close(1, 2 + 2 * kDeadlineNs, version_of(1));
  CHECK_EQ(int(round1.kind), int(IngestResult::kSend));
  const IngestResult late = j.send(3, 0, 10, 3 + 2 * kDeadlineNs);  // answered; the answer is lost
  CHECK_EQ(int(late.kind), int(IngestResult::kSend));
  CHECK_EQ(int(late.reason), int(DropReason::kLate));
  CHECK(body(late) == body(round0));
  for (uint16_t r = 0; r < 3; ++r)
    CHECK_EQ(int(j.send(r, 2, 1000, 4 + 2 * kDeadlineNs).reason), int(DropReason::kPinned));
  // A network copy of the late DATA is not answered again; the rank's resend is, with the same bytes.
  CHECK_EQ(int(j.send(3, 0, 10, 5 + 2 * kDeadlineNs).kind), int(IngestResult::kDropped));
  const IngestResult again = j.send(3, 0, 10, 6 + 2 * kDeadlineNs, GS_FLAG_RETX);
  CHECK_EQ(int(again.kind), int(IngestResult::kSend));
  CHECK_EQ(int(sent(again).flags), int(GS_FLAG_UNICAST | GS_FLAG_PARTIAL));
  CHECK(body(again) == body(round0));
  // Its arrival at round 1 (late too) proves it holds round 0: the others' round 2 opens.
  CHECK_EQ(int(j.send(3, 1, 100, 7 + 2 * kDeadlineNs, version_of(1)).reason), int(DropReason::kLate));
  for (uint16_t r = 0; r < 3; ++r)
    CHECK_EQ(int(j.send(r, 2, 1000, 8 + 2 * kDeadlineNs, GS_FLAG_RETX).kind), int(IngestResult::kAbsorbed));
  // A stale resend of round 0 proves nothing, and round 1's version stays pinned for rank 3 until it
  // reaches round 2: the others' round 3 waits.
  CHECK_EQ(int(j.send(3, 0, 10, 9 + 2 * kDeadlineNs, GS_FLAG_RETX).reason), int(DropReason::kStaleRound));
  const IngestResult round2 = j.close(2, 8 + 3 * kDeadlineNs);
  CHECK_EQ(int(round2.kind), int(IngestResult::kSend));
  CHECK_EQ(int(j.send(0, 3, 1, 9 + 3 * kDeadlineNs, version_of(3)).reason), int(DropReason::kPinned));
}

TEST(below_the_quorum_the_deadline_waits_for_the_quorum) {
  Job4 j(true, 3);
  j.send(0, 0, 10, 1);
  j.send(1, 0, 10, 2);
  CHECK_EQ(int(j.close(0, 1 + kDeadlineNs).kind), int(IngestResult::kAbsorbed));  // two of three
  const IngestResult r = j.send(2, 0, 10, 3 + kDeadlineNs);  // the quorum's contribution closes it
  CHECK_EQ(int(r.kind), int(IngestResult::kSend));
  CHECK_EQ(int(header_of(r).flags), int(GS_FLAG_PARTIAL));
  CHECK_EQ(gs_held_contributors(r.data + kTrailerAt), uint64_t{0x7});
  CHECK_EQ(j.element(r, 1), 3 * 11 + 0 + 1 + 2);
}

TEST(a_round_complete_before_its_deadline_is_a_plain_result) {
  Job4 j(true);
  for (uint16_t r = 0; r < 3; ++r) j.send(r, 0, 10, 1);
  const IngestResult r = j.send(3, 0, 10, 2);
  CHECK_EQ(int(r.kind), int(IngestResult::kSend));
  CHECK_EQ(r.len, uint32_t{GS_HEADER_BYTES + 16});
  CHECK_EQ(int(header_of(r).flags), 0);
  CHECK_EQ(header_of(r).rank, uint16_t{3});
  CHECK_EQ(int(j.close(0, 1 + kDeadlineNs).kind), int(IngestResult::kAbsorbed));
  CHECK_EQ(j.counters().partial, uint64_t{0});
}

// mx8's payload is its elements and one scale byte per block (§2.2): the trailer follows both, at
// the end of the 33 + 2 bytes of a 34-element round, where a PARTIAL RESULT's reader looks for it.
TEST(a_partial_mx8_result_carries_its_trailer_after_the_scale_bytes) {
  Engine engine{EngineConfig{1, 4}};
  JobSpec spec;
  spec.name = "m";
  spec.world = 3;
  spec.slots = 2;
  spec.payload_bytes = 68;
  spec.key = 0xC0FFEEu;
  spec.endpoints.resize(3);
  spec.wire = GS_ELEM_MX8;
  spec.deadline_ns = kDeadlineNs;
  spec.quorum = 2;
  std::string err;
  const uint32_t id = engine.create_job(spec, &err);
  CHECK(id != 0);
  const size_t payload = gs_payload_bytes(GS_ELEM_MX8, 34);
  CHECK_EQ(payload, size_t{36});
  for (uint16_t rank = 0; rank < 2; ++rank) {
    std::vector<uint8_t> p(GS_HEADER_BYTES + payload, 0);
    HeaderBuilder(GS_MSG_DATA, id, spec.key).rank(rank).elems(GS_ELEM_MX8, 34).round(0, 0).encode(p.data());
    p[GS_HEADER_BYTES] = 0x7F;       // block 0: scale 2^0, elements 0 but the first
    p[GS_HEADER_BYTES + 1] = 0x38;   // 1.0
    p[GS_HEADER_BYTES + 33] = 0x7F;  // block 1 (2 elements): scale 2^0, zeros
    CHECK_EQ(int(engine.ingest(0, p.data(), p.size(), 100, Endpoint{}).kind), int(IngestResult::kAbsorbed));
  }
  const IngestResult r = engine.close_overdue(0, id, 0, 0, 0, 0, 100 + kDeadlineNs);
  CHECK_EQ(int(r.kind), int(IngestResult::kSend));
  CHECK_EQ(r.len, uint32_t(GS_HEADER_BYTES + payload + GS_PARTIAL_TRAILER_BYTES));
  CHECK_EQ(gs_held_contributors(r.data + GS_HEADER_BYTES + payload), uint64_t{0x3});
  // 1.0 + 1.0 = 2.0, block 0's maximum: scale 2^-7 (0x78), 2.0 x 2^7 = 256, code 0x78 (as vector 6.9)
  CHECK_EQ(int(r.data[GS_HEADER_BYTES]), 0x78);
  CHECK_EQ(int(r.data[GS_HEADER_BYTES + 1]), 0x78);
}

TEST(a_deadline_needs_a_quorum_within_the_world) {
  Engine engine{EngineConfig{1, 4}};
  JobSpec spec;
  spec.world = 2;
  spec.endpoints.resize(2);
  spec.deadline_ns = kDeadlineNs;
  spec.quorum = 3;
  std::string err;
  CHECK_EQ(engine.create_job(spec, &err), 0u);
  CHECK(!err.empty());
}

GS_TEST_MAIN()
