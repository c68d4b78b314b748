// Why an allreduce through the switch made no progress: asks the switch STATUS for the stuck
// round and turns the answer into an error that names the missing ranks and what to check.
#pragma once

#include <cstdint>

#include "worker/control.h"
#include "worker/path.h"

namespace gradswitch::worker {

// The outstanding round with the lowest chunk when the timeout hit.
struct StuckRound {
  uint32_t seq = 0;
  unsigned slot = 0;
  uint8_t version = 0;
  bool bootstrap = false;  // a fixed32 exponent round
  uint32_t offset = 0;
};

// Throws TimeoutError (or AbortedError when STATUS says the job was aborted). `control` may be
// null (tests): the message then says what to check without asking.
[[noreturn]] void throw_switch_timeout(const PathContext& ctx, ControlClient* control,
                                       const StuckRound& stuck);

}  // namespace gradswitch::worker
