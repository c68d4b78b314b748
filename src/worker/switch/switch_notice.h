// Why the switch ended a job, in words a user can act on: the abort reason of an ABORT datagram,
// an `EVENT aborted` line or STATUS, with what the switch adds (which ranks left with LEAVE, and
// for ranks that disagree the two contributions it could not sum), and the switch itself going
// away (docs/protocol.md sections 1.4 and 3).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "worker/control.h"
#include "worker/errors.h"
#include "worker/path.h"

namespace gradswitch::worker {

// The abort explained from the switch's keys (`left`, `mismatch_*`, as EVENT and STATUS carry
// them; may be empty). `op` is the allreduce this rank was running or about to run (may be null).
std::string describe_abort(uint8_t reason, uint16_t rank, const std::map<std::string, std::string>& kv,
                           const PathContext& ctx, const AllreduceOp* op);

// Throws the error of an abort whose text is `msg`: SwitchLostError when the switch (at `at`) is gone
// or a rank left because it lost another of the job's switches (lost=: the ranks of a sharded job then
// fail alike, whichever of them noticed the loss first), else AbortedError.
[[noreturn]] void throw_abort(uint8_t reason, uint16_t rank, const std::map<std::string, std::string>& kv,
                              const std::string& msg, const std::string& at);

// Throws the error a notice stands for: AbortedError, or SwitchLostError for a shutdown, a
// closed connection, or a rank that left because it lost another switch of the job (lost=). `started`: the
// notice came during `op` rather than before it.
[[noreturn]] void throw_notice(const PathContext& ctx, const ControlClient& control, const SwitchNotice& n,
                               const AllreduceOp& op, bool started);

// Before `next` enters an idle switch path: throws (started=false) the notice the control connection
// brought meanwhile, if any (the switch ended the job between two allreduces); `control` may be null.
void throw_idle_notice(const PathContext& ctx, ControlClient* control, const AllreduceOp& next);

// A sharded job's switch (`ctx`, at `control`) that another rank lost first: `seen` is the abort its
// LEAVE lost= caused at another of the job's switches (seen.lost() is this switch). Throws the
// SwitchLostError that names this switch, as if this rank had seen it close.
[[noreturn]] void throw_lost_elsewhere(const PathContext& ctx, const ControlClient& control,
                                       const SwitchLostError& seen, const AllreduceOp& op);

// After an ABORT datagram during `op`. The datagram is a hint, not the verdict (docs/protocol.md §4,
// "ABORT"): whoever knows the job's id and key can write one, and its reason and rank are the
// writer's. The control connection (TCP to the switch, authenticated where the switch has an auth
// file) says whether the job really is aborted: an `EVENT aborted` line already there, or else STATUS
// (`timeout_s` at most). Throws the abort in the switch's words (the EVENT's or STATUS's reason, rank
// and details) when it is, or SwitchLostError when the connection is found closed; returns when the
// switch says the job runs or does not answer (a real abort then still arrives as its EVENT line).
// Without a control connection (a test's Group; Group::connect always has one) the datagram is believed.
void confirm_abort(const PathContext& ctx, ControlClient* control, uint8_t reason, uint16_t rank,
                   const AllreduceOp& op, double timeout_s);

}  // namespace gradswitch::worker
