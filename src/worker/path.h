// What every data path (the switch's streaming window, the ring) gets from its Group: the
// group's context, and one allreduce described independently of the algorithm that runs it.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "worker/chunk_codec.h"
#include "worker/control.h"
#include "worker/counters.h"
#include "worker/options.h"
#include "worker/transport.h"

namespace gradswitch::worker {

struct PathContext {
  const Options* opt = nullptr;
  const JoinInfo* join = nullptr;
  Transport* transport = nullptr;
  Counters* counters = nullptr;
  const std::atomic<bool>* cancel = nullptr;  // Group::close(abort=true)
  std::string job_text;                       // "job 'x' (job_id 3, rank 0 of 4)", for messages
};

// One allreduce: the tensor (overwritten with the sum chunk by chunk), its chunks, and for
// fixed32 this rank's block exponent of every chunk. The switch path also sums out of place: it
// then reads `src` and writes the sum into `base`, or keeps no sum when `base` is nullptr (an MPI
// reduction's non-root ranks).
struct AllreduceOp {
  uint8_t* base = nullptr;
  const uint8_t* src = nullptr;  // nullptr: `base`
  const uint8_t* input() const { return src ? src : base; }
  Chunking ch;
  const std::vector<int8_t>* exps = nullptr;
  uint32_t seq = 0;
  // Per chunk, set once the chunk's sum is in the tensor (null: not tracked). What the ring needs
  // to finish an allreduce the switch left half done.
  std::vector<uint8_t>* done = nullptr;
};

// How an allreduce moves: through the switch's window or along the ring. Allreduces admitted in
// order stream back to back through one window (stream_schedule.h).
class DataPath {
 public:
  virtual ~DataPath() = default;
  // Adds an allreduce behind those admitted before it (the op must stay valid until it finished).
  virtual void admit(AllreduceOp* op) = 0;
  // Receives, detects losses and sends once, waiting at most until the next timer or a wake();
  // appends the allreduces that finished to `*finished`. When idle, only serves the network.
  // Throws on failure; every admitted allreduce is then lost to this path (op.done tells which
  // chunks arrived).
  virtual void step(std::vector<AllreduceOp*>* finished) = 0;
  // No allreduce admitted and unfinished.
  virtual bool idle() const = 0;
};

}  // namespace gradswitch::worker
