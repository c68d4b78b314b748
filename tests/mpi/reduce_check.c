/* An ordinary MPI program (it knows nothing of gradswitch), built with mpicc by the tests and run
 * with and without libgradswitch_mpi.so preloaded. It reduces float, double and int buffers in the
 * ways MPI programs do (MPI_Allreduce, MPI_Reduce to a non-zero root, MPI_Iallreduce completed by
 * MPI_Wait / MPI_Waitall / MPI_Test (also while other ranks sit in MPI_Barrier), MPI_IN_PLACE,
 * communicators from MPI_Comm_split, MPI_Comm_dup and MPI_Comm_create (ranks 1.., so a
 * communicator that rank 0 is not in), a small message, another op, another datatype, an
 * inter-communicator) and writes every result it holds to
 * OUTDIR/rank<R>.bin, so that the two runs can be compared.
 *
 *   mpirun -np 4 reduce_check OUTDIR [ELEMENTS]
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE* out;

static void put(const void* p, size_t bytes) {
  if (fwrite(p, 1, bytes, out) != bytes) {
    perror("reduce_check: write");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
}

/* Deterministic inputs that differ per rank and per call. */
static uint32_t next(uint32_t* s) {
  *s = *s * 1664525u + 1013904223u;
  return *s;
}
static void fill_float(float* v, int n, uint32_t seed) {
  for (int i = 0; i < n; ++i) v[i] = (float)((int32_t)next(&seed)) / 2147483648.0f;
}
static void fill_double(double* v, int n, uint32_t seed) {
  for (int i = 0; i < n; ++i) v[i] = (double)((int32_t)next(&seed)) / 2147483648.0 * 1e3;
}
static void fill_int(int* v, int n, uint32_t seed) {
  for (int i = 0; i < n; ++i) v[i] = (int32_t)next(&seed); /* wraps when summed: as MPI on this host */
}

/* The reductions on one communicator; `tag` makes inputs differ between communicators. */
static void reduce_on(MPI_Comm comm, int n, uint32_t tag) {
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  float* fs = malloc(n * sizeof *fs);
  float* fr = malloc(n * sizeof *fr);
  double* ds = malloc(n * sizeof *ds);
  double* dr = malloc(n * sizeof *dr);
  int* is = malloc(n * sizeof *is);
  int* ir = malloc(n * sizeof *ir);
  const uint32_t seed = tag * 7919u + (uint32_t)rank * 104729u;

  fill_float(fs, n, seed + 1);
  MPI_Allreduce(fs, fr, n, MPI_FLOAT, MPI_SUM, comm);
  put(fr, n * sizeof *fr);

  fill_double(ds, n, seed + 2);
  MPI_Allreduce(ds, dr, n, MPI_DOUBLE, MPI_SUM, comm);
  put(dr, n * sizeof *dr);

  fill_int(ir, n, seed + 3);
  MPI_Allreduce(MPI_IN_PLACE, ir, n, MPI_INT, MPI_SUM, comm);
  put(ir, n * sizeof *ir);

  /* MPI_Reduce to the last rank; the root reduces in place. Only the root holds a result. */
  const int root = size - 1;
  fill_int(is, n, seed + 4);
  if (rank == root) {
    memcpy(ir, is, n * sizeof *ir);
    MPI_Reduce(MPI_IN_PLACE, ir, n, MPI_INT, MPI_SUM, root, comm);
    put(ir, n * sizeof *ir);
  } else {
    MPI_Reduce(is, NULL, n, MPI_INT, MPI_SUM, root, comm);
  }
  fill_double(ds, n, seed + 5);
  MPI_Reduce(ds, rank == root ? dr : NULL, n, MPI_DOUBLE, MPI_SUM, root, comm);
  if (rank == root) put(dr, n * sizeof *dr);

  /* Two non-blocking reductions at once, completed together; then one completed by polling. */
  MPI_Request reqs[2];
  fill_float(fs, n, seed + 6);
  fill_int(is, n, seed + 7);
  MPI_Iallreduce(fs, fr, n, MPI_FLOAT, MPI_SUM, comm, &reqs[0]);
  MPI_Iallreduce(is, ir, n, MPI_INT, MPI_SUM, comm, &reqs[1]);
  MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE);
  put(fr, n * sizeof *fr);
  put(ir, n * sizeof *ir);
  fill_double(dr, n, seed + 8);
  MPI_Iallreduce(MPI_IN_PLACE, dr, n, MPI_DOUBLE, MPI_SUM, comm, &reqs[0]);
  int done = 0;
  while (!done) MPI_Test(&reqs[0], &done, MPI_STATUS_IGNORE);
  put(dr, n * sizeof *dr);
  fill_int(is, n, seed + 9);
  MPI_Iallreduce(is, ir, n, MPI_INT, MPI_SUM, comm, &reqs[0]);
  MPI_Wait(&reqs[0], MPI_STATUS_IGNORE);
  put(ir, n * sizeof *ir);

  /* Rank 0 waits for a non-blocking reduction while the others already sit in MPI_Barrier: MPI
   * progresses non-blocking collectives on their own, so this completes (and must through the switch). */
  fill_int(is, n, seed + 12);
  MPI_Iallreduce(is, ir, n, MPI_INT, MPI_SUM, comm, &reqs[0]);
  if (rank == 0) {
    MPI_Wait(&reqs[0], MPI_STATUS_IGNORE);
    MPI_Barrier(comm);
  } else {
    MPI_Barrier(comm);
    MPI_Wait(&reqs[0], MPI_STATUS_IGNORE);
  }
  put(ir, n * sizeof *ir);

  /* Below any sensible threshold, and an op the switch does not do: both stay with MPI. */
  fill_int(is, 16, seed + 10);
  MPI_Allreduce(is, ir, 16, MPI_INT, MPI_SUM, comm);
  put(ir, 16 * sizeof *ir);
  fill_int(is, n, seed + 11);
  MPI_Allreduce(is, ir, n, MPI_INT, MPI_MAX, comm);
  put(ir, n * sizeof *ir);

  free(fs), free(fr), free(ds), free(dr), free(is), free(ir);
}

/* What the library must leave to MPI even for a large MPI_SUM: a datatype the switch does not carry
 * (64-bit integers) and an inter-communicator (the halves of the world facing each other: each rank
 * gets the other half's sum). */
static void pass_through(int n, int rank) {
  long long* ls = malloc(n * sizeof *ls);
  long long* lr = malloc(n * sizeof *lr);
  int* is = malloc(n * sizeof *is);
  int* ir = malloc(n * sizeof *ir);
  for (int i = 0; i < n; ++i) ls[i] = (long long)i * 4000000007LL * (rank + 1); /* beyond 32 bits */
  MPI_Allreduce(ls, lr, n, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  put(lr, n * sizeof *lr);

  MPI_Comm half, inter;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
  /* Each half's leader is its lowest world rank (0 or 1); each names the other's. */
  MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, 1 - rank % 2, 99, &inter);
  fill_int(is, n, 6 * 7919u + (uint32_t)rank * 104729u);
  MPI_Allreduce(is, ir, n, MPI_INT, MPI_SUM, inter);
  put(ir, n * sizeof *ir);
  MPI_Comm_free(&inter);
  MPI_Comm_free(&half);
  free(ls), free(lr), free(is), free(ir);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  if (argc < 2) {
    fprintf(stderr, "usage: reduce_check OUTDIR [ELEMENTS]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int n = argc > 2 ? atoi(argv[2]) : 100000;
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char path[4096];
  snprintf(path, sizeof path, "%s/rank%d.bin", argv[1], rank);
  out = fopen(path, "wb");
  if (!out) {
    perror(path);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }

  reduce_on(MPI_COMM_WORLD, n, 1);

  MPI_Comm halves, copy;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &halves);
  reduce_on(halves, n, 2);
  MPI_Comm_dup(MPI_COMM_WORLD, &copy);
  reduce_on(copy, n, 3);
  MPI_Comm_free(&halves);
  MPI_Comm_free(&copy);
  reduce_on(MPI_COMM_WORLD, n, 4);

  /* MPI_Comm_create of every rank but 0 (3 of 4: not a power of two); rank 0 gets MPI_COMM_NULL. */
  MPI_Group world_group, tail_group;
  const int first_excluded[] = {0};
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_excl(world_group, 1, first_excluded, &tail_group);
  MPI_Comm tail;
  MPI_Comm_create(MPI_COMM_WORLD, tail_group, &tail);
  if (tail != MPI_COMM_NULL) {
    reduce_on(tail, n, 5);
    MPI_Comm_free(&tail);
  }
  MPI_Group_free(&tail_group);
  MPI_Group_free(&world_group);

  pass_through(n, rank);

  fclose(out);
  MPI_Finalize();
  return 0;
}
