// libFuzzer target over the switch's packet ingest. The input is a sequence of datagrams
// (2-byte little-endian length, then the bytes). Three jobs are live, every element type allowed;
// the third closes rounds at a deadline (docs/protocol.md §3.1), driven here as a backend would by
// a clock that advances with the input's position. The fuzzer is given the jobs' ids and keys
// through the seed corpus so it reaches deep states. Checks: no crash, no sanitizer report, and
// every packet the engine asks to send is well formed and within the payload size; a PARTIAL
// RESULT carries a trailer naming only members, and at least the quorum unless ranks conceded the
// round (a header-only DATA with GS_FLAG_CONCEDE closes it once every member arrived, §3.1).
#include <cstdint>
#include <cstring>
#include <string>

#include "gradswitch/wire.h"
#include "switch/engine/engine.h"

using namespace gradswitch;

namespace {

constexpr unsigned kJobs = 3;
constexpr uint64_t kDeadlineNs = 20'000;  // job 2's; the clock advances 100 ns per input byte
constexpr unsigned kQuorum = 2;

Engine& engine_with_jobs(uint32_t* ids) {
  static Engine engine(EngineConfig{2, 4});
  static uint32_t job_ids[kJobs] = {0, 0, 0};
  if (!job_ids[0]) {
    for (unsigned j = 0; j < kJobs; ++j) {
      JobSpec spec;
      spec.name = "fuzz" + std::to_string(j);
      spec.world = j ? 3 : 2;
      spec.slots = 4;
      spec.payload_bytes = j == 2 ? 56 : 64;  // a deadline job's payload leaves room for the trailer
      spec.key = 0x11111111u * (j + 1);
      spec.elem_types = 0xFE;  // every element type, to reach every summing path
      spec.endpoints.resize(spec.world);
      if (j == 2) {
        spec.deadline_ns = kDeadlineNs;
        spec.quorum = kQuorum;
      }
      std::string err;
      job_ids[j] = engine.create_job(spec, &err);
      if (!job_ids[j]) __builtin_trap();
    }
  }
  for (unsigned j = 0; j < kJobs; ++j) ids[j] = job_ids[j];
  return engine;
}

void check_sent(const Engine& engine, const IngestResult& r, const uint32_t* ids) {
  if (r.kind != IngestResult::kSend) return;
  if (r.len < GS_HEADER_BYTES || r.len > GS_HEADER_BYTES + 64) __builtin_trap();
  gs_header h;
  gs_header_decode(r.data, &h);
  if (h.magic != GS_MAGIC || (h.job_id != ids[0] && h.job_id != ids[1] && h.job_id != ids[2]))
    __builtin_trap();
  if (h.type == GS_MSG_RESULT) {
    const bool partial = h.flags & GS_FLAG_PARTIAL;
    if (partial && h.job_id != ids[2]) __builtin_trap();  // only a job with a deadline closes early
    const size_t body = gs_payload_bytes(h.elem_type, h.count);
    if (r.len != GS_HEADER_BYTES + body + (partial ? GS_PARTIAL_TRAILER_BYTES : 0)) __builtin_trap();
    if (partial) {
      const uint64_t contributors = gs_held_contributors(r.data + GS_HEADER_BYTES + body);
      if (contributors >> 3 != 0) __builtin_trap();
      // Below the quorum only by concessions: none accepted yet means none closed a round.
      if (__builtin_popcountll(contributors) < int(kQuorum) && engine.total_counters().conceded == 0)
        __builtin_trap();
    }
  }
  if (r.dest_rank != GS_RANK_ALL && r.dest_rank >= r.world) __builtin_trap();
  const uint64_t dests = destinations(r);
  if (dests == 0 || (r.world < 64 && dests >> r.world != 0)) __builtin_trap();
  if (h.type == GS_MSG_HELD) {  // to ranks the round lacks (or the resender): never to nobody
    if (r.len != GS_HEADER_BYTES + GS_HELD_BODY_BYTES || h.rank != GS_RANK_ALL) __builtin_trap();
    const uint64_t contributors = gs_held_contributors(r.data + GS_HEADER_BYTES);
    if (contributors == 0 || (r.world < 64 && contributors >> r.world != 0)) __builtin_trap();
  }
}

// The rounds whose deadline the engine asked for, as a backend's timer keeps them (a few at most).
struct Deadline {
  IngestResult at;
  unsigned thread;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint32_t ids[kJobs];
  Engine& engine = engine_with_jobs(ids);
  alignas(64) uint8_t packet[GS_MAX_PAYLOAD_BYTES + GS_HEADER_BYTES];
  Deadline pending[16];
  size_t n_pending = 0;
  static uint64_t clock_base = 0;  // monotonic across inputs, as the engine's state outlives each
  size_t pos = 0;
  while (pos + 2 <= size) {
    size_t len = data[pos] | (size_t{data[pos + 1]} << 8);
    pos += 2;
    if (len > size - pos) len = size - pos;
    if (len > sizeof packet) len = sizeof packet;
    std::memcpy(packet, data + pos, len);
    pos += len;
    const uint64_t now = clock_base + pos * 100;
    // The thread is derived from the slot, as a backend would; odd lengths exercise misalignment.
    unsigned thread = len >= 16 ? ((packet[14] << 8 | packet[15]) % 2) : 0;
    engine.begin_burst(thread);
    IngestResult r = engine.ingest(thread, packet, len, now, Endpoint{});  // the ranks joined from {0, 0}
    check_sent(engine, r, ids);
    if (r.deadline_ns && n_pending < 16) pending[n_pending++] = {r, thread};
    engine.end_burst(thread);
    for (size_t i = 0; i < n_pending;) {  // the timer: rounds past their deadline close now
      const Deadline& d = pending[i];
      if (d.at.deadline_ns > now) {
        ++i;
        continue;
      }
      engine.begin_burst(d.thread);
      check_sent(
          engine,
          engine.close_overdue(d.thread, d.at.job_id, d.at.slot, d.at.version, d.at.seq, d.at.offset, now),
          ids);
      engine.end_burst(d.thread);
      pending[i] = pending[--n_pending];
    }
  }
  clock_base += size * 100 + kDeadlineNs;
  return 0;
}
