// Completion tracking and signals (completion.h).
#include "switch/io/dpdk/completion.h"

#include <algorithm>

namespace gradswitch::dpdk {
namespace {

gs_notify make_signal(uint8_t reason, uint32_t job_id, uint32_t seq, uint64_t elements, uint64_t last_ns) {
  gs_notify n{};
  n.magic = GS_NOTIFY_MAGIC;
  n.version = GS_NOTIFY_VERSION;
  n.reason = reason;
  n.job_id = job_id;
  n.seq = seq;
  n.elements = elements;
  n.last_result_ns = last_ns;
  return n;
}

// The job's latest seq over every aggregation thread's entry `index`, with its elements and the
// time of its latest result. job_id 0 when no thread recorded anything.
CompletionRecords::Progress latest_over_threads(const std::vector<const CompletionRecords*>& threads,
                                                unsigned index) {
  CompletionRecords::Progress best;
  for (const CompletionRecords* t : threads) {
    const CompletionRecords::Progress p = t->read(index);
    if (p.job_id == 0) continue;
    if (best.job_id == 0 || (p.job_id != best.job_id && p.last_ns > best.last_ns)) {
      best = p;  // first entry, or a newer job reused the index
      continue;
    }
    if (p.job_id != best.job_id) continue;
    if (seq_after(p.seq, best.seq)) {
      best.seq = p.seq;
      best.elements = p.elements;
    } else if (p.seq == best.seq) {
      best.elements += p.elements;
    }
    best.last_ns = std::max(best.last_ns, p.last_ns);
  }
  return best;
}

}  // namespace

void CompletionRecords::record(unsigned index, uint32_t job_id, uint32_t seq, uint16_t count,
                               uint64_t now_ns) {
  Entry& e = entries_[index % kEntries];
  const uint32_t v = e.version.load(std::memory_order_relaxed);
  e.version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  const uint32_t held = e.seq.load(std::memory_order_relaxed);
  if (e.job_id.load(std::memory_order_relaxed) != job_id || seq_after(seq, held)) {
    e.job_id.store(job_id, std::memory_order_relaxed);
    e.seq.store(seq, std::memory_order_relaxed);
    e.elements.store(count, std::memory_order_relaxed);
  } else if (seq == held) {
    e.elements.store(e.elements.load(std::memory_order_relaxed) + count, std::memory_order_relaxed);
  }
  e.last_ns.store(now_ns, std::memory_order_relaxed);
  e.version.store(v + 2, std::memory_order_release);
}

CompletionRecords::Progress CompletionRecords::read(unsigned index) const {
  const Entry& e = entries_[index % kEntries];
  Progress p;
  for (int tries = 0; tries < 100; ++tries) {
    const uint32_t v0 = e.version.load(std::memory_order_acquire);
    p.job_id = e.job_id.load(std::memory_order_relaxed);
    p.seq = e.seq.load(std::memory_order_relaxed);
    p.elements = e.elements.load(std::memory_order_relaxed);
    p.last_ns = e.last_ns.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (!(v0 & 1) && e.version.load(std::memory_order_relaxed) == v0) break;
  }
  return p;
}

void CompletionMonitor::tick(const std::vector<const CompletionRecords*>& threads, uint64_t now_ns,
                             const std::function<bool(const gs_notify&)>& send) {
  for (unsigned index = 0; index < CompletionRecords::kEntries; ++index) {
    const CompletionRecords::Progress p = latest_over_threads(threads, index);
    if (p.job_id == 0) continue;
    Signal& sg = signals_[index];
    if (sg.job_id != p.job_id) {
      sg = Signal{};
      sg.job_id = p.job_id;
    }
    if (!sg.any || seq_after(p.seq, sg.seen)) {
      // A newer seq started: everything before it is complete.
      if (sg.pending) send(make_signal(GS_NOTIFY_NEWER_SEQ, sg.job_id, sg.seen, sg.elements, sg.last_ns));
      sg.any = true;
      sg.seen = p.seq;
      sg.pending = true;
    }
    if (p.seq == sg.seen) {
      sg.elements = p.elements;
      sg.last_ns = p.last_ns;
    }
    // (Written this way round: another lcore's clock may be a little ahead of `now_ns`.)
    if (sg.pending && now_ns >= sg.last_ns + quiet_ns_ &&
        send(make_signal(GS_NOTIFY_QUIET, sg.job_id, sg.seen, sg.elements, sg.last_ns)))
      sg.pending = false;
  }
}

}  // namespace gradswitch::dpdk
