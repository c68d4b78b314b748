// The engine seen from outside the data path: readers on other threads (the metrics endpoint), the
// latency histograms, abort counts and open rounds (what `gradswitch status` and the metrics show).
#include <algorithm>
#include <chrono>
#include <thread>

#include "common/seq.h"
#include "switch/engine/engine.h"
#include "switch/engine/job.h"

namespace gradswitch {

Engine::ReadGuard::ReadGuard(const Engine& e) : e_(e) {
  e_.reader_mu_.lock();
  e_.reader_seq_.fetch_add(1, std::memory_order_seq_cst);
}

Engine::ReadGuard::~ReadGuard() {
  e_.reader_seq_.fetch_add(1, std::memory_order_release);
  e_.reader_mu_.unlock();
}

void Engine::wait_for_readers() const {
  // As for data threads: a reader inside its guard may hold the job just unpublished; one that
  // enters later cannot find it.
  const uint64_t seen = reader_seq_.load(std::memory_order_seq_cst);
  if (seen & 1)
    while (reader_seq_.load(std::memory_order_seq_cst) == seen)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
}

LatencyValues Engine::total_round_times() const {
  LatencyValues v;
  for (unsigned t = 0; t < config_.threads; ++t) v += threads_[t].round_times.read();
  return v;
}

LatencyValues Engine::total_allreduce_times() const {
  LatencyValues v;
  for (unsigned t = 0; t < config_.threads; ++t) v += threads_[t].allreduce_times.read();
  return v;
}

bool Engine::job_latency(uint32_t job_id, LatencyValues* rounds, LatencyValues* allreduces) const {
  Job* job = find_job(job_id);
  if (!job) return false;
  *rounds = LatencyValues{};
  *allreduces = LatencyValues{};
  for (unsigned t = 0; t < config_.threads; ++t) {
    *rounds += job->per_thread[t].round_times.read();
    *allreduces += job->per_thread[t].allreduce_times.read();
  }
  return true;
}

std::array<uint64_t, Engine::kAbortReasons> Engine::aborts() const {
  std::array<uint64_t, kAbortReasons> out{};
  for (size_t i = 0; i < kAbortReasons; ++i) out[i] = aborts_[i].load(std::memory_order_relaxed);
  return out;
}

bool Engine::open_rounds(uint32_t job_id, std::vector<OpenRound>* out) const {
  Job* job = find_job(job_id);
  if (!job) return false;
  out->clear();
  for (uint16_t s = 0; s < job->spec.slots; ++s)
    for (uint8_t v = 0; v < 2; ++v) {
      const SlotVersion& sv = job->slots[s].version[v];
      if (sv.state.load(std::memory_order_relaxed) != RoundState::kOpen) continue;
      OpenRound r;
      r.slot = s;
      r.version = v;
      r.seq = sv.seq.load(std::memory_order_relaxed);
      r.offset = sv.offset.load(std::memory_order_relaxed);
      r.seen = sv.seen.load(std::memory_order_relaxed);
      r.opened_ns = sv.opened_ns.load(std::memory_order_relaxed);
      out->push_back(r);
    }
  std::sort(out->begin(), out->end(), [](const OpenRound& a, const OpenRound& b) {
    return a.opened_ns != b.opened_ns ? a.opened_ns < b.opened_ns
                                      : round_is_newer(b.seq, b.offset, a.seq, a.offset);
  });
  return true;
}

}  // namespace gradswitch
