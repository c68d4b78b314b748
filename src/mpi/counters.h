// What the library did in this process, so that a user can see it is in use (docs/mpi.md):
// printed or written at MPI_Finalize with GRADSWITCH_MPI_STATS, and readable in-process through
// gradswitch_mpi_stats().
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

namespace gradswitch::mpi {

struct Op;

struct Counters {
  uint64_t allreduce = 0, reduce = 0, iallreduce = 0;  // reductions summed by the switch
  uint64_t switch_bytes = 0;                           // their bytes (per rank)
  uint64_t mpi_small = 0;                              // left to MPI: below GRADSWITCH_MPI_MIN_BYTES
  uint64_t mpi_other = 0;      // left to MPI: another op or datatype, an inter-communicator, 1 or > 64 ranks
  uint64_t mpi_no_switch = 0;  // left to MPI: the library is inactive, or the communicator has no switch job
  uint64_t mpi_fallback = 0;   // the switch failed during the reduction; MPI redid it
  uint64_t jobs = 0;           // switch jobs joined (one per communicator that reduced through the switch)

  uint64_t by_switch() const { return allreduce + reduce + iallreduce; }
  // {"allreduce": 1, ...} (one line, no spaces)
  std::string json(int world_rank) const;
  // A sentence for people, e.g. "rank 0: 12 reductions through the switch (...)".
  std::string text(int world_rank, size_t min_bytes) const;
};

// The counters and the one warning, shared by the program's threads and the helper threads.
class Tally {
 public:
  void set_rank(int world_rank, bool strict);
  // Counts a completed op (by the switch, or by MPI after a failure).
  void done(const Op& op);
  template <typename F>
  void bump(F field) {
    std::lock_guard<std::mutex> lk(mu_);
    ++(c_.*field);
  }
  Counters snapshot();
  int world_rank() const { return world_rank_; }
  // Prints the process's first warning on stderr (strict mode: every error).
  void warn(const std::string& message);

 private:
  std::mutex mu_;
  Counters c_;
  int world_rank_ = 0;
  bool strict_ = false;
  bool warned_ = false;
};

}  // namespace gradswitch::mpi
