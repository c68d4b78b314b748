// Concessions (docs/protocol.md §3.1, GS_FLAG_CONCEDE): in a job with a deadline, a header-only DATA by
// which a rank reaches a round without contributing. A round every member reached closes at once as a
// PARTIAL RESULT naming the contributors; the conceder is not missed, but it pins the round like a late
// rank until it arrives at the slot's next round, and its resend is answered like a late rank's; a job
// without a deadline, or a concession with a payload, drops it (bad_length).
#include <climits>
#include <cstddef>
#include <cstdint>
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

constexpr size_t kPartialLen = kTrailerAt + GS_PARTIAL_TRAILER_BYTES;

int kind(const IngestResult& r) {
  return static_cast<int>(r.kind);
}

// The contributor bitmap at byte `at` of what was sent (a PARTIAL RESULT's trailer, HELD's body); ~0
// when nothing that long was sent.
uint64_t trailer(const IngestResult& r, size_t at) {
  return r.data && r.len >= at + GS_PARTIAL_TRAILER_BYTES ? gs_held_contributors(r.data + at) : ~uint64_t{0};
}

}  // namespace

TEST(a_concession_closes_the_round_at_once_without_the_conceder) {
  Job4 j(true);
  CHECK(j.id != 0);
  for (uint16_t r = 0; r < 3; ++r) CHECK_EQ(kind(j.send(r, 0, 10, 1 + r)), int(IngestResult::kAbsorbed));
  const IngestResult r = j.concede(3, 0, 10);  // long before the deadline
  CHECK_EQ(kind(r), int(IngestResult::kSend));
  CHECK_EQ(r.dest_rank, uint16_t{GS_RANK_ALL});  // the conceder too
  const gs_header h = sent(r);
  CHECK_EQ(int(h.flags), int(GS_FLAG_PARTIAL));
  CHECK_EQ(h.rank, uint16_t{3});  // its completer: the concession closed it (a deadline names none)
  CHECK_EQ(r.len, uint32_t{kPartialLen});
  CHECK_EQ(trailer(r, kTrailerAt), uint64_t{0x7});  // the conceder is no contributor
  for (int i = 0; i < 4; ++i) CHECK_EQ(Job4::element(r, i), 3 * (10 + i) + 0 + 1 + 2);
  const CounterValues c = j.counters();
  CHECK_EQ(c.conceded, uint64_t{1});
  CHECK_EQ(c.partial, uint64_t{1});
  CHECK_EQ(c.missed, uint64_t{0});  // nobody was late
  CHECK_EQ(c.completed, uint64_t{1});
  CHECK_EQ(c.drops_total(), uint64_t{0});
  CHECK_EQ(j.engine.total_counters().conceded, uint64_t{1});
  CHECK_EQ(kind(j.close(0, 1 + kDeadlineNs)), int(IngestResult::kAbsorbed));  // its deadline: nothing more
}

TEST(concessions_close_a_round_below_its_quorum) {
  Job4 j(true, 3);
  const IngestResult opened = j.send(0, 0, 10, 1);
  CHECK_EQ(opened.deadline_ns, 1 + kDeadlineNs);
  CHECK_EQ(kind(j.concede(1, 0, 2)), int(IngestResult::kAbsorbed));
  CHECK_EQ(kind(j.concede(2, 0, 3)), int(IngestResult::kAbsorbed));
  const IngestResult r = j.concede(3, 0, 4);  // one contribution of the quorum's three: closes anyway
  CHECK_EQ(kind(r), int(IngestResult::kSend));
  CHECK_EQ(int(sent(r).flags), int(GS_FLAG_PARTIAL));
  CHECK_EQ(trailer(r, kTrailerAt), uint64_t{0x1});
  for (int i = 0; i < 4; ++i) CHECK_EQ(Job4::element(r, i), 10 + i);
  CHECK_EQ(j.counters().conceded, uint64_t{3});
}

TEST(a_round_every_member_conceded_is_a_sum_of_zeros) {
  Job4 j(true);
  // The slot version's previous round leaves its sum in the buffer the next round reuses.
  for (uint16_t r = 0; r < 4; ++r) j.send(r, 0, 1000, 1);
  const IngestResult first = j.concede(2, 1, 2);
  CHECK_EQ(kind(first), int(IngestResult::kAbsorbed));
  CHECK_EQ(first.deadline_ns, 2 + kDeadlineNs);  // a concession opens a round and starts its clock
  CHECK_EQ(kind(j.concede(0, 1, 3)), int(IngestResult::kAbsorbed));
  CHECK_EQ(kind(j.concede(1, 1, 4)), int(IngestResult::kAbsorbed));
  const IngestResult r = j.concede(3, 1, 5);
  CHECK_EQ(kind(r), int(IngestResult::kSend));
  CHECK_EQ(int(sent(r).flags), int(GS_FLAG_PARTIAL));
  CHECK_EQ(sent(r).count, uint16_t{4});
  CHECK_EQ(r.len, uint32_t{kPartialLen});
  CHECK_EQ(trailer(r, kTrailerAt), uint64_t{0});
  for (int i = 0; i < 4; ++i) CHECK_EQ(Job4::element(r, i), 0);
}

// float16 sums in the fp32 accumulator (§2): a round a concession opens starts it at zero too.
TEST(a_concession_opens_an_fp32_accumulated_round_at_zero) {
  Job4 j(true, 1, GS_ELEM_FLOAT16);
  CHECK(j.id != 0);
  auto data = [&](uint16_t rank, uint32_t seq, uint16_t half) {
    std::vector<uint8_t> p(GS_HEADER_BYTES + 8);
    HeaderBuilder(GS_MSG_DATA, j.id, j.key)
        .rank(rank)
        .elems(GS_ELEM_FLOAT16, 4)
        .round(seq, 0)
        .encode(p.data());
    for (int i = 0; i < 4; ++i) std::memcpy(p.data() + GS_HEADER_BYTES + 2 * i, &half, 2);
    return j.engine.ingest(0, p.data(), p.size(), 1, Endpoint{});
  };
  for (uint16_t r = 0; r < 4; ++r) data(r, 0, 0x4400);  // 4.0 each: the accumulator holds 16.0
  for (uint16_t r = 0; r < 3; ++r)
    CHECK_EQ(kind(j.concede(r, 1, 2, 0, 4, 0, GS_ELEM_FLOAT16)), int(IngestResult::kAbsorbed));
  const IngestResult r = data(3, 1, 0x3C00);  // 1.0, the only contribution
  CHECK_EQ(kind(r), int(IngestResult::kSend));
  CHECK_EQ(r.len, uint32_t{GS_HEADER_BYTES + 8 + GS_PARTIAL_TRAILER_BYTES});
  CHECK_EQ(trailer(r, GS_HEADER_BYTES + 8), uint64_t{0x8});
  for (int i = 0; r.data && i < 4; ++i) {
    uint16_t v;
    std::memcpy(&v, r.data + GS_HEADER_BYTES + 2 * i, 2);
    CHECK_EQ(int(v), 0x3C00);
  }
}

TEST(a_concession_to_a_round_its_deadline_closed_is_late_and_answered_but_keeps_the_pin) {
  Job4 j(true);
  for (uint16_t r = 0; r < 3; ++r) j.send(r, 0, 10, 1);
  const IngestResult closed = j.close(0, 1 + kDeadlineNs);
  CHECK_EQ(kind(closed), int(IngestResult::kSend));
  const std::vector<uint8_t> multicast = body(closed);
  CHECK_EQ(int(j.send(0, 1, 1000, 2 + kDeadlineNs).reason), int(DropReason::kPinned));  // rank 3 is owed
  const IngestResult late = j.concede(3, 0, 3 + kDeadlineNs);
  CHECK_EQ(kind(late), int(IngestResult::kSend));
  CHECK_EQ(int(late.reason), int(DropReason::kLate));
  CHECK_EQ(late.dest_rank, uint16_t{3});
  CHECK_EQ(int(sent(late).flags), int(GS_FLAG_UNICAST | GS_FLAG_PARTIAL));
  CHECK(body(late) == multicast);
  CHECK_EQ(j.counters().conceded, uint64_t{0});  // too late to concede: counted late, not conceded
  CHECK_EQ(j.counters().drops[size_t(DropReason::kLate)], uint64_t{1});
  CHECK_EQ(kind(j.concede(3, 0, 4 + kDeadlineNs)),
           int(IngestResult::kDropped));  // a copy: not answered again
  // The answer may have been lost: still pinned, until rank 3 arrives at a newer round (which it
  // starts only with this round's result).
  CHECK_EQ(int(j.send(0, 1, 1000, 5 + kDeadlineNs, GS_FLAG_RETX).reason), int(DropReason::kPinned));
  CHECK_EQ(kind(j.concede(3, 1, 6 + kDeadlineNs)), int(IngestResult::kAbsorbed));  // opens round 1
  CHECK_EQ(kind(j.send(0, 1, 1000, 7 + kDeadlineNs, GS_FLAG_RETX)), int(IngestResult::kAbsorbed));
}

TEST(a_conceder_is_not_missed_and_its_resends_get_the_same_bytes) {
  Job4 j(true, 2);
  j.send(0, 0, 10, 1);
  j.send(1, 0, 10, 2);
  CHECK_EQ(kind(j.concede(2, 0, 3)), int(IngestResult::kAbsorbed));  // rank 3 has not arrived
  const IngestResult closed = j.close(0, 1 + kDeadlineNs);
  CHECK_EQ(kind(closed), int(IngestResult::kSend));
  CHECK_EQ(closed.dest_rank, uint16_t{GS_RANK_ALL});
  CHECK_EQ(trailer(closed, kTrailerAt), uint64_t{0x3});
  const std::vector<uint8_t> multicast = body(closed);
  CHECK_EQ(j.counters().missed, uint64_t{1});  // rank 3; the conceder is not missed
  // The conceder lost the multicast: its concession again, without RETX, is a duplicate...
  CHECK_EQ(kind(j.concede(2, 0, 2 + kDeadlineNs)), int(IngestResult::kAbsorbed));
  CHECK_EQ(j.counters().duplicates, uint64_t{1});
  // ...and with RETX it is answered from the shadow copy, to it alone, without DSACK.
  const IngestResult again = j.concede(2, 0, 3 + kDeadlineNs, GS_FLAG_RETX);
  CHECK_EQ(kind(again), int(IngestResult::kSend));
  CHECK_EQ(again.dest_rank, uint16_t{2});
  CHECK_EQ(int(sent(again).flags), int(GS_FLAG_UNICAST | GS_FLAG_PARTIAL));
  CHECK_EQ(sent(again).rank, uint16_t{GS_RANK_ALL});
  CHECK(body(again) == multicast);
  CHECK_EQ(j.counters().retx_answered, uint64_t{1});
  // The late rank's DATA is answered with the same bytes; a contributor's resend too (with DSACK).
  const IngestResult late = j.send(3, 0, 10, 4 + kDeadlineNs);
  CHECK_EQ(int(late.reason), int(DropReason::kLate));
  CHECK(body(late) == multicast);
  const IngestResult dup = j.send(0, 0, 10, 5 + kDeadlineNs, GS_FLAG_RETX);
  CHECK_EQ(int(sent(dup).flags), int(GS_FLAG_UNICAST | GS_FLAG_DSACK | GS_FLAG_PARTIAL));
  CHECK(body(dup) == multicast);
}

// A conceder needs the round's result like a late rank: its concession only says that it reached the
// round. The version is pinned for it until it arrives at a newer round.
TEST(a_conceder_pins_the_slot_version_until_it_arrives_at_a_newer_round) {
  Job4 j(true, 2);
  j.send(0, 0, 10, 1);
  j.send(1, 0, 10, 2);
  j.concede(2, 0, 3);
  j.close(0, 1 + kDeadlineNs);  // owed: ranks 2 and 3
  CHECK_EQ(int(j.send(0, 1, 1000, 2 + kDeadlineNs).reason), int(DropReason::kPinned));
  j.send(3, 0, 10, 3 + kDeadlineNs);                                                    // rank 3 fetches it
  CHECK_EQ(int(j.send(3, 1, 1000, 4 + kDeadlineNs).reason), int(DropReason::kPinned));  // rank 2 is owed
  CHECK_EQ(kind(j.concede(2, 0, 5 + kDeadlineNs, GS_FLAG_RETX)), int(IngestResult::kSend));
  CHECK_EQ(int(j.send(0, 1, 1000, 6 + kDeadlineNs, GS_FLAG_RETX).reason), int(DropReason::kPinned));
  CHECK_EQ(kind(j.send(2, 1, 1000, 7 + kDeadlineNs)), int(IngestResult::kAbsorbed));  // opens it
  CHECK_EQ(kind(j.send(0, 1, 1000, 8 + kDeadlineNs, GS_FLAG_RETX)), int(IngestResult::kAbsorbed));
  CHECK_EQ(j.counters().drops[size_t(DropReason::kPinned)], uint64_t{3});
}

TEST(a_conceded_round_never_leaks_a_late_contribution_into_the_next_round) {
  Job4 j(true);
  for (uint16_t r = 0; r < 3; ++r) j.send(r, 0, 10, 1);
  CHECK_EQ(kind(j.concede(3, 0, 2)), int(IngestResult::kSend));
  // The conceder's real DATA for the round it conceded comes anyway: never summed, anywhere.
  CHECK_EQ(kind(j.send(3, 0, 500000, 3)), int(IngestResult::kAbsorbed));
  const IngestResult retx = j.send(3, 0, 500000, 4, GS_FLAG_RETX);
  CHECK_EQ(int(sent(retx).flags), int(GS_FLAG_UNICAST | GS_FLAG_PARTIAL));
  for (int i = 0; i < 4; ++i) CHECK_EQ(Job4::element(retx, i), 3 * (10 + i) + 0 + 1 + 2);
  // The next round of the slot version, every rank contributing, holds none of it either (rank 3
  // opens it: the version waits for it, the conceder, to arrive at a newer round).
  CHECK_EQ(kind(j.send(3, 1, 1000, 5)), int(IngestResult::kAbsorbed));
  for (uint16_t r = 0; r < 2; ++r) CHECK_EQ(kind(j.send(r, 1, 1000, 5)), int(IngestResult::kAbsorbed));
  const IngestResult next = j.send(2, 1, 1000, 6);
  CHECK_EQ(kind(next), int(IngestResult::kSend));
  CHECK_EQ(int(sent(next).flags), 0);  // every member contributed: a default RESULT
  CHECK_EQ(next.len, uint32_t{GS_HEADER_BYTES + 16});
  for (int i = 0; i < 4; ++i) CHECK_EQ(Job4::element(next, i), 4 * (1000 + i) + 0 + 1 + 2 + 3);
}

TEST(a_conceders_resend_to_an_open_round_is_held_and_its_bit_is_set) {
  Job4 j(true);
  j.send(0, 0, 10, 1);
  j.concede(1, 0, 2);
  CHECK_EQ(kind(j.concede(1, 0, 3)), int(IngestResult::kAbsorbed));  // a network copy
  const IngestResult held = j.concede(1, 0, 4, GS_FLAG_RETX);
  CHECK_EQ(kind(held), int(IngestResult::kSend));
  CHECK_EQ(int(held.type), int(GS_MSG_HELD));
  CHECK_EQ(held.dest_mask, uint64_t{1} << 1);  // open for less than 20 ms: the sender alone
  CHECK_EQ(int(sent(held).flags), int(GS_FLAG_DSACK));
  CHECK_EQ(trailer(held, GS_HEADER_BYTES), uint64_t{0x3});  // the round holds rank 1
  // Past 20 ms, another resend asks the ranks the round lacks, not the conceder.
  const IngestResult asked = j.send(0, 0, 10, 30'000'000, GS_FLAG_RETX);
  CHECK_EQ(asked.dest_mask, uint64_t{0x1 | 0x4 | 0x8});
  CHECK_EQ(j.counters().conceded, uint64_t{1});
  CHECK_EQ(j.counters().duplicates, uint64_t{3});
}

TEST(a_concession_that_disagrees_with_the_round_aborts_the_job_as_data_does) {
  Job4 j(true);
  j.concede(2, 0, 1);  // opens the round: 4 elements, not the last chunk
  const IngestResult r = j.send(0, 0, 10, 2, GS_FLAG_LAST);
  CHECK_EQ(int(r.reason), int(DropReason::kInconsistent));
  CHECK_EQ(int(r.type), int(GS_MSG_ABORT));
  JobStatus s;
  j.engine.job_status(j.id, &s);
  CHECK(s.aborted);
  CHECK_EQ(s.mismatch.held.rank, uint16_t{2});  // the conceder opened it
  CHECK_EQ(s.mismatch.arriving.rank, uint16_t{0});
  Job4 k(true);
  k.send(0, 0, 10, 1);
  CHECK_EQ(int(k.concede(1, 0, 2, 0, 3).reason), int(DropReason::kInconsistent));  // count 3, not 4
}

// A round that a rank which then leaves (LEAVE) conceded does not need it: it still closes.
TEST(a_conceder_that_leaves_does_not_abort_the_round_it_conceded) {
  Job4 j(true);
  j.concede(3, 0, 1);
  j.send(0, 0, 10, 2);
  CHECK(!j.engine.rank_left(j.id, 3));  // the open round has rank 3's arrival
  CHECK_EQ(kind(j.send(1, 0, 10, 3)), int(IngestResult::kAbsorbed));
  const IngestResult r = j.send(2, 0, 10, 4);
  CHECK_EQ(kind(r), int(IngestResult::kSend));
  CHECK_EQ(int(sent(r).type), int(GS_MSG_RESULT));
  CHECK_EQ(trailer(r, kTrailerAt), uint64_t{0x7});
  JobStatus s;
  j.engine.job_status(j.id, &s);
  CHECK(!s.aborted);
}

TEST(a_concession_without_a_deadline_or_with_a_payload_is_bad_length) {
  Job4 plain(false);
  CHECK_EQ(int(plain.concede(0, 0, 1).reason), int(DropReason::kBadLength));
  CHECK_EQ(int(plain.concede(0, 0, 1, 0, 0).reason), int(DropReason::kBadLength));  // count 0 too
  CHECK_EQ(int(plain.concede(0, 0, 1, 0, 4, 16).reason), int(DropReason::kBadLength));
  // The job is untouched: its round completes with every rank's DATA.
  for (uint16_t r = 0; r < 3; ++r) CHECK_EQ(kind(plain.send(r, 0, 10, 2)), int(IngestResult::kAbsorbed));
  const IngestResult done = plain.send(3, 0, 10, 3);
  CHECK_EQ(kind(done), int(IngestResult::kSend));
  CHECK_EQ(Job4::element(done, 0), 4 * 10 + 0 + 1 + 2 + 3);
  CHECK_EQ(plain.counters().conceded, uint64_t{0});
  Job4 timed(true);
  CHECK_EQ(int(timed.concede(0, 0, 1, 0, 4, 16).reason), int(DropReason::kBadLength));  // a payload
  CHECK_EQ(int(timed.concede(0, 0, 1, 0, 4, 4).reason), int(DropReason::kBadLength));
  CHECK_EQ(int(timed.concede(0, 0, 1, 0, 17).reason), int(DropReason::kBadLength));  // beyond a chunk
  CHECK_EQ(timed.counters().drops[size_t(DropReason::kBadLength)], uint64_t{3});
  SlotStatus st;
  CHECK(timed.engine.slot_status(timed.id, 0, 0, &st));
  CHECK(!st.open);  // nothing opened a round
}

// §3.1's pins, with rounds as a worker sends them: slot 0's rounds seq 0, 1, 2, ... in versions 0, 1,
// 0, ... (it flips the version at each use of the slot), so a version's previous round is in the other.
namespace {
uint8_t version_of(uint32_t seq) {
  return static_cast<uint8_t>(seq & 1);
}
}  // namespace

// The testbed's hole: rank 3 concedes round 1, which closes at once; its copy of the multicast is
// lost, so it cannot start round 2, which closes at its deadline without it. The others' round 3 would
// reuse round 1's version: it waits (pinned) until rank 3 shows it holds round 1, by arriving at round 2.
TEST(a_conceder_that_lost_the_result_keeps_its_round_until_it_reaches_the_next) {
  Job4 j(true);
  for (uint16_t r = 0; r < 4; ++r) j.send(r, 0, 1, 1);  // round 0, complete
  for (uint16_t r = 0; r < 3; ++r) j.send(r, 1, 10, 2, version_of(1));
  const IngestResult round1 = j.concede(3, 1, 3, version_of(1));
  CHECK_EQ(kind(round1), int(IngestResult::kSend));
  CHECK_EQ(int(sent(round1).flags), int(GS_FLAG_PARTIAL | version_of(1)));
  const std::vector<uint8_t> lost = body(round1);  // rank 3's copy
  for (uint16_t r = 0; r < 3; ++r) CHECK_EQ(kind(j.send(r, 2, 100, 4)), int(IngestResult::kAbsorbed));
  const IngestResult round2 = j.close(2, 4 + kDeadlineNs);
  CHECK_EQ(kind(round2), int(IngestResult::kSend));
  CHECK_EQ(trailer(round2, kTrailerAt), uint64_t{0x7});
  for (uint16_t r = 0; r < 3; ++r)
    CHECK_EQ(int(j.send(r, 3, 1000, 5 + kDeadlineNs, version_of(3)).reason), int(DropReason::kPinned));
  // Rank 3's resend of its concession is answered from round 1's shadow copy: the multicast's bytes.
  const IngestResult again = j.concede(3, 1, 6 + kDeadlineNs, GS_FLAG_RETX | version_of(1));
  CHECK_EQ(kind(again), int(IngestResult::kSend));
  CHECK_EQ(again.dest_rank, uint16_t{3});
  CHECK_EQ(int(sent(again).flags), int(GS_FLAG_UNICAST | GS_FLAG_PARTIAL | version_of(1)));
  CHECK(body(again) == lost);
  CHECK_EQ(int(j.send(0, 3, 1000, 7 + kDeadlineNs, GS_FLAG_RETX | version_of(3)).reason),
           int(DropReason::kPinned));  // answering it proved nothing
  // With round 1's result it reaches round 2, late: answered, and round 1's version is free.
  const IngestResult late = j.send(3, 2, 100, 8 + kDeadlineNs);
  CHECK_EQ(int(late.reason), int(DropReason::kLate));
  CHECK(body(late) == body(round2));
  for (uint16_t r = 0; r < 3; ++r)
    CHECK_EQ(kind(j.send(r, 3, 1000, 9 + kDeadlineNs, GS_FLAG_RETX | version_of(3))),
             int(IngestResult::kAbsorbed));
  const IngestResult round3 = j.send(3, 3, 1000, 10 + kDeadlineNs, version_of(3));
  CHECK_EQ(kind(round3), int(IngestResult::kSend));
  CHECK_EQ(int(sent(round3).flags), int(version_of(3)));  // every rank contributed: a default RESULT
  CHECK_EQ(Job4::element(round3, 0), 4 * 1000 + 0 + 1 + 2 + 3);
  CHECK_EQ(j.counters().drops[size_t(DropReason::kPinned)], uint64_t{4});
}

// A conceder that keeps up never holds the others: its arrival at a slot's next round comes before any
// rank can start the round after (that needs the next round's result, which needs the arrival), and it
// releases its pin on the round it conceded. Both slots, every order of arrival, concessions and DATA.
TEST(a_conceder_that_keeps_up_never_pins_a_round) {
  Job4 j(true);
  uint64_t now = 1;
  uint32_t conceded = 0, partial = 0;
  for (uint32_t g = 0; g < 96; ++g) {  // chunk g of a stream: slot g % 2, its (g / 2)-th use
    const uint16_t slot = static_cast<uint16_t>(g % 2);
    const uint8_t version = static_cast<uint8_t>((g / 2) & 1);
    const bool concedes = g % 5 != 0;
    IngestResult last;
    for (uint16_t i = 0; i < 4; ++i) {
      const auto rank = static_cast<uint16_t>((i + g) % 4);  // rank 3 opens, joins and closes rounds
      std::vector<uint8_t> p(GS_HEADER_BYTES + (rank == 3 && concedes ? 0 : 16), 0);
      HeaderBuilder(GS_MSG_DATA, j.id, j.key)
          .rank(rank)
          .slot(slot)
          .flags(static_cast<uint8_t>(version | (rank == 3 && concedes ? GS_FLAG_CONCEDE : 0)))
          .elems(GS_ELEM_INT32, 4)
          .round(g / 2, 0)
          .encode(p.data());
      if (p.size() > GS_HEADER_BYTES) std::memcpy(p.data() + GS_HEADER_BYTES, &g, 4);
      last = j.engine.ingest(0, p.data(), p.size(), now++, Endpoint{});
      CHECK_EQ(kind(last), i < 3 ? int(IngestResult::kAbsorbed) : int(IngestResult::kSend));
    }
    CHECK_EQ(int(sent(last).flags), int(version | (concedes ? GS_FLAG_PARTIAL : 0)));
    CHECK_EQ(Job4::element(last, 0), int32_t(g) * (concedes ? 3 : 4));
    conceded += concedes;
    partial += concedes;
  }
  const CounterValues c = j.counters();
  CHECK_EQ(c.drops_total(), uint64_t{0});
  CHECK_EQ(c.conceded, uint64_t{conceded});
  CHECK_EQ(c.partial, uint64_t{partial});
  CHECK_EQ(c.completed, uint64_t{96});
}

// fixed32 (§5): a slot's bootstrap round (count 0) and the data round after it, in the other version,
// share (seq, offset). A conceder's arrival at the data round still shows that it holds the bootstrap
// round's result, so the slot's next chunk, in the bootstrap round's version, is not held for it.
TEST(a_conceded_fixed32_bootstrap_round_is_released_by_the_data_round_after_it) {
  Job4 j(true, 3, GS_ELEM_FIXED32);
  CHECK(j.id != 0);
  auto data = [&](uint16_t rank, uint32_t offset, uint16_t count, uint8_t version, bool concede) {
    const bool body = count > 0 && !concede;
    std::vector<uint8_t> p(GS_HEADER_BYTES + (body ? 4 * count : 0), 0);
    HeaderBuilder(GS_MSG_DATA, j.id, j.key)
        .rank(rank)
        .flags(static_cast<uint8_t>(version | (concede ? GS_FLAG_CONCEDE : 0)))
        .elems(GS_ELEM_FIXED32, count)
        .round(0, offset)
        .exps(3, count ? 20 : GS_EXP_NONE)
        .encode(p.data());
    return j.engine.ingest(0, p.data(), p.size(), 1, Endpoint{});
  };
  for (uint16_t r = 0; r < 3; ++r) data(r, 0, 0, 0, false);          // the bootstrap round, version 0
  CHECK_EQ(kind(data(3, 0, 0, 0, true)), int(IngestResult::kSend));  // conceded by rank 3: closed
  for (uint16_t r = 0; r < 3; ++r) data(r, 0, 4, 1, false);          // its data round, version 1
  CHECK_EQ(kind(data(3, 0, 4, 1, true)), int(IngestResult::kSend));
  // The slot's next chunk (offset 8, two slots of 4 elements on) reuses version 0.
  for (uint16_t r = 0; r < 3; ++r) CHECK_EQ(kind(data(r, 8, 4, 0, false)), int(IngestResult::kAbsorbed));
  CHECK_EQ(kind(data(3, 8, 4, 0, false)), int(IngestResult::kSend));
  CHECK_EQ(j.counters().drops_total(), uint64_t{0});
}

GS_TEST_MAIN()
