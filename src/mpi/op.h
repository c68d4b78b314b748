// One reduction the library took over, from its start to its completion (docs/mpi.md, "How a
// reduction runs"): the switch part on the communicator's group, then a one-integer agreement
// among the ranks on whether every rank got its sum, then — only when some rank did not — the same
// reduction by MPI.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "mpi/datatypes.h"
#include "worker/group.h"

namespace gradswitch::mpi {

struct Op {
  enum class Kind : uint8_t { kAllreduce, kReduce, kIallreduce };

  Kind kind = Kind::kAllreduce;
  MPI_Comm comm = MPI_COMM_NULL;  // the program's communicator (its error handler reports strict failures)
  // The contribution (the user's sendbuf, or `saved` for MPI_IN_PLACE): never written, so that
  // MPI can redo the reduction from it. The sum goes to `output` (nullptr: MPI_Reduce at a non-root).
  const void* input = nullptr;
  void* output = nullptr;
  int count = 0;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  int root = 0;
  Elem elem = Elem::kNone;
  std::vector<uint8_t> saved;

  bool submitted = false;  // the switch part was queued on the group
  worker::Handle handle;
  MPI_Request user_req = MPI_REQUEST_NULL;  // MPI_Iallreduce: the generalized request handed out

  // Set by the communicator's helper thread when the op is complete.
  std::string error;          // why the switch part failed on this rank ("" = it succeeded)
  bool by_switch = false;     // the switch's sum (true) or MPI's (false)
  bool strict_error = false;  // GRADSWITCH_MPI_STRICT: failed, reported as an error
  bool done = false;

  size_t bytes() const { return static_cast<size_t>(count) * elem_bytes(elem); }
};

}  // namespace gradswitch::mpi
