// The allreduce through the switch (docs/protocol.md section 4): a tensor streams through the
// job's slot pool, one chunk per round, each slot reused as soon as its result arrives; lost
// rounds are found by the LossDetector and resent; fixed32 agrees block exponents through the
// same rounds (section 5).
#pragma once

#include <cstdint>
#include <vector>

#include "common/rng.h"
#include "worker/control.h"
#include "worker/loss_detector.h"
#include "worker/path.h"
#include "worker/window.h"

namespace gradswitch::worker {

class SwitchAllreduce {
 public:
  // `control` (may be null in tests) answers STATUS when an allreduce times out.
  SwitchAllreduce(const PathContext& ctx, ControlClient* control);

  // Runs one allreduce to completion; throws TimeoutError / AbortedError / Error.
  void run(const AllreduceOp& op);

 private:
  struct Run;

  void prepare_bootstrap(Run& run, unsigned slot);
  void prepare_chunk(Run& run, unsigned slot, size_t c, int8_t agreed_exp);
  void launch(unsigned slot, int64_t now);
  void send(unsigned slot);
  void flush();
  // Handles one received datagram.
  void receive(Run& run, const uint8_t* p, uint32_t len, int64_t now);
  // Loss detection over the first W slots after the socket was drained; returns the next
  // timer deadline.
  int64_t check_timers(unsigned W, int64_t now);
  [[noreturn]] void fail_timeout(const Run& run);

  const PathContext& ctx_;
  ControlClient* control_;
  Window window_;
  LossDetector loss_;
  LossInjector drops_;  // the drop_rate test hook, seeded from (seed, rank)
  std::vector<OutPacket> out_;
  std::vector<unsigned> resend_;
};

}  // namespace gradswitch::worker
