// The library's process-wide state: settings, counters, the communicators it knows, and the
// two ways a reduction runs through the switch (blocking, and as a generalized request).
//
// Locking: one mutex guards everything here. It is held while the library works and released
// while it waits (for the switch, or for MPI to progress), so other threads' MPI calls proceed.
#pragma once

#include <mpi.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "mpi/comm_state.h"
#include "mpi/config.h"
#include "mpi/counters.h"
#include "mpi/op.h"

namespace gradswitch::mpi {

// One intercepted reduction call as the program made it.
struct Call {
  Op::Kind kind;
  const void* sendbuf;
  void* recvbuf;
  int count;
  MPI_Datatype type;
  MPI_Op op;
  int root;  // MPI_Reduce only
  MPI_Comm comm;
};

class Runtime {
 public:
  static Runtime& get();

  // Right after PMPI_Init/PMPI_Init_thread succeeded: reads the settings and checks, on every
  // rank, that the switch answers (collective over MPI_COMM_WORLD). Returns an MPI error code
  // (strict mode only; MPI_SUCCESS otherwise).
  int on_init();
  // Right before PMPI_Finalize: completes what is in flight, leaves every switch job, reports.
  void on_finalize();

  // The communicator state when this call should go through the switch (creating it, collectively,
  // on the communicator's first eligible call), else nullptr: the caller hands the call to PMPI.
  CommState* route(const Call& c);
  // Runs a routed call to completion; returns its MPI result code.
  int run_blocking(CommState& cs, const Call& c);
  // Starts a routed MPI_Iallreduce; `*request` completes through MPI_Wait/MPI_Test.
  int start(CommState& cs, const Call& c, MPI_Request* request);

  // ---- used by the request functions (requests.cpp)
  // Whether any reduction of the library is in flight (then waits must keep it moving).
  bool busy();
  // Advances every queue once; true when anything moved.
  bool progress_all();
  // Sleeps a little (on a running switch part if there is one) with the lock released.
  void idle();
  // True when `request` is one of the library's (an MPI_Iallreduce through the switch).
  bool owns(MPI_Request request);
  // Blocks (keeping everything moving) until the library's `request` is complete.
  void wait_owned(MPI_Request request);

  // A communicator the program freed (attribute delete callback).
  void forget(MPI_Comm comm, CommState* state);

  std::string stats_json();

 private:
  Runtime() = default;
  std::shared_ptr<Op> make_op(const Call& c);
  void wait_op(const std::shared_ptr<Op>& op, std::unique_lock<std::mutex>& lk);
  worker::Handle running_locked();
  static void sleep_on(const worker::Handle& running);
  bool progress_locked();
  void report(const std::string& warning);
  void write_stats();

  std::mutex mu_;
  Config cfg_;
  bool active_ = false;  // settings usable and the switch answered every rank at MPI_Init
  bool finalized_ = false;
  bool warned_ = false;  // one warning per process
  int world_rank_ = 0;
  int keyval_ = MPI_KEYVAL_INVALID;
  Counters counters_;
  std::vector<std::unique_ptr<CommState>> comms_;
  std::unordered_map<MPI_Request, std::shared_ptr<Op>> requests_;
};

}  // namespace gradswitch::mpi
