// The switch part of an Op on the communicator's worker::Group: the job's wire and starting it.
#pragma once

#include <string>

#include "mpi/config.h"
#include "mpi/op.h"
#include "worker/group.h"

namespace gradswitch::mpi {

// The wire the communicator's job is joined with (every rank passes the same).
std::string join_wire(FloatWire wire);

// Queues the op's switch part: reads op.input, writes the sum into op.output (when not null).
// The op's buffers stay untouched by the caller until op.handle completes.
worker::Handle start_switch(worker::Group& group, Op& op, FloatWire wire);

}  // namespace gradswitch::mpi
