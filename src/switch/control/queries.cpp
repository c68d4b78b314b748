// What the control plane tells about jobs and counters: STATUS, STATS and JOBS, and the texts of
// abort reasons and mismatches that events and log lines share with them.
#include <algorithm>
#include <string>

#include "switch/control/control_plane.h"
#include "switch/control/control_state.h"

namespace gradswitch {

namespace control {

const char* abort_reason_name(uint8_t r) {
  switch (r) {
    case 0:
      return "none";
    case GS_ABORT_RANK_LEFT:
      return "rank_left";
    case GS_ABORT_IDLE:
      return "idle";
    case GS_ABORT_SHUTDOWN:
      return "shutdown";
    case GS_ABORT_OPERATOR:
      return "operator";
    case GS_ABORT_MISMATCH:
      return "mismatch";
    default:
      return "unknown";
  }
}

std::string mismatch_keys(const Mismatch& m) {
  auto pair = [](auto a, auto b) { return std::to_string(a) + "," + std::to_string(b); };
  return " mismatch_seq=" + std::to_string(m.seq) + " mismatch_offset=" + std::to_string(m.offset) +
         " mismatch_ranks=" + pair(m.held.rank, m.arriving.rank) +
         " mismatch_counts=" + pair(m.held.count, m.arriving.count) +
         " mismatch_last=" + pair(int(m.held.last), int(m.arriving.last)) +
         " mismatch_types=" + gs_elem_name(m.held.elem_type) + "," + gs_elem_name(m.arriving.elem_type) +
         " mismatch_scales=" + pair(int(m.held.scale_exp), int(m.arriving.scale_exp));
}

std::string ranks_text(uint64_t mask) {
  std::string out;
  for (unsigned b = 0; b < 64; ++b)
    if (mask >> b & 1) out += (out.empty() ? "" : ",") + std::to_string(b);
  return out;
}

}  // namespace control

using namespace control;

namespace {
std::string counters_text(const CounterValues& v) {
  std::string s = v.format("");
  if (s.find("drops=") == std::string::npos) s = "drops=" + std::to_string(v.drops_total()) + " " + s;
  return s;
}
}  // namespace

void ControlPlane::handle_status(Conn& c, const Request& r, uint64_t now_ns) {
  Error err;
  auto q = parse_status(r, &err);
  if (!q) return reply_error(c, err.code, err.message);
  uint32_t id;
  if (q->job_id)
    id = *q->job_id;
  else if (c.role == Conn::Role::kJoined || c.role == Conn::Role::kLeft)
    id = c.job_id;
  else
    return reply_error(c, kErrBadRequest, "STATUS needs job_id= on a connection that has not joined a job");
  JobStatus s;
  if (!engine_.job_status(id, &s))
    return reply_error(c, kErrNotFound, "no job with id " + std::to_string(id));
  auto it = live_.find(id);
  uint64_t last = s.last_activity_ns;
  if (it != live_.end()) last = std::max({last, it->second->last_request_ns, it->second->start_ns});
  std::string out =
      "OK job_id=" + std::to_string(id) + " name=" + s.name + " world=" + std::to_string(s.world) +
      " state=" + (s.aborted ? "aborted" : "running") +
      " abort_reason=" + abort_reason_name(s.aborted ? s.abort_reason : 0) + " abort_rank=" +
      (s.aborted && s.abort_rank != GS_RANK_ALL ? std::to_string(s.abort_rank) : std::string("-")) +
      " idle_ms=" + std::to_string(now_ns > last ? (now_ns - last) / 1'000'000 : 0) + " rank_seq=";
  for (size_t i = 0; i < s.rank_last_seq.size(); ++i)
    out += (i ? "," : "") + std::to_string(s.rank_last_seq[i]);
  out += " left=" + ranks_text(s.left);
  if (s.aborted && s.abort_reason == GS_ABORT_MISMATCH) out += mismatch_keys(s.mismatch);
  if (q->slot) {
    if (*q->slot >= s.slots)
      return reply_error(c, kErrBadRequest,
                         "slot=" + std::to_string(*q->slot) + " is out of range (the job has " +
                             std::to_string(s.slots) + " slots)");
    SlotStatus ss;
    if (!engine_.slot_status(id, *q->slot, q->version, &ss))
      return reply_error(c, kErrNotFound,
                         "no slot " + std::to_string(*q->slot) + " in job " + std::to_string(id));
    out += std::string(" slot_state=") +
           (ss.open       ? "open"
            : ss.complete ? "complete"
                          : "empty") +
           " slot_seq=" + std::to_string(ss.seq) + " slot_offset=" + std::to_string(ss.offset) + " seen=";
    out += ranks_text(ss.seen);
  }
  reply(c, out + "\n");
}

std::string ControlPlane::stats_line() const {
  std::string s = counters_text(engine_.total_counters()) + " jobs=" + std::to_string(live_.size()) +
                  " joining=" + std::to_string(pending_.size()) +
                  " jobs_started=" + std::to_string(jobs_started_);
  for (auto& src : stats_sources_) {
    std::string extra = src();
    if (!extra.empty()) s += " " + extra;
  }
  return s;
}

void ControlPlane::handle_stats(Conn& c, const Request& r) {
  Error err;
  auto q = parse_stats(r, &err);
  if (!q) return reply_error(c, err.code, err.message);
  if (!q->job_id) return reply(c, "OK " + stats_line() + "\n");
  JobStatus s;
  if (!engine_.job_status(*q->job_id, &s))
    return reply_error(c, kErrNotFound, "no job with id " + std::to_string(*q->job_id));
  reply(c, "OK " + counters_text(s.counters) + "\n");
}

void ControlPlane::handle_jobs(Conn& c, const Request& r) {
  Error err;
  if (!parse_no_args(r, &err)) return reply_error(c, err.code, err.message);
  std::string out = "OK jobs=";
  bool first = true;
  for (auto& [id, j] : live_) {
    out += (first ? "" : ",") + std::to_string(id) + ":" + j->spec.name + ":" +
           std::to_string(j->spec.world) + ":" + (j->aborted ? "aborted" : "running");
    first = false;
  }
  for (auto& [name, p] : pending_) {
    out += (first ? "" : ",") + std::string("0:") + name + ":" + std::to_string(p->world) + ":joining";
    first = false;
  }
  reply(c, out + "\n");
}

}  // namespace gradswitch
