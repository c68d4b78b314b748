// ResultBatch (src/switch/io/udp/result_batch.h): a burst's datagrams grouped by destination, each
// destination's in the order added, and the sendmmsg messages built from them (GSO trains or one
// datagram per message), without sockets; and ResultHold (result_hold.h), whether they wait.
#include <arpa/inet.h>

#include <string>
#include <vector>

#include "gradswitch/wire.h"
#include "harness.h"
#include "switch/io/udp/result_batch.h"
#include "switch/io/udp/result_hold.h"

using gradswitch::Endpoint;
using gradswitch::IngestResult;
using gradswitch::ResultBatch;

namespace {

constexpr uint16_t kWorld = 4;

struct Job {
  Endpoint eps[kWorld];
  Job() {
    for (uint16_t r = 0; r < kWorld; ++r)
      eps[r] = Endpoint{htonl(0x7f000001), htons(static_cast<uint16_t>(9000 + r))};
  }
};

// A datagram of `len` bytes whose first byte tags it, to `dest` (an endpoint index or GS_RANK_ALL).
struct Datagram {
  std::vector<uint8_t> bytes;
  IngestResult r;
  Datagram(const Job& job, uint8_t tag, uint32_t len, uint16_t dest, uint8_t type = GS_MSG_RESULT)
      : bytes(len, tag) {
    r.kind = IngestResult::kSend;
    r.job_id = 7;
    r.dest_rank = dest;
    r.data = bytes.data();
    r.len = len;
    r.endpoints = job.eps;
    r.world = kWorld;
    r.type = type;
  }
};

// What one message carries: its port, its datagrams' tags in order, and its GSO segment size.
struct Msg {
  uint16_t port;
  std::string tags;
  uint16_t segment;
};

std::vector<Msg> write_all(ResultBatch& b, bool gso, std::vector<size_t>* calls = nullptr) {
  std::vector<Msg> out;
  b.write(gso, [&](mmsghdr* msgs, size_t n) {
    if (calls) calls->push_back(n);
    for (size_t i = 0; i < n; ++i) {
      const msghdr& h = msgs[i].msg_hdr;
      Msg m{ntohs(static_cast<const sockaddr_in*>(h.msg_name)->sin_port), "", b.segment(i)};
      uint64_t bytes = 0;
      for (size_t k = 0; k < h.msg_iovlen; ++k) {
        m.tags += static_cast<char>(static_cast<const uint8_t*>(h.msg_iov[k].iov_base)[0]);
        bytes += h.msg_iov[k].iov_len;
      }
      b.sent(i, h.msg_iovlen, bytes);
      out.push_back(m);
    }
  });
  return out;
}

}  // namespace

TEST(interleaved_destinations_become_one_write_each) {
  Job job;
  // Under loss: multicast RESULTs alternate with HELD answers and unicast RESULTs.
  Datagram d[] = {{job, 'a', 100, GS_RANK_ALL}, {job, 'h', 32, 1, GS_MSG_HELD},
                  {job, 'b', 100, GS_RANK_ALL}, {job, 'u', 100, 2},
                  {job, 'c', 100, GS_RANK_ALL}, {job, 'i', 32, 1, GS_MSG_HELD}};
  ResultBatch b;
  for (auto& x : d) CHECK(b.add(x.r, /*gso=*/true));
  std::vector<Msg> m = write_all(b, true);
  CHECK_EQ(m.size(), size_t{6});  // the multicast to 4 ranks, the HELDs to rank 1, the unicast
  for (uint16_t r = 0; r < kWorld; ++r) {
    CHECK_EQ(m[r].port, 9000 + r);
    CHECK(m[r].tags == "abc");
    CHECK_EQ(m[r].segment, 100);
  }
  CHECK_EQ(m[4].port, 9001);
  CHECK(m[4].tags == "hi");
  CHECK_EQ(m[4].segment, 32);
  CHECK_EQ(m[5].port, 9002);
  CHECK(m[5].tags == "u");
  CHECK_EQ(m[5].segment, 0);  // one datagram: no GSO
  uint64_t pkts = 0, bytes = 0;
  b.for_each_sent([&](uint32_t job_id, uint64_t p, uint64_t by) {
    CHECK_EQ(job_id, 7u);
    pkts += p;
    bytes += by;
  });
  CHECK_EQ(pkts, uint64_t{3 * 4 + 2 + 1});
  CHECK_EQ(bytes, uint64_t{300 * 4 + 64 + 100});
}

TEST(a_shorter_datagram_ends_its_write_and_the_order_holds) {
  Job job;
  // Only a GSO write's last datagram may be shorter; what follows goes to a new write after it,
  // never back into an older one of the same destination.
  Datagram d[] = {{job, 'a', 100, 0}, {job, 'b', 100, 0}, {job, 's', 60, 0},
                  {job, 'c', 100, 0}, {job, 'x', 100, 1}, {job, 'd', 100, 0}};
  ResultBatch b;
  for (auto& x : d) CHECK(b.add(x.r, true));
  std::vector<Msg> m = write_all(b, true);
  CHECK_EQ(m.size(), size_t{3});
  CHECK(m[0].tags == "abs");
  CHECK(m[1].tags == "cd");
  CHECK(m[2].tags == "x");
  // A longer datagram does not join a write of shorter segments either.
  ResultBatch b2;
  Datagram e[] = {
      {job, 'h', 32, 0, GS_MSG_HELD}, {job, 'r', 100, 0, GS_MSG_HELD}, {job, 'k', 32, 0, GS_MSG_HELD}};
  for (auto& x : e) CHECK(b2.add(x.r, true));
  m = write_all(b2, true);
  CHECK_EQ(m.size(), size_t{2});
  CHECK(m[0].tags == "h");
  CHECK(m[1].tags == "rk");
}

TEST(types_and_jobs_never_share_a_write) {
  Job job;
  Datagram a{job, 'a', 100, 0, GS_MSG_RESULT}, b{job, 'b', 100, 0, GS_MSG_ABORT}, c{job, 'c', 100, 0};
  c.r.job_id = 8;
  ResultBatch batch;
  for (auto* x : {&a, &b, &c}) CHECK(batch.add(x->r, true));
  CHECK_EQ(write_all(batch, true).size(), size_t{3});
}

TEST(without_gso_every_datagram_is_a_message_in_the_order_added) {
  Job job;
  Datagram d[] = {{job, 'a', 100, GS_RANK_ALL}, {job, 'h', 32, 1, GS_MSG_HELD}, {job, 'b', 100, GS_RANK_ALL}};
  ResultBatch b;
  for (auto& x : d) CHECK(b.add(x.r, /*gso=*/false));
  std::vector<Msg> m = write_all(b, false);
  CHECK_EQ(m.size(), size_t{9});
  std::string order;
  for (auto& x : m) {
    order += x.tags;
    CHECK_EQ(x.segment, 0);
  }
  CHECK(order == "aaaahbbbb");
}

TEST(writes_hold_at_most_64_segments_and_60000_bytes) {
  Job job;
  std::vector<Datagram> d;
  for (int i = 0; i < 70; ++i) d.emplace_back(job, static_cast<uint8_t>('0' + i % 10), 100, 0);
  for (int i = 0; i < 45; ++i) d.emplace_back(job, 'L', 1472, 1);
  ResultBatch b;
  for (auto& x : d) CHECK(b.add(x.r, true));
  std::vector<Msg> m = write_all(b, true);
  CHECK_EQ(m.size(), size_t{4});
  CHECK_EQ(m[0].tags.size(), size_t{64});
  CHECK_EQ(m[1].tags.size(), size_t{6});
  CHECK_EQ(m[2].tags.size(), size_t{40});  // 40 x 1472 B <= 60000 < 41 x 1472
  CHECK_EQ(m[3].tags.size(), size_t{5});
}

TEST(messages_go_out_in_sendmmsg_sized_rounds) {
  Job job;
  std::vector<Datagram> d;
  for (int i = 0; i < 300; ++i) d.emplace_back(job, 'm', 100, GS_RANK_ALL);
  ResultBatch b;
  for (auto& x : d) CHECK(b.add(x.r, false));
  std::vector<size_t> calls;
  CHECK_EQ(write_all(b, false, &calls).size(), size_t{1200});
  CHECK_EQ(calls.size(), size_t{2});
  CHECK_EQ(calls[0], ResultBatch::kMaxMsgs);
  CHECK_EQ(calls[0] + calls[1], size_t{1200});
}

TEST(a_full_batch_refuses_and_takes_again_after_clear) {
  Job job;
  Datagram big{job, 'B', 9000, 0};
  ResultBatch b;
  size_t added = 0;
  while (b.add(big.r, true)) ++added;
  CHECK_EQ(added, size_t{256 * 1024 / 9000});
  CHECK(!b.empty());
  b.clear();
  CHECK(b.empty());
  CHECK(b.add(big.r, true));
}

// ResultHold (src/switch/io/udp/result_hold.h): whether a burst's results wait for the next burst's.
namespace {

using gradswitch::ResultHold;

IngestResult answer(IngestResult::Kind kind, uint16_t slot, uint32_t job = 7) {
  IngestResult r;
  r.kind = kind;
  r.job_id = job;
  r.slot = slot;
  return r;
}

// One burst: the engine's answers `rs`, then the decision at `now` with `datagrams` queued.
bool burst(ResultHold& h, std::initializer_list<IngestResult> rs, uint64_t now, size_t datagrams) {
  for (const IngestResult& r : rs) h.saw(r);
  return h.wait(now, datagrams);
}

constexpr auto kAbsorbed = IngestResult::kAbsorbed;
constexpr auto kSend = IngestResult::kSend;
constexpr auto kDropped = IngestResult::kDropped;

}  // namespace

TEST(results_wait_while_the_burst_leaves_a_round_open) {
  ResultHold h(100'000);
  // Slot 1 completes, slot 2 takes a contribution and stays open: more DATA is on its way.
  CHECK(burst(h, {answer(kSend, 1), answer(kAbsorbed, 2)}, 1'000'000, 1));
  CHECK(h.waiting());
  CHECK_EQ(h.deadline(), uint64_t{1'100'000});
  // The next burst within the hold leaves a round open too: they still wait, from the first burst on.
  CHECK(burst(h, {answer(kSend, 2), answer(kAbsorbed, 3)}, 1'050'000, 2));
  CHECK_EQ(h.deadline(), uint64_t{1'100'000});
  // Past the hold they go, however open.
  CHECK(!burst(h, {answer(kSend, 3), answer(kAbsorbed, 4)}, 1'100'000, 3));
  h.sent();
  CHECK(!h.waiting());
}

TEST(results_go_at_once_when_nothing_is_left_open) {
  ResultHold h(1'000'000'000);
  // The burst's latest contribution completed its round later in the burst (a small allreduce).
  CHECK(!burst(h, {answer(kAbsorbed, 5), answer(kSend, 5)}, 10, 1));
  h.sent();
  // Results and nothing absorbed (answers to resends, a round completed by its last rank).
  CHECK(!burst(h, {answer(kSend, 6), answer(kSend, 7)}, 20, 2));
  h.sent();
  // Open in another job's slot of the same number: still open.
  CHECK(burst(h, {answer(kAbsorbed, 8, 7), answer(kSend, 8, 9)}, 30, 1));
  // Then a burst that leaves nothing open sends what waited too.
  CHECK(!burst(h, {answer(kDropped, 8), answer(kSend, 8, 7)}, 40, 2));
}

TEST(results_go_at_once_when_enough_wait_or_without_a_hold) {
  ResultHold h(1'000'000'000);
  CHECK(!burst(h, {answer(kAbsorbed, 1)}, 10, ResultHold::kEnough));
  CHECK(!burst(h, {answer(kAbsorbed, 1)}, 20, 0));  // nothing to wait with
  ResultHold off(0);
  CHECK(!burst(off, {answer(kAbsorbed, 1)}, 10, 1));
  CHECK(!off.waiting());
}

GS_TEST_MAIN()

TEST(each_write_starts_the_fan_out_at_the_next_rank) {
  // In a fixed rank order the last rank got every result last, answered last and completed most
  // rounds of a healthy job (which the concede policy reads as a straggler's sign).
  Job job;
  ResultBatch b;
  for (uint16_t w = 0; w < 2 * kWorld; ++w) {
    Datagram d(job, 'a', 100, GS_RANK_ALL);
    CHECK(b.add(d.r, /*gso=*/true));
    std::vector<Msg> m = write_all(b, true);
    CHECK_EQ(m.size(), size_t{kWorld});
    for (uint16_t k = 0; k < kWorld; ++k) CHECK_EQ(m[k].port, 9000 + (w + k) % kWorld);
    b.clear();
  }
}
