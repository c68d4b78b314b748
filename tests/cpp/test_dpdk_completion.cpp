// Completion signals of the DPDK switch (completion.h, include/gradswitch/notify.h): which seq is
// signalled when, with which elements and time, over several aggregation threads; the datagram's
// bytes; and the placement of tasks on lcores (lcore_layout.h).
#include <cstring>
#include <vector>

#include "gradswitch/notify.h"
#include "harness.h"
#include "switch/io/dpdk/completion.h"
#include "switch/io/dpdk/lcore_layout.h"

using namespace gradswitch::dpdk;

namespace {

// The engine index a test gives a job (any index unique among live jobs will do).
unsigned index_of(uint32_t job_id) {
  return job_id % CompletionRecords::kEntries;
}

constexpr uint64_t kQuietNs = 1'000'000;

struct Harness {
  std::vector<CompletionRecords> threads;
  std::vector<const CompletionRecords*> views;
  CompletionMonitor monitor{kQuietNs};
  std::vector<gs_notify> sent;
  bool reachable = true;  // false: the sender cannot send (neighbour unknown)

  explicit Harness(unsigned n) : threads(n) {
    for (const CompletionRecords& t : threads) views.push_back(&t);
  }
  void tick(uint64_t now) {
    monitor.tick(views, now, [&](const gs_notify& n) {
      if (reachable) sent.push_back(n);
      return reachable;
    });
  }
};

}  // namespace

TEST(newer_seq_signals_the_previous_one_with_its_elements) {
  Harness h(2);
  const uint32_t job = 0x1203;  // index 3
  h.threads[0].record(index_of(job), job, 7, 100, 1000);
  h.threads[1].record(index_of(job), job, 7, 60, 1100);  // seq 7's results came from both threads
  h.threads[0].record(index_of(job), job, 7, 40, 1200);
  h.tick(2000);
  CHECK(h.sent.empty());  // not quiet yet, no newer seq
  h.threads[1].record(index_of(job), job, 8, 10, 3000);
  h.tick(3100);
  CHECK(h.sent.size() == 1);
  if (h.sent.size() != 1) return;
  const gs_notify& n = h.sent[0];
  CHECK(n.magic == GS_NOTIFY_MAGIC && n.version == GS_NOTIFY_VERSION && n.reason == GS_NOTIFY_NEWER_SEQ);
  CHECK(n.job_id == job && n.seq == 7 && n.elements == 200 && n.last_result_ns == 1200);
  // Thread 0 still shows seq 7: seq 8's elements are only thread 1's (not mixed with seq 7's).
  h.tick(3000 + kQuietNs);
  CHECK(h.sent.size() == 2 && h.sent[1].reason == GS_NOTIFY_QUIET && h.sent[1].seq == 8 &&
        h.sent[1].elements == 10 && h.sent[1].last_result_ns == 3000);
  h.tick(3000 + 3 * kQuietNs);
  CHECK(h.sent.size() == 2);  // each seq once
}

TEST(quiet_signal_is_retried_until_it_can_be_sent) {
  Harness h(1);
  h.threads[0].record(index_of(5), 5, 0, 8, 100);
  h.reachable = false;
  h.tick(100 + kQuietNs);
  h.tick(200 + kQuietNs);
  CHECK(h.sent.empty());
  h.reachable = true;
  h.tick(300 + kQuietNs);
  CHECK(h.sent.size() == 1 && h.sent[0].seq == 0 && h.sent[0].elements == 8);
  h.tick(400 + kQuietNs);
  CHECK(h.sent.size() == 1);
}

TEST(a_new_job_on_the_same_index_starts_over) {
  Harness h(1);
  h.threads[0].record(index_of(0x0105), 0x0105, 40, 1, 100);
  h.tick(100 + kQuietNs);
  CHECK(h.sent.size() == 1 && h.sent[0].job_id == 0x0105 && h.sent[0].seq == 40);
  h.threads[0].record(index_of(0x0205), 0x0205, 0, 3,
                      5 * kQuietNs);  // job id reused index 5, seq starts at 0
  h.tick(6 * kQuietNs);
  CHECK(h.sent.size() == 2 && h.sent[1].job_id == 0x0205 && h.sent[1].seq == 0 && h.sent[1].elements == 3);
}

TEST(seq_comparison_wraps) {
  CHECK(gradswitch::seq_after(0, 0xFFFFFFFFu));
  CHECK(!gradswitch::seq_after(0xFFFFFFFFu, 0));
  Harness h(1);
  h.threads[0].record(index_of(9), 9, 0xFFFFFFFFu, 1, 10);
  h.threads[0].record(index_of(9), 9, 0, 2, 20);            // seq wrapped: newer
  h.threads[0].record(index_of(9), 9, 0xFFFFFFFFu, 5, 30);  // a late older result does not go back
  h.tick(30 + kQuietNs);
  CHECK(h.sent.size() == 1 && h.sent[0].seq == 0 && h.sent[0].elements == 2);
}

TEST(notify_datagram_bytes) {
  gs_notify n{};
  n.magic = GS_NOTIFY_MAGIC;
  n.version = GS_NOTIFY_VERSION;
  n.reason = GS_NOTIFY_QUIET;
  n.job_id = 0x01020304;
  n.seq = 0x0A0B0C0D;
  n.elements = 0x1122334455667788ull;
  n.last_result_ns = 0x99AABBCCDDEEFF00ull;
  uint8_t b[GS_NOTIFY_BYTES];
  gs_notify_encode(&n, b);
  const uint8_t expect[GS_NOTIFY_BYTES] = {'G',  'S',  'C',  'N',  1,    2,    0,    0,    1,    2,    3,
                                           4,    0x0A, 0x0B, 0x0C, 0x0D, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66,
                                           0x77, 0x88, 0x99, 0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0xFF, 0x00};
  CHECK(std::memcmp(b, expect, sizeof b) == 0);
  gs_notify d;
  gs_notify_decode(b, &d);
  CHECK(std::memcmp(&d, &n, sizeof d) == 0);
}

namespace {

std::string plan_text(const std::string& layout, unsigned L, unsigned P, unsigned X) {
  std::vector<LcoreTasks> plan;
  std::string chosen, error;
  if (!plan_lcores(layout, L, P, X, &plan, &chosen, &error)) return "error: " + error;
  std::string s = chosen + ":";
  for (const LcoreTasks& t : plan) {
    s += " " + std::to_string(t.lcore_index) + "=";
    for (unsigned p : t.rx_ports) s += "r" + std::to_string(p);
    for (unsigned p : t.tx_ports) s += "t" + std::to_string(p);
    for (unsigned k : t.aggs) s += "a" + std::to_string(k);
  }
  return s;
}

}  // namespace

TEST(lcore_layouts) {
  struct Case {
    const char* layout;
    unsigned L, P, X;
    const char* expect;
  };
  const Case cases[] = {
      {"auto", 1, 3, 1, "single: 0=r0r1r2t0t1t2a0"},
      {"auto", 2, 3, 2, "io: 0=r0r1r2t0t1t2 1=a0a1"},
      {"auto", 3, 2, 1, "8a: 0=r0t0 1=r1t1 2=a0"},
      {"auto", 5, 2, 1, "8b: 0=r0 1=r1 2=t0 3=t1 4=a0"},
      {"io", 4, 2, 2, "io: 0=r0r1t0t1 1=a0 2=a1"},  // lcore 3 has nothing to do: left out
      {"io", 3, 2, 3, "io: 0=r0r1t0t1 1=a0a2 2=a1"},
      {"single", 4, 2, 2, "single: 0=r0r1t0t1a0a1"},
      {"8b", 4, 2, 1, "error: layout 8b needs 5 lcores, EAL has 4 (EAL -l)"},
      {"io", 1, 2, 1, "error: layout io needs 2 lcores, EAL has 1 (EAL -l)"},
      {"9z", 4, 2, 1, "error: unknown layout '9z' (expected auto, 8b, 8a, io or single)"},
  };
  for (const Case& c : cases) {
    const std::string got = plan_text(c.layout, c.L, c.P, c.X);
    if (got != c.expect) {
      std::fprintf(stderr, "  layout %s L=%u P=%u X=%u: got '%s', expected '%s'\n", c.layout, c.L, c.P, c.X,
                   got.c_str(), c.expect);
      ++gs_test::failures();
    }
  }
}

GS_TEST_MAIN()
