// The MPI functions this library defines in place of Open MPI's (loaded with LD_PRELOAD, they
// come first): initialisation, finalisation and the reductions it can take over. Everything not
// taken over goes to the PMPI_ function unchanged. docs/mpi.md says what is intercepted.
#include <mpi.h>

#include <string>

#include "mpi/runtime.h"

using gradswitch::mpi::Call;
using gradswitch::mpi::CommState;
using gradswitch::mpi::Op;
using gradswitch::mpi::Runtime;

extern "C" {

int MPI_Init(int* argc, char*** argv) {
  int rc = PMPI_Init(argc, argv);
  return rc == MPI_SUCCESS ? Runtime::get().on_init() : rc;
}

int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  int rc = PMPI_Init_thread(argc, argv, required, provided);
  return rc == MPI_SUCCESS ? Runtime::get().on_init() : rc;
}

int MPI_Finalize(void) {
  Runtime::get().on_finalize();
  return PMPI_Finalize();
}

int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op,
                  MPI_Comm comm) {
  Call c{Op::Kind::kAllreduce, sendbuf, recvbuf, count, type, op, 0, comm};
  Runtime& rt = Runtime::get();
  if (CommState* cs = rt.route(c)) return rt.run_blocking(*cs, c);
  return PMPI_Allreduce(sendbuf, recvbuf, count, type, op, comm);
}

int MPI_Reduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op, int root,
               MPI_Comm comm) {
  Call c{Op::Kind::kReduce, sendbuf, recvbuf, count, type, op, root, comm};
  Runtime& rt = Runtime::get();
  if (CommState* cs = rt.route(c)) return rt.run_blocking(*cs, c);
  return PMPI_Reduce(sendbuf, recvbuf, count, type, op, root, comm);
}

int MPI_Iallreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                   MPI_Request* request) {
  Call c{Op::Kind::kIallreduce, sendbuf, recvbuf, count, type, op, 0, comm};
  Runtime& rt = Runtime::get();
  if (CommState* cs = rt.route(c)) return rt.start(*cs, c, request);
  return PMPI_Iallreduce(sendbuf, recvbuf, count, type, op, comm, request);
}

// The counters of this process as one line of JSON (docs/mpi.md); valid until the next call
// from the same thread. For programs that want to check in-process that the switch is in use.
const char* gradswitch_mpi_stats(void) {
  thread_local std::string s;
  s = Runtime::get().stats_json();
  return s.c_str();
}

}  // extern "C"
