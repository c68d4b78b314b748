// What the library keeps per communicator: whether its reductions go through the switch (decided
// once, collectively, at its first eligible reduction), its switch job (a worker::Group), a private
// duplicate for the library's own MPI calls, and the queue of reductions in flight with the helper
// thread that completes them.
//
// The helper thread finishes each op in order: it waits for the switch part, then agrees with the
// other ranks' helpers (MPI_MIN of one int on the private communicator) and, when some rank has no
// sum, redoes the reduction with PMPI. So a reduction never needs the program's thread to progress
// it (the library runs MPI at MPI_THREAD_MULTIPLE for this), and the agreements and fallbacks come
// in the same order on every rank.
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "mpi/config.h"
#include "mpi/counters.h"
#include "mpi/op.h"
#include "worker/group.h"

namespace gradswitch::mpi {

class CommState {
 public:
  // Collective over `comm`: every rank calls it inside the same reduction call. `can_use_switch`
  // is this rank's view (library active); the ranks agree on it, then join one switch job and agree
  // that all of them joined. On any failure the communicator stays with MPI; the lowest failing
  // rank reports it through `tally`.
  static std::unique_ptr<CommState> create(MPI_Comm comm, bool can_use_switch, const Config& cfg,
                                           Tally& tally);
  // Waits for the queue to drain, stops the helper, leaves the job, frees the private communicator.
  ~CommState();
  CommState(const CommState&) = delete;
  CommState& operator=(const CommState&) = delete;

  bool uses_switch() const { return helper_.joinable(); }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& job() const { return job_; }

  // Queues an op behind the others and starts its switch part at once (unless the switch failed).
  void enqueue(const std::shared_ptr<Op>& op);
  // Blocks until the helper completed `op`.
  void wait(const Op& op);
  bool idle();

  // The program freed the communicator: destroyed (by the runtime) once its queue has drained.
  bool freed = false;

 private:
  CommState(const Config& cfg, Tally& tally) : cfg_(cfg), tally_(tally) {}
  void helper_main();
  void finish(Op& op);
  void redo_by_mpi(Op& op);

  const Config& cfg_;
  Tally& tally_;
  int rank_ = 0, size_ = 0;
  MPI_Comm private_ = MPI_COMM_NULL;
  std::unique_ptr<worker::Group> group_;
  std::string job_;
  bool failed_ = false;  // helper thread only: the switch failed; MPI does the reductions from here on

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Op>> queue_;
  bool stopping_ = false;
  bool group_closed_ = false;  // under mu_: enqueue no longer starts switch parts
  std::thread helper_;
};

}  // namespace gradswitch::mpi
