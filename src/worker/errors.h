// Errors raised by the worker library. The Python bindings map each class to an exception:
// Error -> GradswitchError, TimeoutError -> GradswitchTimeout, AbortedError -> JobAborted
// (SwitchLostError -> SwitchLost, a JobAborted),
// InvalidArgument -> ValueError, UnsupportedType -> TypeError.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace gradswitch::worker {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// No progress within the timeout (allreduce), or not every rank joined in time (JOIN).
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// The switch aborted the job (an ABORT packet, or STATUS says aborted).
class AbortedError : public Error {
 public:
  AbortedError(const std::string& what, uint8_t reason, uint16_t rank)
      : Error(what), reason_(reason), rank_(rank) {}
  uint8_t reason() const { return reason_; }
  uint16_t rank() const { return rank_; }

 private:
  uint8_t reason_;
  uint16_t rank_;
};

// The switch is gone: it announced its shutdown or closed the control connection. Nothing more
// can go through it (an algorithm that does not need it, such as the ring, may take over).
class SwitchLostError : public AbortedError {
 public:
  // `lost`: the switch that is gone ("host:port" as this worker addresses it), when it is one of this
  // job's switches; "" when what is gone is behind it (a leaf's spine). A rank of a sharded job names
  // it when it leaves the job's other switches (LEAVE lost=), so that their aborts say why.
  SwitchLostError(const std::string& what, uint8_t reason, uint16_t rank, std::string lost = {})
      : AbortedError(what, reason, rank), lost_(std::move(lost)) {}
  const std::string& lost() const { return lost_; }

 private:
  std::string lost_;
};

// A bad argument detected before anything was sent (the group stays usable).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// An element type the library does not reduce.
class UnsupportedType : public Error {
 public:
  using Error::Error;
};

// Text for a gs_abort_reason, e.g. "rank 2 left the job" (worker/switch/switch_notice.cpp has the
// fuller one that uses what the switch says about the abort).
std::string abort_reason_text(uint8_t reason, uint16_t rank);

}  // namespace gradswitch::worker
