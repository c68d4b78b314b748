// Completion signals of the DPDK switch (--notify, docs/dpdk.md): which allreduce of a job has
// completed, told to a host as the datagram of include/gradswitch/notify.h.
//
// Each aggregation thread records, per job, the latest seq whose RESULT it multicast
// (CompletionRecords: one writer, read under a seqlock). The main lcore looks at every thread's
// records now and then (CompletionMonitor::tick): a seq is complete when a newer seq of the job
// shows up (ranks start seq+1 only after receiving all of seq) or when the job has been quiet for
// the quiet time. Nothing here sends or reads a clock: the caller passes the time and a sender.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/seq.h"
#include "gradswitch/notify.h"

namespace gradswitch::dpdk {

class CompletionRecords {
 public:
  // One entry per engine job index (IngestResult::job_index < max_jobs <= 256): live jobs never
  // share one (job ids are random; their indices are dense).
  static constexpr unsigned kEntries = 256;

  struct Progress {
    uint32_t job_id = 0;  // 0: nothing recorded
    uint32_t seq = 0;
    uint64_t elements = 0;  // result elements multicast for `seq` by this thread
    uint64_t last_ns = 0;   // time of the latest of them
  };

  // The owning aggregation thread: a multicast RESULT of `count` elements of (job, seq) went out;
  // `index` is the job's engine index.
  void record(unsigned index, uint32_t job_id, uint32_t seq, uint16_t count, uint64_t now_ns);
  // Any thread: a consistent copy of entry `index` (retries while the owner writes it).
  Progress read(unsigned index) const;

 private:
  struct Entry {
    std::atomic<uint32_t> version{0};  // odd while the owner writes
    std::atomic<uint32_t> job_id{0}, seq{0};
    std::atomic<uint64_t> elements{0}, last_ns{0};
  };
  Entry entries_[kEntries];
};

class CompletionMonitor {
 public:
  explicit CompletionMonitor(uint64_t quiet_ns) : quiet_ns_(quiet_ns) {}
  // Sends every signal that is due (`send` returns false when it could not send, e.g. the
  // destination's MAC is still unknown: a quiet signal is then retried on the next tick).
  void tick(const std::vector<const CompletionRecords*>& threads, uint64_t now_ns,
            const std::function<bool(const gs_notify&)>& send);

 private:
  struct Signal {
    uint32_t job_id = 0;
    bool any = false;                    // a seq has been seen
    uint32_t seen = 0;                   // the latest seq seen
    uint64_t elements = 0, last_ns = 0;  // of `seen`
    bool pending = false;                // `seen` not yet signalled
  };
  uint64_t quiet_ns_;
  Signal signals_[CompletionRecords::kEntries];
};

}  // namespace gradswitch::dpdk
