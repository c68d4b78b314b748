// What every data path (the switch's streaming window, the ring) gets from its Group: the
// group's context, and one allreduce described independently of the algorithm that runs it.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "common/counter.h"
#include "gradswitch/wire.h"
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
  uint32_t switch_ipv4_be = 0;                // where DATA goes (network order); 0: the transport's peer
};

// Sends the packets a path queued in one batch, counts them and empties the queue.
inline void send_counted(const PathContext& ctx, std::vector<OutPacket>* out) {
  if (out->empty()) return;
  uint64_t bytes = 0;
  for (const OutPacket& p : *out) bytes += p.len;
  ctx.transport->send_batch(out->data(), out->size());
  counter_add(ctx.counters->packets_sent, out->size());
  counter_add(ctx.counters->bytes_sent, bytes);
  out->clear();
}

// Decodes a received datagram's header into `*h`. False when it is shorter than a header, or not
// this protocol version's for job `job_id` with `key`: the path counts it ignored.
inline bool decode_job_header(const uint8_t* p, uint32_t len, uint32_t job_id, uint32_t key, gs_header* h) {
  if (len < GS_HEADER_BYTES) return false;
  gs_header_decode(p, h);
  return h->magic == GS_MAGIC && h->version == GS_VERSION && h->job_id == job_id && h->key == key;
}

// When an allreduce's packets left and its results came back, and what was resent: what the
// timeline (timeline.h) shows. The data path writes it on the group's thread while the allreduce
// is in flight; the Group reads it once the allreduce finished. `retx` is reserved beforehand: no
// allocation on the data path.
struct AllreduceTimes {
  static constexpr size_t kMaxRetxEvents = 32;  // the rest is counted in `retransmissions`
  struct Retx {
    int64_t at_ns;
    unsigned slot;
    size_t chunk;
  };
  int64_t first_send_ns = 0, first_result_ns = 0, last_result_ns = 0;
  uint64_t retransmissions = 0;
  // The adaptive window (switch/window_controller.h) when the last result came: its rounds (drains aside)
  // and the base round trip it measures queueing against; 0 without the adaptive window.
  unsigned window_rounds = 0;
  int64_t base_rtt_ns = 0;
  std::vector<Retx> retx;

  AllreduceTimes() { retx.reserve(kMaxRetxEvents); }
  void sent(int64_t now) {
    if (!first_send_ns) first_send_ns = now;
  }
  void result(int64_t now) {
    if (!first_result_ns) first_result_ns = now;
    last_result_ns = now;
  }
  void retransmit(int64_t now, unsigned slot, size_t chunk) {
    ++retransmissions;
    if (retx.size() < kMaxRetxEvents) retx.push_back({now, slot, chunk});
  }
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
  AllreduceTimes* times = nullptr;  // set when the timeline is on
  // Bounded-time rounds (docs/protocol.md §3.1), written by the switch path: the contributions this
  // allreduce's chunks lacked, and the ranks missing from at least one of them (bit r: rank r).
  uint64_t missed = 0;
  uint64_t missing_ranks = 0;
  // float32 with a deadline, or null: the input of each chunk whose sum lacks this rank is copied
  // here, at the tensor's offsets, before the sum overwrites it, less the rescaled sum's estimate of
  // it (Group::allreduce_async).
  float* unsummed = nullptr;
};

// How an allreduce moves: through the switch's window (one switch, or a job sharded over several)
// or along the ring. Allreduces admitted in order stream back to back through one window
// (stream_schedule.h). The Group chooses a path once, at connect (and hands a lost switch's
// allreduces to the ring once, algorithm auto), and asks the path what differs between them: what it
// does between allreduces, whether its allreduces track their chunks for a fallback, its name.
class DataPath {
 public:
  virtual ~DataPath() = default;
  // "switch" or "ring": what Group::algorithm() says while this path runs the allreduces.
  virtual const char* name() const = 0;
  // Adds an allreduce behind those admitted before it (the op must stay valid until it finished).
  virtual void admit(AllreduceOp* op) = 0;
  // Receives, detects losses and sends once, waiting at most until the next timer or a wake();
  // appends the allreduces that finished to `*finished`. When idle, only serves the network.
  // Throws on failure; every admitted allreduce is then lost to this path (op.done tells which
  // chunks arrived).
  virtual void step(std::vector<AllreduceOp*>* finished) = 0;
  // No allreduce admitted and unfinished.
  virtual bool idle() const = 0;

  // Whether the allreduces admitted here must mark in op.done the chunks whose sums arrived: a path
  // whose allreduces another may have to finish (the switch's, for the ring) does.
  virtual bool tracks_done() const { return false; }
  // Before `next` is admitted into a path with nothing in flight: throws, as step() would, what the
  // path learned while it was idle (the switch ended the job between two allreduces).
  virtual void resume(const AllreduceOp& next) {}
  // Whether the path has work while no allreduce is in flight (the ring answers its neighbours'
  // resent partials): the Group then calls serve() instead of sleeping, and wakes the transport
  // when it queues an operation.
  virtual bool serves_when_idle() const { return false; }
  // Serves the network until `timeout_ns` passed or the transport was woken (serves_when_idle()).
  virtual void serve(int64_t timeout_ns) {}
  // Before the group closes: serves what the peers may still ask of this rank, at most `max_s`
  // seconds. Returns whether they said they need nothing more.
  virtual bool linger(double max_s) { return true; }
};

}  // namespace gradswitch::worker
