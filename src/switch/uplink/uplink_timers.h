// Loss recovery of what a leaf switch sends up to its spine (docs/protocol.md §8). The leaf is, to
// the spine, a worker whose window is its job's slot pool: per job, one RoundTimer per slot and the
// worker's own LossDetector (RTT estimate, RACK, single probes), so the two levels recover loss by
// the same rules. The engine keeps the packets; this unit only says when one goes again. One per
// data thread, touched only by it (it sees the slots that thread owns).
#pragma once

#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "common/loss_detector.h"

namespace gradswitch {

class UplinkTimers {
 public:
  UplinkTimers(int64_t rto_min_ns, int64_t rto_max_ns) : rto_min_ns_(rto_min_ns), rto_max_ns_(rto_max_ns) {}

  // A round of `slot` went up for the first time.
  void sent(uint32_t job_id, uint16_t slot, int64_t now_ns);
  // The spine's result for `slot` arrived.
  void delivered(uint32_t job_id, uint16_t slot, int64_t now_ns);

  // What the engine says when asked to resend a slot's round.
  enum class Resend { kSent, kNoRound, kNoJob };
  // Resends (through `resend`) every round whose time has come; returns the earliest deadline of the
  // rounds still waiting (INT64_MAX when none is).
  int64_t fire(int64_t now_ns, const std::function<Resend(uint32_t job_id, uint16_t slot)>& resend);
  // The earliest deadline (INT64_MAX when nothing waits).
  int64_t next_deadline() const { return next_deadline_; }

 private:
  struct JobTimers {
    explicit JobTimers(int64_t rto_min, int64_t rto_max) : loss(rto_min, rto_max) {}
    LossDetector loss;
    std::vector<RoundTimer> timers;  // by slot
    int64_t last_sent_ns = 0;
  };
  static constexpr int64_t kForgetNs = 30'000'000'000;
  JobTimers& job(uint32_t job_id);

  int64_t rto_min_ns_, rto_max_ns_;
  std::unordered_map<uint32_t, JobTimers> jobs_;
  std::vector<unsigned> due_;
  int64_t next_deadline_ = INT64_MAX;
};

}  // namespace gradswitch
