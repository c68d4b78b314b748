// When the UDP backend sends a burst's results: at once, or with the next bursts' (--hold-us).
//
// Where per-packet CPU bounds the rate (the kernel's path per datagram, and every wake-up of a
// worker), a job is as fast as the trains its results travel in: each write the switch makes to a
// worker is a system call here and a wake-up and a receive there. Bursts are as small as the
// datagrams that happened to be queued when the thread woke, and under loss the answers to resends
// make many of one or two datagrams. Results of a burst that leaves a round open (a contribution
// came and the round still waits for others, so more DATA is on its way) may wait up to the hold
// for the next bursts', until they are `kEnough` datagrams. A burst that leaves nothing open sends
// at once, with whatever waited: a small allreduce, or the last round of a tensor, pays no wait.
// Why, and what it costs a worker's round trips: docs/transport.md, "The switch's result hold"; the
// protocol's rule: docs/protocol.md §3; what it gains: BENCHMARKS.md §10.
//
// No sockets, no clock: the backend reports what the engine answered and the time; this decides.
#pragma once

#include <cstddef>
#include <cstdint>

#include "switch/engine/engine.h"

namespace gradswitch {

class ResultHold {
 public:
  // A batch of this many datagrams leaves whatever the hold: a worker's GSO write carries up to 64.
  static constexpr size_t kEnough = 16;

  explicit ResultHold(uint64_t hold_ns) : hold_ns_(hold_ns) {}

  // Every answer of the engine in a burst, in order. A network duplicate the engine absorbed counts as
  // a contribution: at worst its burst's results wait one hold.
  void saw(const IngestResult& r) {
    if (r.kind == IngestResult::kAbsorbed) {
      open_ = true;
      open_job_ = r.job_id;
      open_slot_ = r.slot;
    } else if (r.kind == IngestResult::kSend && open_ && r.job_id == open_job_ && r.slot == open_slot_) {
      open_ = false;  // the round the burst's latest contribution joined completed (or was answered)
    }
  }

  // After a burst at `now`, with `datagrams` waiting to be sent: true when they wait for the next
  // burst's (until deadline()); false when they go now.
  bool wait(uint64_t now, size_t datagrams) {
    const bool open = open_;
    open_ = false;
    if (hold_ns_ == 0 || datagrams == 0 || !open || datagrams >= kEnough) return false;
    if (since_ns_ == 0) since_ns_ = now;
    return now - since_ns_ < hold_ns_;
  }

  // Whether results wait, and until when they may (monotonic ns).
  bool waiting() const { return since_ns_ != 0; }
  uint64_t deadline() const { return since_ns_ + hold_ns_; }

  // The waiting results went out.
  void sent() { since_ns_ = 0; }

 private:
  uint64_t hold_ns_;
  uint64_t since_ns_ = 0;  // when the first waiting result's burst ended; 0 = none waits
  bool open_ = false;      // the burst's latest contribution left its round open
  uint32_t open_job_ = 0;
  uint16_t open_slot_ = 0;
};

}  // namespace gradswitch
