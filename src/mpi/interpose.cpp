// The MPI functions this library defines in place of Open MPI's (loaded with LD_PRELOAD, they
// come first): initialisation, finalisation and the reductions it can take over. Everything not
// taken over goes to the PMPI_ function unchanged. docs/mpi.md says what is intercepted.
#include <mpi.h>

#include <algorithm>
#include <string>

#include "mpi/runtime.h"

using gradswitch::mpi::Call;
using gradswitch::mpi::CommState;
using gradswitch::mpi::Op;
using gradswitch::mpi::Runtime;

extern "C" {

int MPI_Init(int* argc, char*** argv) {
  Runtime& rt = Runtime::get();
  const int level = rt.thread_level_for(MPI_THREAD_SINGLE);
  int provided = MPI_THREAD_SINGLE;
  int rc =
      level == MPI_THREAD_SINGLE ? PMPI_Init(argc, argv) : PMPI_Init_thread(argc, argv, level, &provided);
  return rc == MPI_SUCCESS ? rt.on_init(provided) : rc;
}

int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  Runtime& rt = Runtime::get();
  int rc = PMPI_Init_thread(argc, argv, rt.thread_level_for(required), provided);
  if (rc != MPI_SUCCESS) return rc;
  rc = rt.on_init(*provided);
  *provided = rt.program_thread_level();
  return rc;
}

int MPI_Query_thread(int* provided) {
  int rc = PMPI_Query_thread(provided);
  if (rc == MPI_SUCCESS) *provided = std::min(*provided, Runtime::get().program_thread_level());
  return rc;
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
