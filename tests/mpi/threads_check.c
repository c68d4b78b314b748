/* An MPI_THREAD_MULTIPLE program (it knows nothing of gradswitch), built with mpicc by the tests: two
 * threads of every rank make the first reduction on two communicators at once, in opposite orders on
 * even and odd ranks. Both must complete (a library that made one communicator's switch job wait
 * behind the other's would hang here). Every rank checks its sums; the exit status says whether
 * they were right.
 *
 *   mpirun -np 4 threads_check [ELEMENTS]
 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct reduction {
  MPI_Comm comm;
  int n, tag, delay_ms;
  int* sum;
};

static void* reduce(void* arg) {
  struct reduction* r = arg;
  int rank;
  MPI_Comm_rank(r->comm, &rank);
  int* in = malloc(r->n * sizeof *in);
  for (int i = 0; i < r->n; ++i) in[i] = i * (rank + 1) + r->tag;
  usleep(r->delay_ms * 1000);
  MPI_Allreduce(in, r->sum, r->n, MPI_INT, MPI_SUM, r->comm);
  free(in);
  return NULL;
}

int main(int argc, char** argv) {
  int provided, rank, size;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    fprintf(stderr, "threads_check: MPI_THREAD_MULTIPLE is not provided\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int n = argc > 1 ? atoi(argv[1]) : 100000;
  struct reduction r[2];
  pthread_t threads[2];
  for (int k = 0; k < 2; ++k) {
    MPI_Comm_dup(MPI_COMM_WORLD, &r[k].comm);
    r[k].n = n;
    r[k].tag = k + 1;
    r[k].delay_ms = k == rank % 2 ? 0 : 300; /* even ranks start on the first, odd on the second */
    r[k].sum = malloc(n * sizeof(int));
  }
  for (int k = 0; k < 2; ++k) pthread_create(&threads[k], NULL, reduce, &r[k]);
  for (int k = 0; k < 2; ++k) pthread_join(threads[k], NULL);
  long wrong = 0;
  for (int k = 0; k < 2; ++k) {
    for (int i = 0; i < n; ++i) wrong += r[k].sum[i] != i * (size * (size + 1) / 2) + size * r[k].tag;
    MPI_Comm_free(&r[k].comm);
    free(r[k].sum);
  }
  if (wrong) fprintf(stderr, "threads_check: rank %d: %ld wrong sums\n", rank, wrong);
  MPI_Finalize();
  return wrong != 0;
}
