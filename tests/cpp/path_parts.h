// What a data path's PathContext (worker/path.h) points to, owned in one place for the worker tests
// and the ring fuzzer (fuzz/fuzz_ring.cpp): the options, the switch's JOIN answer, the counters and
// the cancel flag; and a ring's configuration of `world` ranks on 127.0.0.1.
#pragma once

#include <arpa/inet.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "worker/path.h"
#include "worker/ring/ring_allreduce.h"

namespace gradswitch::worker {

struct PathParts {
  Options opt;
  JoinInfo join;
  Counters counters;
  std::atomic<bool> cancel{false};
  PathContext ctx;

  explicit PathParts(Options o = {}, JoinInfo j = {}, Transport* transport = nullptr,
                     std::string job_text = "")
      : opt(std::move(o)), join(std::move(j)) {
    ctx.opt = &opt;
    ctx.join = &join;
    ctx.transport = transport;
    ctx.counters = &counters;
    ctx.cancel = &cancel;
    ctx.job_text = std::move(job_text);
  }
  PathParts(const PathParts&) = delete;  // ctx points into this object
  PathParts& operator=(const PathParts&) = delete;
};

// Ranks 0 .. world-1 on 127.0.0.1, UDP ports base_port + rank.
inline RingConfig loopback_ring(unsigned world, uint16_t base_port, uint32_t job_id, uint32_t key,
                                unsigned slots, uint32_t payload_bytes) {
  RingConfig cfg;
  for (unsigned k = 0; k < world; ++k)
    cfg.peers.push_back(RingPeer{htonl(0x7F000001), static_cast<uint16_t>(base_port + k)});
  cfg.job_id = job_id;
  cfg.key = key;
  cfg.slots = slots;
  cfg.payload_bytes = payload_bytes;
  return cfg;
}

}  // namespace gradswitch::worker
