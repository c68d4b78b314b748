// Counters of the library and its one warning (see counters.h).
#include "mpi/counters.h"

#include <cstdio>

#include "mpi/op.h"

namespace gradswitch::mpi {

std::string Counters::json(int world_rank) const {
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "{\"rank\":%d,\"allreduce\":%llu,\"reduce\":%llu,\"iallreduce\":%llu,\"switch_bytes\":%llu,"
      "\"mpi_small\":%llu,\"mpi_other\":%llu,\"mpi_no_switch\":%llu,\"mpi_fallback\":%llu,\"jobs\":%llu}",
      world_rank, (unsigned long long)allreduce, (unsigned long long)reduce, (unsigned long long)iallreduce,
      (unsigned long long)switch_bytes, (unsigned long long)mpi_small, (unsigned long long)mpi_other,
      (unsigned long long)mpi_no_switch, (unsigned long long)mpi_fallback, (unsigned long long)jobs);
  return buf;
}

std::string Counters::text(int world_rank, size_t min_bytes) const {
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "rank %d: %llu reductions through the switch (allreduce %llu, reduce %llu, iallreduce %llu; "
                "%.1f MB), %llu by MPI (below %zu bytes %llu, other op/type/communicator %llu, no switch job "
                "%llu, fallback after a switch failure %llu); %llu switch job(s)",
                world_rank, (unsigned long long)by_switch(), (unsigned long long)allreduce,
                (unsigned long long)reduce, (unsigned long long)iallreduce, switch_bytes / 1e6,
                (unsigned long long)(mpi_small + mpi_other + mpi_no_switch + mpi_fallback), min_bytes,
                (unsigned long long)mpi_small, (unsigned long long)mpi_other,
                (unsigned long long)mpi_no_switch, (unsigned long long)mpi_fallback,
                (unsigned long long)jobs);
  return buf;
}

void Tally::set_rank(int world_rank, bool strict) {
  std::lock_guard<std::mutex> lk(mu_);
  world_rank_ = world_rank;
  strict_ = strict;
}

void Tally::done(const Op& op) {
  std::lock_guard<std::mutex> lk(mu_);
  if (op.by_switch) {
    (op.kind == Op::Kind::kAllreduce ? c_.allreduce
     : op.kind == Op::Kind::kReduce  ? c_.reduce
                                     : c_.iallreduce)++;
    c_.switch_bytes += op.bytes();
  } else if (!op.strict_error) {
    c_.mpi_fallback++;
  }
}

Counters Tally::snapshot() {
  std::lock_guard<std::mutex> lk(mu_);
  return c_;
}

void Tally::warn(const std::string& message) {
  std::lock_guard<std::mutex> lk(mu_);
  if (strict_) {
    std::fprintf(stderr, "gradswitch-mpi: rank %d: error (GRADSWITCH_MPI_STRICT=1): %s\n", world_rank_,
                 message.c_str());
    return;
  }
  if (warned_) return;
  warned_ = true;
  std::fprintf(stderr, "gradswitch-mpi: rank %d: warning: %s\n", world_rank_, message.c_str());
}

}  // namespace gradswitch::mpi
