// The leaf's upward loss timers (see uplink_timers.h).
#include "switch/uplink/uplink_timers.h"

#include <algorithm>

namespace gradswitch {

UplinkTimers::JobTimers& UplinkTimers::job(uint32_t job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) it = jobs_.emplace(job_id, JobTimers(rto_min_ns_, rto_max_ns_)).first;
  return it->second;
}

void UplinkTimers::sent(uint32_t job_id, uint16_t slot, int64_t now_ns) {
  JobTimers& j = job(job_id);
  if (j.timers.size() <= slot) j.timers.resize(size_t{slot} + 1);  // grows to the job's pool once
  j.loss.launch(j.timers[slot], now_ns);
  j.last_sent_ns = now_ns;
  next_deadline_ = std::min(next_deadline_, j.timers[slot].deadline_ns);
}

void UplinkTimers::delivered(uint32_t job_id, uint16_t slot, int64_t now_ns) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.timers.size() <= slot || !it->second.timers[slot].busy) return;
  it->second.loss.delivered(it->second.timers[slot], now_ns);
}

int64_t UplinkTimers::fire(int64_t now_ns, const std::function<Resend(uint32_t, uint16_t)>& resend) {
  int64_t next = INT64_MAX;
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    JobTimers& j = it->second;
    due_.clear();
    int64_t job_next = j.loss.scan(j.timers.data(), j.timers.size(), now_ns, &due_);
    bool gone = false;
    for (unsigned slot : due_) {
      const Resend what = resend(it->first, static_cast<uint16_t>(slot));
      if (what == Resend::kNoJob) {
        gone = true;
        break;
      }
      if (what == Resend::kNoRound) j.timers[slot].busy = false;  // answered meanwhile, or aborted
    }
    const bool idle = std::none_of(j.timers.begin(), j.timers.end(), [](auto& t) { return t.busy; });
    // A job that has sent nothing for a while has probably ended: forget it (should it come back,
    // its RTT estimate starts afresh).
    if (gone || (idle && now_ns - j.last_sent_ns > kForgetNs)) {
      it = jobs_.erase(it);
      continue;
    }
    if (idle) {
      ++it;
      continue;
    }
    next = std::min(next, job_next);
    ++it;
  }
  next_deadline_ = next;
  return next;
}

}  // namespace gradswitch
