// The deadlines of a data thread's open rounds in jobs with bounded-time rounds (docs/protocol.md
// §3.1): the engine has no clock, so the backend's loop keeps each round's deadline here and, when
// one passes, asks the engine to close that round (Engine::close_overdue). One per data thread,
// touched only by it. A round that completed before its deadline stays queued until then; the
// engine answers it with nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

namespace gradswitch {

class RoundDeadlines {
 public:
  struct Due {
    uint64_t at_ns;
    uint32_t job_id, seq, offset;
    uint16_t slot;
    uint8_t version;
    bool operator>(const Due& o) const { return at_ns > o.at_ns; }
  };
  void add(const Due& d) { heap_.push(d); }
  // The earliest deadline, INT64_MAX when none waits.
  int64_t next() const { return heap_.empty() ? INT64_MAX : static_cast<int64_t>(heap_.top().at_ns); }
  // Hands every deadline at or before `now_ns` to `close`, earliest first.
  void fire(uint64_t now_ns, const std::function<void(const Due&)>& close) {
    while (!heap_.empty() && heap_.top().at_ns <= now_ns) {
      const Due d = heap_.top();
      heap_.pop();
      close(d);
    }
  }

 private:
  std::priority_queue<Due, std::vector<Due>, std::greater<Due>> heap_;
};

}  // namespace gradswitch
