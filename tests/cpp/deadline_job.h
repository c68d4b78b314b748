// A four-rank job of 4-element int32 chunks in a one-thread engine, for the bounded-time round tests
// (test_engine_deadline.cpp, test_engine_concede.cpp; docs/protocol.md §3.1): DATA, concessions and
// deadlines of slot 0's rounds, and what the engine sent.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/header.h"
#include "gradswitch/wire.h"
#include "ingest_result.h"
#include "switch/engine/engine.h"

namespace gradswitch {

constexpr uint64_t kDeadlineNs = 5'000'000;
constexpr size_t kTrailerAt = GS_HEADER_BYTES + 4 * 4;  // after a PARTIAL RESULT's four int32

struct Job4 {
  Engine engine{EngineConfig{1, 4}};
  uint32_t id = 0;
  uint32_t key = 0xC0FFEEu;
  // Four ranks; with `deadline`, rounds close after kDeadlineNs once `quorum` contributed.
  explicit Job4(bool deadline, uint16_t quorum = 3, uint8_t wire = GS_ELEM_INT32) {
    JobSpec spec;
    spec.name = "deadline";
    spec.world = 4;
    spec.slots = 2;
    spec.payload_bytes = 64;
    spec.key = key;
    spec.endpoints.resize(4);
    spec.wire = wire;
    if (deadline) spec.deadline_ns = kDeadlineNs, spec.quorum = quorum;
    std::string err;
    id = engine.create_job(spec, &err);
  }
  // Rank `rank`'s four int32, each `base + rank + i`, for (seq, offset 0) in slot 0, the version in
  // `flags` (GS_FLAG_VERSION; a worker flips it at each use of the slot, §4).
  IngestResult send(uint16_t rank, uint32_t seq, int32_t base, uint64_t now_ns, uint8_t flags = 0) {
    std::vector<uint8_t> p(GS_HEADER_BYTES + 16);
    HeaderBuilder(GS_MSG_DATA, id, key)
        .rank(rank)
        .flags(flags)
        .elems(GS_ELEM_INT32, 4)
        .round(seq, 0)
        .encode(p.data());
    for (int i = 0; i < 4; ++i) {
      const int32_t v = base + rank + i;
      std::memcpy(p.data() + GS_HEADER_BYTES + 4 * i, &v, 4);
    }
    return engine.ingest(0, p.data(), p.size(), now_ns, Endpoint{});
  }
  // Rank `rank`'s concession of the same chunk: the header alone (with `extra` payload bytes, 0s).
  IngestResult concede(uint16_t rank, uint32_t seq, uint64_t now_ns, uint8_t flags = 0, uint16_t count = 4,
                       size_t extra = 0, uint8_t elem_type = GS_ELEM_INT32) {
    std::vector<uint8_t> p(GS_HEADER_BYTES + extra, 0);
    HeaderBuilder(GS_MSG_DATA, id, key)
        .rank(rank)
        .flags(static_cast<uint8_t>(flags | GS_FLAG_CONCEDE))
        .elems(elem_type, count)
        .round(seq, 0)
        .encode(p.data());
    return engine.ingest(0, p.data(), p.size(), now_ns, Endpoint{});
  }
  // The deadline of round (seq, offset 0) in slot 0, version `version`.
  IngestResult close(uint32_t seq, uint64_t now_ns, uint8_t version = 0) {
    return engine.close_overdue(0, id, 0, version, seq, 0, now_ns);
  }
  static int32_t element(const IngestResult& r, int i) {
    if (!r.data) return INT32_MIN;  // nothing was sent: a failed check, not a crash
    int32_t v;
    std::memcpy(&v, r.data + GS_HEADER_BYTES + 4 * i, 4);
    return v;
  }
  CounterValues counters() const {
    JobStatus s;
    engine.job_status(id, &s);
    return s.counters;
  }
};

// The header of what the engine sent, all zeros when it sent nothing (so that a failing check reports
// rather than crashes).
inline gs_header sent(const IngestResult& r) {
  return r.data ? header_of(r) : gs_header{};
}

// The bytes after the header (elements and trailer), which every rank must receive alike.
inline std::vector<uint8_t> body(const IngestResult& r) {
  if (!r.data || r.len < GS_HEADER_BYTES) return {};
  return std::vector<uint8_t>(r.data + GS_HEADER_BYTES, r.data + r.len);
}

}  // namespace gradswitch
