// What the library keeps per communicator: whether its reductions go through the switch (decided
// once, collectively, at its first eligible reduction), its switch job (a worker::Group), a private
// duplicate for the library's own MPI calls, and the queue of reductions in flight.
#pragma once

#include <mpi.h>

#include <deque>
#include <memory>
#include <string>

#include "mpi/config.h"
#include "mpi/op.h"
#include "worker/group.h"

namespace gradswitch::mpi {

struct Counters;

class CommState {
 public:
  // Collective over `comm`: every rank calls it inside the same reduction call. `can_use_switch`
  // is this rank's view (library active, switch reachable at MPI_Init); the ranks agree on it, then
  // join one switch job and agree that all of them joined. On any failure the communicator stays
  // with MPI: `warning` is set on the lowest failing rank (the one that reports it).
  static std::unique_ptr<CommState> create(MPI_Comm comm, bool can_use_switch, const Config& cfg,
                                           std::string* warning);
  ~CommState();
  CommState(const CommState&) = delete;
  CommState& operator=(const CommState&) = delete;

  bool uses_switch() const { return group_ != nullptr || failed_; }
  bool failed() const { return failed_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm private_comm() const { return private_; }
  const std::string& job() const { return job_; }

  // Queues an op behind the others; starts its switch part at once unless the switch failed.
  void enqueue(std::shared_ptr<Op> op);
  bool idle() const { return queue_.empty(); }
  // Advances the queue in order (ops complete strictly in the order they were started, so the
  // agreement and fallback collectives on the private communicator come in the same order on
  // every rank). Returns true when anything moved. Sets `*warning` when this rank reports a
  // failure of the switch; bumps `counters` for completed ops.
  bool progress(const Config& cfg, Counters& counters, std::string* warning);
  // A handle of the oldest op whose switch part is running (to sleep on), or an empty one.
  worker::Handle running_handle() const;

  // The user freed the communicator: it is destroyed once its queue has drained.
  bool freed = false;

 private:
  CommState() = default;
  void start_fallback(Op& op);
  void fail();

  int rank_ = 0, size_ = 0;
  MPI_Comm private_ = MPI_COMM_NULL;
  std::unique_ptr<worker::Group> group_;
  FloatWire wire_ = FloatWire::kNative;
  std::string job_;
  bool failed_ = false;  // the switch failed for this communicator: MPI does its reductions
  std::deque<std::shared_ptr<Op>> queue_;
};

}  // namespace gradswitch::mpi
