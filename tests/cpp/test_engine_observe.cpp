// What the engine tells observers: round and allreduce durations, abort counts, open rounds, and
// that a reader on another thread keeps a job alive until it lets go (Engine::ReadGuard).
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/header.h"
#include "gradswitch/wire.h"
#include "harness.h"
#include "switch/engine/engine.h"

using namespace gradswitch;

namespace {

struct Fixture {
  Engine engine{EngineConfig{1, 4}};
  uint32_t id = 0;
  uint32_t key = 0xBEEFu;
  explicit Fixture(uint16_t world = 2) {
    JobSpec spec;
    spec.name = "obs";
    spec.world = world;
    spec.slots = 4;
    spec.key = key;
    spec.endpoints.resize(world);
    std::string err;
    id = engine.create_job(spec, &err);
  }
  // Rank `rank`'s int32 contribution to (slot, seq, offset) at time `now_ns`; `last` ends its tensor.
  IngestResult send(uint16_t rank, uint16_t slot, uint32_t seq, uint32_t offset, uint64_t now_ns,
                    bool last = false, uint16_t count = 1) {
    std::vector<uint8_t> p(GS_HEADER_BYTES + 4u * count, 0);
    HeaderBuilder(GS_MSG_DATA, id, key)
        .rank(rank)
        .slot(slot)
        .flags(last ? GS_FLAG_LAST : 0)
        .elems(GS_ELEM_INT32, count)
        .round(seq, offset)
        .encode(p.data());
    return engine.ingest(0, p.data(), p.size(), now_ns, Endpoint{});  // the ranks joined from {0, 0}
  }
};

size_t bucket_of(uint64_t ns) {
  size_t b = 0;
  while (b < kLatencyBoundsNs.size() && kLatencyBoundsNs[b] < ns) ++b;
  return b;
}

}  // namespace

TEST(rounds_and_allreduces_are_timed_from_their_first_packet) {
  Fixture f;
  // allreduce 0: two chunks in slots 0 and 1; its first packet at t = 1 ms
  f.send(0, 0, 0, 0, 1'000'000);
  f.send(0, 1, 0, 1, 1'100'000, true);
  CHECK(f.send(1, 0, 0, 0, 1'004'000).kind == IngestResult::kSend);        // a round of 4 µs
  CHECK(f.send(1, 1, 0, 1, 1'300'000, true).kind == IngestResult::kSend);  // 200 µs; the allreduce: 300 µs
  LatencyValues rounds = f.engine.total_round_times(), allreduces = f.engine.total_allreduce_times();
  CHECK_EQ(rounds.count(), 2u);
  CHECK_EQ(rounds.counts[bucket_of(4'000)], 1u);
  CHECK_EQ(rounds.counts[bucket_of(200'000)], 1u);
  CHECK_EQ(rounds.sum_ns, 204'000u);
  CHECK_EQ(allreduces.count(), 1u);
  CHECK_EQ(allreduces.sum_ns, 300'000u);
  CHECK_EQ(allreduces.counts[bucket_of(300'000)], 1u);
  LatencyValues jr, ja;
  CHECK(f.engine.job_latency(f.id, &jr, &ja));
  CHECK_EQ(jr.count(), 2u);
  CHECK_EQ(ja.sum_ns, 300'000u);
  // a retransmission answered from the shadow copy completes nothing again
  f.send(1, 1, 0, 1, 2'000'000, true);
  CHECK_EQ(f.engine.total_round_times().count(), 2u);
  CHECK_EQ(f.engine.total_allreduce_times().count(), 1u);
  // allreduce 1 starts before the last chunk of allreduce 2 (streaming): each is timed from its own start
  f.send(0, 2, 1, 0, 10'000'000, true);
  f.send(0, 3, 2, 0, 10'500'000, true);
  f.send(1, 3, 2, 0, 11'500'000, true);  // allreduce 2 done: 1 ms
  f.send(1, 2, 1, 0, 13'000'000, true);  // allreduce 1 done: 3 ms
  allreduces = f.engine.total_allreduce_times();
  CHECK_EQ(allreduces.count(), 3u);
  CHECK_EQ(allreduces.sum_ns, 300'000u + 1'000'000u + 3'000'000u);
  CHECK(f.engine.total_allreduce_times().counts.back() == 0);  // nothing above 10 s
}

TEST(open_rounds_oldest_first_with_their_contributors) {
  Fixture f(3);
  f.send(2, 1, 7, 360, 5'000);
  f.send(0, 0, 7, 0, 9'000);
  f.send(1, 1, 7, 360, 9'500);
  std::vector<OpenRound> open;
  CHECK(f.engine.open_rounds(f.id, &open));
  CHECK_EQ(open.size(), 2u);
  if (open.size() == 2) {
    CHECK(open[0].slot == 1 && open[0].seq == 7 && open[0].offset == 360 && open[0].opened_ns == 5'000);
    CHECK_EQ(open[0].seen, 0b110u);
    CHECK(open[1].slot == 0 && open[1].seen == 0b001u && open[1].opened_ns == 9'000);
  }
  f.send(0, 1, 7, 360, 10'000);  // completes slot 1
  CHECK(f.engine.open_rounds(f.id, &open) && open.size() == 1 && open[0].slot == 0);
  CHECK(!f.engine.open_rounds(f.id + 1, &open));
}

TEST(aborts_are_counted_by_reason) {
  Fixture f;
  CHECK(f.engine.abort_job(f.id, GS_ABORT_OPERATOR, GS_RANK_ALL));
  CHECK(!f.engine.abort_job(f.id, GS_ABORT_IDLE, GS_RANK_ALL));  // claimed once
  Fixture g;
  g.send(0, 0, 0, 0, 1, false, 1);
  g.send(1, 0, 0, 0, 2, false, 2);  // disagrees on the length: mismatch
  auto a = f.engine.aborts(), b = g.engine.aborts();
  CHECK_EQ(a[GS_ABORT_OPERATOR], 1u);
  CHECK_EQ(a[GS_ABORT_IDLE], 0u);
  CHECK_EQ(b[GS_ABORT_MISMATCH], 1u);
}

TEST(a_reader_keeps_a_job_alive_until_it_lets_go) {
  Fixture f;
  std::atomic<bool> destroyed{false};
  std::thread control;
  {
    Engine::ReadGuard guard(f.engine);
    control = std::thread([&] {
      f.engine.destroy_job(f.id);
      destroyed.store(true);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(!destroyed.load());  // the job is unpublished but not freed: the reader may hold it
    JobStatus s;
    (void)f.engine.job_status(f.id, &s);  // gone from the table: not found, never a freed job
  }
  control.join();
  CHECK(destroyed.load());
  JobStatus s;
  CHECK(!f.engine.job_status(f.id, &s));
}

GS_TEST_MAIN()
