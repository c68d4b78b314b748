// Errors raised by the worker library. The Python bindings map each class to an exception:
// Error -> GradswitchError, TimeoutError -> GradswitchTimeout, AbortedError -> JobAborted,
// InvalidArgument -> ValueError, UnsupportedType -> TypeError.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

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

// Text for a gs_abort_reason, e.g. "rank 2 left the job".
std::string abort_reason_text(uint8_t reason, uint16_t rank);

}  // namespace gradswitch::worker
