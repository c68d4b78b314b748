// MPI_Wait / MPI_Test and their array forms. An MPI_Iallreduce through the switch is a generalized
// request that the library completes itself; and while any of its reductions is in flight, every
// wait keeps them moving (their agreement and any fallback are MPI requests of the library's that
// only progress inside MPI calls), so that a rank blocked here never holds up the other ranks.
#include <mpi.h>

#include "mpi/runtime.h"

using gradswitch::mpi::Runtime;

extern "C" {

int MPI_Wait(MPI_Request* request, MPI_Status* status) {
  Runtime& rt = Runtime::get();
  if (request && rt.owns(*request)) rt.wait_owned(*request);
  while (rt.busy()) {
    rt.progress_all();
    int flag = 0, rc = PMPI_Test(request, &flag, status);
    if (rc != MPI_SUCCESS || flag) return rc;
    rt.idle();
  }
  return PMPI_Wait(request, status);
}

int MPI_Waitall(int count, MPI_Request requests[], MPI_Status statuses[]) {
  Runtime& rt = Runtime::get();
  while (rt.busy()) {
    rt.progress_all();
    int flag = 0, rc = PMPI_Testall(count, requests, &flag, statuses);
    if (rc != MPI_SUCCESS || flag) return rc;
    rt.idle();
  }
  return PMPI_Waitall(count, requests, statuses);
}

int MPI_Waitany(int count, MPI_Request requests[], int* index, MPI_Status* status) {
  Runtime& rt = Runtime::get();
  while (rt.busy()) {
    rt.progress_all();
    int flag = 0, rc = PMPI_Testany(count, requests, index, &flag, status);
    if (rc != MPI_SUCCESS || flag) return rc;
    rt.idle();
  }
  return PMPI_Waitany(count, requests, index, status);
}

int MPI_Waitsome(int incount, MPI_Request requests[], int* outcount, int indices[], MPI_Status statuses[]) {
  Runtime& rt = Runtime::get();
  while (rt.busy()) {
    rt.progress_all();
    int rc = PMPI_Testsome(incount, requests, outcount, indices, statuses);
    if (rc != MPI_SUCCESS || *outcount != 0) return rc;  // MPI_UNDEFINED: no active request
    rt.idle();
  }
  return PMPI_Waitsome(incount, requests, outcount, indices, statuses);
}

int MPI_Test(MPI_Request* request, int* flag, MPI_Status* status) {
  Runtime::get().progress_all();
  return PMPI_Test(request, flag, status);
}

int MPI_Testall(int count, MPI_Request requests[], int* flag, MPI_Status statuses[]) {
  Runtime::get().progress_all();
  return PMPI_Testall(count, requests, flag, statuses);
}

int MPI_Testany(int count, MPI_Request requests[], int* index, int* flag, MPI_Status* status) {
  Runtime::get().progress_all();
  return PMPI_Testany(count, requests, index, flag, status);
}

int MPI_Testsome(int incount, MPI_Request requests[], int* outcount, int indices[], MPI_Status statuses[]) {
  Runtime::get().progress_all();
  return PMPI_Testsome(incount, requests, outcount, indices, statuses);
}

int MPI_Request_get_status(MPI_Request request, int* flag, MPI_Status* status) {
  Runtime::get().progress_all();
  return PMPI_Request_get_status(request, flag, status);
}

}  // extern "C"
