// What the control plane tells about jobs and counters (see queries.h), and the texts of abort
// reasons and mismatches that events and log lines share with them (control_state.h).
#include "switch/control/queries.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <string>
#include <string_view>

#include "switch/log.h"

namespace gradswitch::control {

std::string endpoint_text(const Endpoint& e) {
  char ip[INET_ADDRSTRLEN] = "";
  in_addr a{};
  a.s_addr = e.ipv4_be;
  ::inet_ntop(AF_INET, &a, ip, sizeof ip);
  return std::string(ip) + ":" + std::to_string(ntohs(e.port_be));
}

std::string mismatch_keys(const Mismatch& m) {
  auto pair = [](auto a, auto b) { return std::to_string(a) + "," + std::to_string(b); };
  Line keys("");
  keys.add(GS_KEY_MISMATCH_SEQ, m.seq)
      .add(GS_KEY_MISMATCH_OFFSET, m.offset)
      .add(GS_KEY_MISMATCH_RANKS, pair(m.held.rank, m.arriving.rank))
      .add(GS_KEY_MISMATCH_COUNTS, pair(m.held.count, m.arriving.count))
      .add(GS_KEY_MISMATCH_LAST, pair(int(m.held.last), int(m.arriving.last)))
      .add(GS_KEY_MISMATCH_TYPES,
           std::string(gs_elem_name(m.held.elem_type)) + "," + gs_elem_name(m.arriving.elem_type))
      .add(GS_KEY_MISMATCH_SCALES, pair(int(m.held.scale_exp), int(m.arriving.scale_exp)));
  std::string text = keys.str();
  text.pop_back();  // the '\n'
  return text;
}

std::string ranks_text(uint64_t mask) {
  std::string out;
  for (unsigned b = 0; b < 64; ++b)
    if (mask >> b & 1) out += (out.empty() ? "" : ",") + std::to_string(b);
  return out;
}

namespace {
// `per_reason`: every drop reason apart (operators); else the secret checks' as drop.rejected=.
std::string counters_text(const CounterValues& v, bool per_reason) {
  return v.format("", per_reason);
}
}  // namespace

Queries::Queries(Engine& engine, const SwitchConfig& config, Connections& conns, const Authenticator& auth,
                 const Jobs& jobs, const LeafUplink& leaf)
    : engine_(engine), config_(config), conns_(conns), auth_(auth), jobs_(jobs), leaf_(leaf) {}

bool Queries::can_see(const Conn& c, uint32_t job_id) const {
  const LiveJob* j = jobs_.find_live(job_id);
  return may_see(auth_.viewer_of(c), job_id, j ? j->tenant : kAnonymous);
}

void Queries::add_open_rounds(Line& out, uint32_t job_id, uint64_t now_ns) const {
  std::vector<OpenRound> open;
  if (!engine_.open_rounds(job_id, &open)) return;
  out.add(GS_KEY_OPEN_ROUNDS, open.size());
  if (open.empty()) return;
  const OpenRound& oldest = open.front();
  out.add(GS_KEY_OLDEST_SLOT, oldest.slot)
      .add(GS_KEY_OLDEST_VERSION, int(oldest.version))
      .add(GS_KEY_OLDEST_SEQ, oldest.seq)
      .add(GS_KEY_OLDEST_OFFSET, oldest.offset)
      .add(GS_KEY_OLDEST_AGE_MS, now_ns > oldest.opened_ns ? (now_ns - oldest.opened_ns) / 1'000'000 : 0)
      .add(GS_KEY_OLDEST_SEEN, ranks_text(oldest.seen));
}

bool Queries::add_slot(Conn& c, Line& out, uint32_t id, const JobStatus& s, const QueryRequest& q) {
  if (*q.slot >= s.slots) {
    conns_.reply_error(c, kErrBadRequest,
                       "slot=" + std::to_string(*q.slot) + " is out of range (the job has " +
                           std::to_string(s.slots) + " slots)");
    return false;
  }
  SlotStatus ss;
  if (!engine_.slot_status(id, *q.slot, q.version, &ss)) {
    conns_.reply_error(c, kErrNotFound,
                       "no slot " + std::to_string(*q.slot) + " in job " + std::to_string(id));
    return false;
  }
  out.add(GS_KEY_SLOT_STATE, ss.open       ? "open"
                             : ss.complete ? "complete"
                             : ss.uplink   ? "uplink"
                                           : "empty")
      .add(GS_KEY_SLOT_SEQ, ss.seq)
      .add(GS_KEY_SLOT_OFFSET, ss.offset)
      .add(GS_KEY_SEEN, ranks_text(ss.seen));
  return true;
}

void Queries::handle_status(Conn& c, const Request& r, uint64_t now_ns) {
  Error err;
  auto q = parse_status(r, &err);
  if (!q) return conns_.reply_error(c, err.code, err.message);
  uint32_t id;
  if (q->job_id)
    id = *q->job_id;
  else if (c.role == Conn::Role::kJoined || c.role == Conn::Role::kLeft)
    id = c.job_id;
  else
    return conns_.reply_error(c, kErrBadRequest,
                              "STATUS needs job_id= on a connection that has not joined a job");
  JobStatus s;
  // A job this connection may not see answers exactly as one that does not exist.
  if (!can_see(c, id) || !engine_.job_status(id, &s))
    return conns_.reply_error(c, kErrNotFound, "no job with id " + std::to_string(id));
  const LiveJob* live = jobs_.find_live(id);
  uint64_t last = s.last_activity_ns;
  if (live) last = std::max({last, live->last_request_ns, live->start_ns});
  std::string seqs;
  for (size_t i = 0; i < s.rank_last_seq.size(); ++i)
    seqs += (i ? "," : "") + std::to_string(s.rank_last_seq[i]);
  Line out(GS_REPLY_OK);
  out.add(GS_KEY_JOB_ID, id)
      .add(GS_KEY_NAME, s.name)
      .add(GS_KEY_WORLD, s.world)
      .add(GS_KEY_STATE, s.aborted ? GS_STATE_ABORTED : GS_STATE_RUNNING)
      .add(GS_KEY_ABORT_REASON, gs_abort_reason_name(s.aborted ? s.abort_reason : 0))
      .add(GS_KEY_ABORT_RANK,
           s.aborted && s.abort_rank != GS_RANK_ALL ? std::to_string(s.abort_rank) : std::string(GS_NO_RANK))
      .add(GS_KEY_IDLE_MS, now_ns > last ? (now_ns - last) / 1'000'000 : 0)
      .add(GS_KEY_RANK_SEQ, seqs)
      .add(GS_KEY_LEFT, ranks_text(s.left));
  if (live) {
    out.add(GS_KEY_PEERS, live->peers);
    if (const std::string& lost = Jobs::lost_by_aborter(*live, s); !lost.empty()) out.add(GS_KEY_LOST, lost);
  }
  add_open_rounds(out, id, now_ns);
  if (s.aborted && s.abort_reason == GS_ABORT_MISMATCH) out.raw(mismatch_keys(s.mismatch));
  if (live && !live->spine.empty()) {  // a leaf (docs/protocol.md section 8)
    out.add(GS_KEY_UPLINK, live->spine).add(GS_KEY_MEMBERS, ranks_text(s.members));
    if (s.aborted && s.abort_reason == GS_ABORT_UPLINK) out.raw(leaf_.uplink_keys(*live, s));
  }
  if (q->slot && !add_slot(c, out, id, s, *q)) return;
  conns_.reply(c, out.str());
}

std::string Queries::stats_line(bool per_reason) const {
  Line line(counters_text(engine_.total_counters(), per_reason));
  line.add(GS_KEY_JOBS, jobs_.live().size())
      .add(GS_KEY_JOINING, jobs_.pending().size())
      .add(GS_KEY_JOBS_STARTED, jobs_.started());
  if (auth_.on())
    line.add(GS_KEY_AUTH_RELOADS, auth_.reloads()).add(GS_KEY_AUTH_RELOAD_FAILURES, auth_.reload_failures());
  std::string s = line.str();
  s.pop_back();  // the '\n'

  for (auto& src : sources_) {
    std::string extra = src();
    if (!extra.empty()) s += " " + extra;
  }
  return s;
}

std::string Queries::visible_stats_line(const Conn& c) const {
  // The switch's totals move with every tenant's traffic and tell that jobs exist and how fast they
  // run; a non-operator gets the sum over the jobs it may see instead (docs/security.md). Without
  // the drop reasons: which check dropped a packet is an operator's (drop.rejected is per job).
  CounterValues sum;
  uint64_t jobs = 0, joining = 0;
  for (auto& [id, j] : jobs_.live()) {
    JobStatus s;
    if (!can_see(c, id) || !engine_.job_status(id, &s)) continue;
    sum += s.counters;
    ++jobs;
  }
  for (auto& [name, p] : jobs_.pending())
    if (c.tenant != kAnonymous && p->tenant == c.tenant) ++joining;
  std::string counters = counters_text(sum, true);
  counters = counters.substr(0, counters.find(" " GS_KEY_DROP_PREFIX));
  Line line(counters);
  line.add(GS_KEY_JOBS, jobs).add(GS_KEY_JOINING, joining);
  std::string s = line.str();
  s.pop_back();  // the '\n'
  return s;
}

void Queries::handle_stats(Conn& c, const Request& r) {
  Error err;
  auto q = parse_stats(r, &err);
  if (!q) return conns_.reply_error(c, err.code, err.message);
  if (!q->job_id)
    return conns_.reply(c,
                        GS_REPLY_OK " " + (c.privileged ? stats_line(true) : visible_stats_line(c)) + "\n");
  JobStatus s;
  if (!can_see(c, *q->job_id) || !engine_.job_status(*q->job_id, &s))
    return conns_.reply_error(c, kErrNotFound, "no job with id " + std::to_string(*q->job_id));
  // A job's own ranks and tenant see its drops by reason, but the secret checks' as one: a holder
  // of the tenant's credential who lacks the job's key must not be able to search for it.
  conns_.reply(c, GS_REPLY_OK " " + counters_text(s.counters, c.privileged) + "\n");
}

void Queries::handle_jobs(Conn& c, const Request& r) {
  Error err;
  if (!parse_no_args(r, &err)) return conns_.reply_error(c, err.code, err.message);
  std::string out = GS_REPLY_OK " " GS_KEY_JOBS "=";
  bool first = true;
  // Everyone else sees only the job of their own connection.
  for (auto& [id, j] : jobs_.live()) {
    if (!can_see(c, id)) continue;
    out += (first ? "" : ",") + std::to_string(id) + ":" + j->spec.name + ":" +
           std::to_string(j->spec.world) + ":" + (j->aborted ? GS_STATE_ABORTED : GS_STATE_RUNNING);
    first = false;
  }
  for (auto& [name, p] : jobs_.pending()) {
    if (!c.privileged) continue;  // a joining job's own connections wait for their JOIN reply
    out +=
        (first ? "" : ",") + std::string("0:") + name + ":" + std::to_string(p->world) + ":" GS_STATE_JOINING;
    first = false;
  }
  conns_.reply(c, out + "\n");
}

void Queries::log_periodic(uint64_t now_ns) {
  if (config_.stats_interval_s == 0) return;
  if (next_stats_ns_ == 0) next_stats_ns_ = now_ns + uint64_t(config_.stats_interval_s) * 1'000'000'000ull;
  if (now_ns < next_stats_ns_) return;
  next_stats_ns_ = now_ns + uint64_t(config_.stats_interval_s) * 1'000'000'000ull;
  GS_LOG_INFO("stats: %s", stats_line(true).c_str());
}

}  // namespace gradswitch::control
