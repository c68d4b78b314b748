// The library's process-wide state: settings, counters, the communicators it knows, and running a
// reduction through the switch (blocking, or as a generalized request for MPI_Iallreduce).
//
// Threads: the library asks MPI for MPI_THREAD_MULTIPLE (the program sees the level it asked for),
// so that each communicator's helper thread can run the library's own MPI calls (comm_state.h).
// One mutex guards the registry of communicators; waits happen outside it.
#pragma once

#include <mpi.h>

#include <memory>
#include <mutex>
#include <string>
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

  // Before PMPI_Init*: the thread level to ask MPI for, given what the program asked for.
  int thread_level_for(int requested);
  // Right after PMPI_Init/PMPI_Init_thread succeeded (`provided`: what MPI gave): checks, on every
  // rank, that the switch answers (collective over MPI_COMM_WORLD). Returns an MPI error code
  // (strict mode only; MPI_SUCCESS otherwise).
  int on_init(int provided);
  // What MPI_Init_thread / MPI_Query_thread report to the program: the level it asked for, at most
  // what MPI gave.
  int program_thread_level() const { return program_level_; }
  // Right before PMPI_Finalize: completes what is in flight, leaves every switch job, reports.
  void on_finalize();

  // The communicator state when this call should go through the switch (creating it, collectively,
  // on the communicator's first eligible call), else nullptr: the caller hands the call to PMPI.
  CommState* route(const Call& c);
  // Runs a routed call to completion; returns its MPI result code.
  int run_blocking(CommState& cs, const Call& c);
  // Starts a routed MPI_Iallreduce; `*request` is a generalized request the helper completes.
  int start(CommState& cs, const Call& c, MPI_Request* request);

  // A communicator the program freed (attribute delete callback).
  void forget(CommState* state);

  std::string stats_json();

 private:
  Runtime() = default;
  std::shared_ptr<Op> make_op(const CommState& cs, const Call& c);
  void retire_freed();
  void write_stats();

  std::mutex mu_;
  Config cfg_;
  Tally tally_;
  bool active_ = false;  // settings usable, MPI_THREAD_MULTIPLE, and the switch answered every rank
  bool finalized_ = false;
  int program_level_ = MPI_THREAD_SINGLE;
  int keyval_ = MPI_KEYVAL_INVALID;
  std::vector<std::unique_ptr<CommState>> comms_;
};

}  // namespace gradswitch::mpi
