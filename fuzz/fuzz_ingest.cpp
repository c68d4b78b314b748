// libFuzzer target over the switch's packet ingest. The input is a sequence of datagrams
// (2-byte little-endian length, then the bytes). Two jobs are live; the fuzzer is given their ids
// and keys through the seed corpus so it reaches deep states. Checks: no crash, no sanitizer
// report, and every packet the engine asks to send is well formed and within the payload size.
#include <cstdint>
#include <cstring>
#include <string>

#include "gradswitch/wire.h"
#include "switch/engine/engine.h"

using namespace gradswitch;

namespace {

Engine& engine_with_jobs(uint32_t* ids) {
  static Engine engine(EngineConfig{2, 4});
  static uint32_t job_ids[2] = {0, 0};
  if (!job_ids[0]) {
    for (int j = 0; j < 2; ++j) {
      JobSpec spec;
      spec.name = "fuzz" + std::to_string(j);
      spec.world = j ? 3 : 2;
      spec.slots = 4;
      spec.payload_bytes = 64;
      spec.key = 0x11111111u * (j + 1);
      spec.elem_types = 0x7E;  // every element type, to reach every summing path
      spec.endpoints.resize(spec.world);
      std::string err;
      job_ids[j] = engine.create_job(spec, &err);
      if (!job_ids[j]) __builtin_trap();
    }
  }
  ids[0] = job_ids[0];
  ids[1] = job_ids[1];
  return engine;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint32_t ids[2];
  Engine& engine = engine_with_jobs(ids);
  alignas(64) uint8_t packet[GS_MAX_PAYLOAD_BYTES + GS_HEADER_BYTES];
  size_t pos = 0;
  while (pos + 2 <= size) {
    size_t len = data[pos] | (size_t{data[pos + 1]} << 8);
    pos += 2;
    if (len > size - pos) len = size - pos;
    if (len > sizeof packet) len = sizeof packet;
    std::memcpy(packet, data + pos, len);
    pos += len;
    // The thread is derived from the slot, as a backend would; odd lengths exercise misalignment.
    unsigned thread = len >= 16 ? ((packet[14] << 8 | packet[15]) % 2) : 0;
    engine.begin_burst(thread);
    IngestResult r = engine.ingest(thread, packet, len, pos, Endpoint{});  // the ranks joined from {0, 0}
    if (r.kind == IngestResult::kSend) {
      if (r.len < GS_HEADER_BYTES || r.len > GS_HEADER_BYTES + 64) __builtin_trap();
      gs_header h;
      gs_header_decode(r.data, &h);
      if (h.magic != GS_MAGIC || (h.job_id != ids[0] && h.job_id != ids[1])) __builtin_trap();
      if (h.type == GS_MSG_RESULT && r.len != GS_HEADER_BYTES + gs_payload_bytes(h.elem_type, h.count))
        __builtin_trap();
      if (r.dest_rank != GS_RANK_ALL && r.dest_rank >= r.world) __builtin_trap();
      const uint64_t dests = destinations(r);
      if (dests == 0 || (r.world < 64 && dests >> r.world != 0)) __builtin_trap();
      if (h.type == GS_MSG_HELD) {  // to ranks the round lacks (or the resender): never to nobody
        if (r.len != GS_HEADER_BYTES + GS_HELD_BODY_BYTES || h.rank != GS_RANK_ALL) __builtin_trap();
        const uint64_t contributors = gs_held_contributors(r.data + GS_HEADER_BYTES);
        if (contributors == 0 || (r.world < 64 && contributors >> r.world != 0)) __builtin_trap();
      }
    }
    engine.end_burst(thread);
  }
  return 0;
}
