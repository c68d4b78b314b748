// Jobs and their life cycle (see jobs.h): JOIN, the start, LEAVE and closed connections, the
// operator's ABORT, aborts and their EVENT lines, quotas, the join and idle timeouts, and shutdown.
#include "switch/control/jobs.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cinttypes>
#include <utility>

#include "common/challenge.h"
#include "common/clock.h"
#include "switch/control/leaf_uplink.h"
#include "switch/log.h"

namespace gradswitch::control {

Jobs::Jobs(Engine& engine, const SwitchConfig& config, Connections& conns, const Authenticator& auth,
           LeafUplink& leaf, ConnectionHandler& handler)
    : engine_(engine), config_(config), conns_(conns), auth_(auth), leaf_(leaf), handler_(handler) {}

size_t Jobs::reserved_memory() const {
  size_t m = 0;
  for (auto& [n, p] : pending_) m += p->memory;
  for (auto& [id, j] : live_) m += j->memory;
  return m;
}

PendingJob* Jobs::find_pending(const std::string& name) {
  auto it = pending_.find(name);
  return it == pending_.end() ? nullptr : it->second.get();
}

LiveJob* Jobs::find_live(uint32_t id) {
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : it->second.get();
}

const LiveJob* Jobs::find_live(uint32_t id) const {
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : it->second.get();
}

void Jobs::note_request(const Conn& c, uint64_t now_ns) {
  if (c.role != Conn::Role::kJoined) return;
  if (LiveJob* j = find_live(c.job_id)) j->last_request_ns = now_ns;
}

void Jobs::handle_join(Conn& c, const Request& r, uint64_t now_ns) {
  using Role = Conn::Role;
  if (c.role == Role::kJoined)
    return conns_.reply_error(c, kErrState,
                              "this connection already joined job '" + c.job_name + "' as rank " +
                                  std::to_string(c.rank) + " (one JOIN per connection)");
  if (c.role == Role::kLeft)
    return conns_.reply_error(
        c, kErrState,
        "this connection already left job '" + c.job_name + "' (one JOIN per connection; open a new one)");
  if (shutting_down_) return conns_.reply_error(c, kErrState, "the switch is shutting down");
  if (std::string why = auth_.join_refusal(c); !why.empty()) return conns_.reply_error(c, GS_ERR_AUTH, why);
  Error err;
  auto j = parse_join(r, &err);
  if (!j) return conns_.reply_error(c, err.code, err.message);
  if (j->deadline_us && (leaf_.is_leaf() || config_.backend != "udp"))
    return conns_.reply_error(c, kErrBadRequest,
                              leaf_.is_leaf() ? "deadline_us= does not go with a leaf switch (--uplink " +
                                                    config_.uplink + "): the spine closes the rounds"
                                              : "deadline_us= needs the udp backend (its data threads' "
                                                "timers close the rounds); this switch runs --backend " +
                                                    config_.backend);
  if (j->leaf && leaf_.is_leaf())
    return conns_.reply_error(c, kErrBadRequest,
                              "this switch is itself a leaf (--uplink " + config_.uplink +
                                  "): it takes workers' JOINs, not a leaf's (two levels at most)");
  // A tenant's names are its own: another tenant's job of the same name is another job.
  const std::string name = auth_.scoped_name(c, j->job);
  for (auto& [id, live] : live_)
    if (live->spec.name == name && !live->aborted)
      return conns_.reply_error(
          c, kErrConflict,
          "job '" + name + "' is already running with all " + std::to_string(live->spec.world) + " ranks");
  auto it = pending_.find(name);
  if (it != pending_.end()) {
    if (!may_join(c, *it->second, *j)) return;
  } else {
    if (!create_pending(c, *j, name, now_ns, &err)) return conns_.reply_error(c, err.code, err.message);
    it = pending_.find(name);
  }
  PendingJob& p = *it->second;
  add_rank(c, p, *j);
  if (leaf_.is_leaf())
    leaf_.forward_join(c, r, p);  // the job starts when the spine has every rank
  else if (p.joined == p.world)
    start_job(p, now_ns);
}

bool Jobs::may_join(Conn& c, PendingJob& p, const JoinRequest& j) {
  const std::string& name = p.name;
  if (p.token != j.token) {
    // Not provably a member of this job: refuse it alone, the waiting ranks are unaffected.
    GS_LOG_WARN("job '%s': refused JOIN of rank %u from %s: different token", name.c_str(), j.rank,
                c.peer.c_str());
    conns_.reply_error(c, kErrConflict, "job '" + name + "' exists with a different token");
    return false;
  }
  std::string differs = join_conflict(p, j);
  if (differs.empty()) return true;
  // A member of the job disagrees with the ranks already waiting: the job cannot start, so every
  // waiting rank learns it now rather than at the join timeout.
  const std::string why = "job '" + name + "': rank " + std::to_string(j.rank) + " (" + c.peer +
                          ") joined with " + differs + "; the job is cancelled for every rank";
  GS_LOG_WARN("refused JOIN: %s", why.c_str());
  fail_pending(p, {kErrConflict, why});  // `p` is gone from here on
  conns_.reply_error(c, kErrConflict, why);
  return false;
}

void Jobs::add_rank(Conn& c, PendingJob& p, const JoinRequest& j) {
  p.conn[j.rank] = c.id;
  p.port[j.rank] = j.port;
  p.leaf[j.rank] = j.leaf;
  p.peer[j.rank] = Endpoint{j.peer_ipv4_be, htons(j.peer_port)};
  ++p.joined;
  c.role = Conn::Role::kPending;
  c.outside_since_ns = 0;  // in a job: the handshake deadline starts again if it comes out of it
  c.job_name = p.name;
  c.rank = j.rank;
  GS_LOG_DEBUG("job '%s': rank %u joined from %s (%u of %u)", p.name.c_str(), j.rank, c.peer.c_str(),
               p.joined, p.world);
}

bool Jobs::within_limits(const JoinRequest& j, size_t slot_bytes, size_t need, Error* err) const {
  if (live_.size() + pending_.size() >= config_.max_jobs) {
    *err = {kErrNoResources,
            "job table full: " + std::to_string(config_.max_jobs) + " jobs running or joining (--max-jobs)"};
    return false;
  }
  if (reserved_memory() + need <= config_.max_memory) return true;
  const size_t opt_bytes = need - slot_bytes;
  std::string what = j.optimizer
                         ? "memory: job needs " + std::to_string(need) + " bytes (slots " +
                               std::to_string(slot_bytes) + " + optimizer " + std::to_string(opt_bytes) +
                               " for " + std::to_string(j.optimizer->params) + " parameters, " +
                               optimizer_algo_name(j.optimizer->algo) + ")"
                         : "slot memory: job needs " + std::to_string(need) + " bytes";
  *err = {kErrNoResources,
          "not enough " + what + ", " +
              std::to_string(config_.max_memory - std::min<size_t>(reserved_memory(), config_.max_memory)) +
              " of " + std::to_string(config_.max_memory) + " left (--max-memory)"};
  return false;
}

bool Jobs::create_pending(const Conn& c, const JoinRequest& j, const std::string& name, uint64_t now_ns,
                          Error* err) {
  JobSpec spec;
  spec.world = j.world;
  spec.wire = j.wire;
  spec.slots = static_cast<uint16_t>(config_.slots);
  spec.payload_bytes = config_.payload_bytes();
  const size_t slot_bytes = Engine::job_memory_bytes(spec);
  const size_t opt_bytes = j.optimizer ? optimizer_memory_bytes(*j.optimizer, spec.payload_bytes / 4) : 0;
  const size_t need = slot_bytes + opt_bytes;
  if (std::string why = quota_refusal(c.tenant, need); !why.empty()) {
    GS_LOG_INFO("refused JOIN of job '%s' from %s: %s", name.c_str(), c.peer.c_str(), why.c_str());
    *err = {kErrNoResources, why};
    return false;
  }
  if (!within_limits(j, slot_bytes, need, err)) return false;
  auto p = std::make_unique<PendingJob>();
  p->name = name;
  p->tenant = c.tenant;
  p->token = j.token;
  p->world = j.world;
  p->wire = j.wire;
  p->types = j.types;
  p->deadline_us = j.deadline_us;
  p->quorum = j.quorum;
  p->memory = need;
  if (j.optimizer) p->optimizer = std::make_shared<const OptimizerSpec>(*j.optimizer);
  p->deadline_ns = now_ns + uint64_t(config_.join_timeout_s) * 1'000'000'000ull;
  p->conn.assign(j.world, 0);
  p->port.assign(j.world, 0);
  p->leaf.assign(j.world, 0);
  p->peer.assign(j.world, Endpoint{});
  p->uplink_conn.assign(j.world, 0);
  pending_.emplace(name, std::move(p));
  return true;
}

std::string Jobs::quota_refusal(int tenant, size_t memory) const {
  if (!auth_.on()) return "";  // anonymous switch: the switch's own limits are the only quota
  const Quota& q = auth_.quota_of(tenant);
  const std::string who = auth_.quota_holder(tenant);
  uint64_t jobs = 0, used = 0;
  for (auto& [name, p] : pending_)
    if (p->tenant == tenant) ++jobs, used += p->memory;
  for (auto& [id, j] : live_)
    if (j->tenant == tenant) ++jobs, used += j->memory;
  if (jobs >= q.max_jobs)
    return who + " is at its quota of " + std::to_string(q.max_jobs) +
           " jobs running or joining (max_jobs in the auth file)";
  if (used + memory > q.max_memory)
    return who + " is at its memory quota: the job needs " + std::to_string(memory) + " bytes, " +
           std::to_string(q.max_memory - std::min<uint64_t>(used, q.max_memory)) + " of its " +
           std::to_string(q.max_memory) + " are left (max_memory in the auth file)";
  return "";
}

std::string Jobs::join_conflict(const PendingJob& p, const JoinRequest& j) const {
  if (p.world != j.world)
    return "world=" + std::to_string(j.world) + " but the job has world=" + std::to_string(p.world);
  if (p.wire != j.wire)
    return std::string("wire=") + gs_elem_name(j.wire) + " but the job has wire=" + gs_elem_name(p.wire);
  if (p.types != j.types) {
    auto names = [](uint32_t mask) {
      std::string out;
      for (uint8_t t = 1; t < 32; ++t)
        if (mask >> t & 1) out += (out.empty() ? "" : ",") + std::string(gs_elem_name(t));
      return out.empty() ? std::string("(none)") : out;
    };
    return "types=" + names(j.types) + " but the job has types=" + names(p.types);
  }
  if (p.deadline_us != j.deadline_us || p.quorum != j.quorum) {
    auto text = [](uint32_t d, uint16_t q) {
      return d ? "deadline_us=" + std::to_string(d) + " quorum=" + std::to_string(q)
               : std::string("no deadline_us=");
    };
    return text(j.deadline_us, j.quorum) + " but the job has " + text(p.deadline_us, p.quorum);
  }
  if (bool(p.optimizer) != j.optimizer.has_value() ||
      (p.optimizer && !same_optimizer(*p.optimizer, *j.optimizer)))
    return (j.optimizer ? describe_optimizer(*j.optimizer) : std::string("no optimizer")) +
           " but the job has " +
           (p.optimizer ? describe_optimizer(*p.optimizer) : std::string("no optimizer")) +
           " (every rank must give the same optimizer keys)";
  if (p.conn[j.rank] != 0) {
    const Conn* other = conns_.find(p.conn[j.rank]);
    return "rank " + std::to_string(j.rank) + ", which already joined" +
           (other ? " from " + other->peer : std::string());
  }
  return {};
}

void Jobs::draw_id_and_key(JobSpec* spec) const {
  do secure_random(&spec->id, sizeof spec->id);
  while (!engine_.id_usable(spec->id));
  do secure_random(&spec->key, sizeof spec->key);
  while (spec->key == 0);
}

JobSpec Jobs::new_spec(const PendingJob& p) const {
  JobSpec spec;
  spec.name = p.name;
  spec.world = p.world;
  spec.wire = p.wire;
  spec.slots = static_cast<uint16_t>(config_.slots);
  spec.payload_bytes = config_.payload_bytes();
  spec.optimizer = p.optimizer;
  if (p.deadline_us) {
    // A PARTIAL RESULT carries its contributors after the elements: the job's packets are that much
    // smaller, so that it still fits the MTU (docs/protocol.md §3.1).
    spec.payload_bytes -= GS_PARTIAL_TRAILER_BYTES;
    spec.deadline_ns = uint64_t{p.deadline_us} * 1000;
    spec.quorum = p.quorum;
  }
  spec.elem_types = p.optimizer ? 0 : Engine::default_elem_types(p.wire, false) | p.types;
  // A leaf sends its rack's 16-bit and mx8 sums up as float32 (docs/protocol.md §8).
  const bool from_leaves = std::any_of(p.leaf.begin(), p.leaf.end(), [](uint8_t l) { return l != 0; });
  if (from_leaves && (p.wire == GS_ELEM_FLOAT16 || p.wire == GS_ELEM_BFLOAT16 || p.wire == GS_ELEM_MX8))
    spec.elem_types |= 1u << GS_ELEM_FLOAT32;
  draw_id_and_key(&spec);
  return spec;
}

void Jobs::start_job(PendingJob& p, uint64_t now_ns) {
  JobSpec spec = new_spec(p);
  // The ranks a leaf forwarded from one address and port (docs/protocol.md §8) are one contributor:
  // the lowest of them, whose rank the leaf's partial sums carry; results go once to that address.
  std::vector<uint16_t> leader(p.world);
  std::vector<Endpoint> at(p.world);
  for (uint16_t r = 0; r < p.world; ++r) {
    at[r] = Endpoint{conns_.at(p.conn[r]).peer_ipv4_be, htons(p.port[r])};
    leader[r] = r;
    for (uint16_t q = 0; q < r && p.leaf[r]; ++q)
      if (p.leaf[q] && at[q].ipv4_be == at[r].ipv4_be && at[q].port_be == at[r].port_be) {
        leader[r] = leader[q];
        break;
      }
    if (leader[r] == r) {
      spec.members |= uint64_t{1} << r;
      spec.endpoints.push_back(at[r]);
      if (p.leaf[r]) spec.source_ip_only |= uint64_t{1} << r;  // a leaf sends from its threads' ports
    }
  }
  if (static_cast<unsigned>(__builtin_popcountll(spec.members)) == p.world) spec.members = 0;  // everyone
  // Every rank's UDP address, so the workers can run the ring among themselves (docs/protocol.md
  // section 7): on request (algorithm=ring) and as the fallback when this switch goes away. A rank
  // behind a leaf is listed at its own address (peer=), not the leaf's.
  std::string peers;
  for (uint16_t r = 0; r < p.world; ++r)
    peers += (r ? "," : "") + endpoint_text(p.leaf[r] ? p.peer[r] : at[r]);
  Line tail("");
  tail.add(GS_KEY_PEERS, peers);
  if (p.deadline_us) tail.add(GS_KEY_DEADLINE_US, p.deadline_us).add(GS_KEY_QUORUM, p.quorum);
  if (spec.optimizer) {
    const StateHeader h = state_header_for(*spec.optimizer, spec.payload_bytes / 4, spec.optimizer->lr);
    tail.add(GS_KEY_OPTIMIZER, optimizer_algo_name(spec.optimizer->algo))
        .add(GS_KEY_PARAMS, h.params)
        .add(GS_KEY_CHUNK, h.chunk)
        .add(GS_KEY_STATE_BYTES, state_blob_bytes(h));
  }
  std::string reply = tail.str();
  reply.pop_back();  // the '\n': launch() ends the line
  launch(p, spec, std::move(leader), reply, now_ns);
}

void Jobs::launch(PendingJob& p, const JobSpec& spec, std::vector<uint16_t> leader,
                  const std::string& reply_tail, uint64_t now_ns) {
  std::string error;
  uint32_t id = engine_.create_job(spec, &error);
  if (id == 0) return fail_pending(p, {kErrNoResources, "cannot create job '" + p.name + "': " + error});
  auto live = std::make_unique<LiveJob>();
  live->id = id;
  live->tenant = p.tenant;
  live->spec = spec;
  live->token = p.token;
  live->memory = p.memory;
  live->conn = p.conn;
  live->present = p.joined;
  live->leader = std::move(leader);
  live->left.assign(p.world, 0);
  live->lost.assign(p.world, std::string());
  for (uint16_t r = 0; r < p.world; ++r) {
    std::string at = "-";
    if (r < p.leaf.size() && p.leaf[r])
      at = endpoint_text(p.peer[r]);
    else if (p.conn[r])
      at = endpoint_text(Endpoint{conns_.at(p.conn[r]).peer_ipv4_be, htons(p.port[r])});
    live->peers += (r ? "," : "") + at;
  }
  live->uplink_conn = p.uplink_conn;
  if (spec.uplink) live->spine = config_.uplink;
  live->start_ns = live->last_request_ns = now_ns;
  Line ok(GS_REPLY_OK);
  ok.add(GS_KEY_JOB_ID, id)
      .add(GS_KEY_KEY, spec.key)
      .add(GS_KEY_SLOTS, spec.slots)
      .add(GS_KEY_PAYLOAD, spec.payload_bytes)
      .add(GS_KEY_DATA_PORT, config_.data_port)
      .add(GS_KEY_THREADS, config_.threads)
      .raw(reply_tail);
  std::vector<Conn*> members;
  for (uint16_t r = 0; r < p.world; ++r) {
    if (!p.conn[r]) continue;
    Conn& c = conns_.at(p.conn[r]);
    c.role = Conn::Role::kJoined;
    c.job_id = id;
    members.push_back(&c);
  }
  for (uint64_t cid : p.uplink_conn)
    if (Conn* up = cid ? conns_.find(cid) : nullptr) up->job_id = id;
  GS_LOG_INFO("job '%s' (id 0x%" PRIx32 ") started: world %u, wire %s, %u slots%s%s%s", spec.name.c_str(), id,
              spec.world, gs_elem_name(spec.wire), spec.slots, spec.optimizer ? ", " : "",
              spec.optimizer ? describe_optimizer(*spec.optimizer).c_str() : "",
              spec.uplink
                  ? (", leaf of " + config_.uplink + " (ranks " + ranks_text(spec.members) + ")").c_str()
                  : "");
  ++jobs_started_;
  live_.emplace(id, std::move(live));
  pending_.erase(p.name);  // `p` is gone from here on
  for (Conn* c : members) conns_.reply(*c, ok.str());
  // Requests that arrived while the JOIN reply was held.
  for (Conn* c : members) handler_.on_input(*c, now_ns);
}

void Jobs::fail_pending(PendingJob& p, const Error& e) {
  for (uint64_t cid : p.uplink_conn) leaf_.close(cid);
  for (uint64_t cid : p.conn) {
    Conn* c = cid ? conns_.find(cid) : nullptr;
    if (!c) continue;
    c->role = Conn::Role::kNone;
    c->job_name.clear();
    conns_.reply_error(*c, e.code, e.message);
  }
  std::string name = p.name;
  pending_.erase(name);
  // The connections may now process what they sent meanwhile (done at their next input or here).
  for (auto& [id, c] : conns_.all())
    if (c->role == Conn::Role::kNone && c->in.buffered()) handler_.on_input(*c, monotonic_ns());
}

void Jobs::handle_leave(Conn& c, const Request& r, uint64_t now_ns) {
  Error err;
  std::optional<LeaveRequest> leave = parse_leave(r, &err);
  if (!leave) return conns_.reply_error(c, err.code, err.message);
  if (c.role == Conn::Role::kNone)
    return conns_.reply_error(c, kErrState, "LEAVE without a JOIN on this connection");
  if (c.role == Conn::Role::kLeft)
    return conns_.reply_error(c, kErrState, "already left job '" + c.job_name + "'");
  conns_.reply(c, GS_REPLY_OK "\n");
  depart(c, /*graceful=*/true, now_ns, leave->lost);
}

void Jobs::handle_abort(Conn& c, const Request& r) {
  Error err;
  auto id = parse_abort(r, &err);
  if (!id) return conns_.reply_error(c, err.code, err.message);
  if (!c.privileged)
    return conns_.reply_error(c, GS_ERR_AUTH,
                              "ABORT is the operator's: AUTH with an operator entry of the auth file");
  LiveJob* j = find_live(*id);
  if (!j) return conns_.reply_error(c, kErrNotFound, "no running job with id " + std::to_string(*id));
  if (j->aborted)
    return conns_.reply_error(c, kErrState, "job " + std::to_string(*id) + " was already aborted");
  abort_live(*j, GS_ABORT_OPERATOR, GS_RANK_ALL, "aborted by the operator at " + c.peer);
  conns_.reply(c, GS_REPLY_OK "\n");
}

void Jobs::withdraw(Conn& c) {
  auto it = pending_.find(c.job_name);
  if (it != pending_.end()) {
    PendingJob& p = *it->second;
    if (p.conn[c.rank] == c.id) {
      p.conn[c.rank] = 0;
      --p.joined;
      GS_LOG_DEBUG("job '%s': rank %u withdrew before the job started", p.name.c_str(), c.rank);
      if (p.uplink_conn[c.rank]) leaf_.withdraw(p, c.rank);
    }
    if (p.joined == 0) pending_.erase(it);
  }
  c.role = Conn::Role::kNone;
}

void Jobs::depart(Conn& c, bool graceful, uint64_t /*now_ns*/, const std::string& lost) {
  if (c.role == Conn::Role::kUplink) return leaf_.lost(c);
  if (c.role == Conn::Role::kPending) return withdraw(c);
  if (c.role != Conn::Role::kJoined) return;
  c.role = Conn::Role::kLeft;
  LiveJob* jp = find_live(c.job_id);
  if (!jp || jp->conn[c.rank] != c.id) return;
  LiveJob& j = *jp;
  j.conn[c.rank] = 0;
  --j.present;
  if (graceful) j.left[c.rank] = 1;
  j.lost[c.rank] = lost;
  if (!j.aborted) {
    if (!graceful) {
      abort_live(j, GS_ABORT_RANK_LEFT, c.rank, "rank " + std::to_string(c.rank) + " disconnected");
    } else if (j.present > 0 && group_left(j, c.rank) && engine_.rank_left(j.id, j.leader[c.rank])) {
      // The engine aborted it: a round was waiting for the rank that left.
      abort_live(j, GS_ABORT_RANK_LEFT, c.rank,
                 "rank " + std::to_string(c.rank) + " left (LEAVE" +
                     (j.lost[c.rank].empty() ? "" : ": it lost the switch at " + j.lost[c.rank]) +
                     ") while the others were in an allreduce");
    }
  }
  if (!j.uplink_conn.empty() && j.uplink_conn[c.rank]) leaf_.depart(j, c.rank, graceful);
  end_job_if_empty(j);
}

bool Jobs::group_left(const LiveJob& j, uint16_t rank) const {
  for (uint16_t r = 0; r < j.spec.world; ++r)
    if (j.leader[r] == j.leader[rank] && !j.left[r]) return false;
  return true;
}

const std::string& Jobs::lost_by_aborter(const LiveJob& j, const JobStatus& s) {
  static const std::string none;
  if (!s.aborted || s.abort_reason != GS_ABORT_RANK_LEFT || s.abort_rank >= j.lost.size()) return none;
  return j.lost[s.abort_rank];
}

void Jobs::abort_live(LiveJob& j, uint8_t reason, uint16_t rank, const std::string& why) {
  if (j.aborted) return;
  engine_.abort_job(j.id, reason, rank);  // false when a data thread aborted it first: its reason wins
  note_abort(j, why);
}

void Jobs::note_abort(LiveJob& j, const std::string& why) {
  JobStatus s;
  if (!engine_.job_status(j.id, &s) || !s.aborted) return;
  j.aborted = true;
  j.abort_why = why.empty() ? gs_abort_reason_name(s.abort_reason) : why;
  GS_LOG_INFO("job '%s' (id 0x%" PRIx32 ") aborted: %s (reason %s, rank %s)%s", j.spec.name.c_str(), j.id,
              j.abort_why.c_str(), gs_abort_reason_name(s.abort_reason),
              s.abort_rank == GS_RANK_ALL ? "-" : std::to_string(s.abort_rank).c_str(),
              s.abort_reason == GS_ABORT_MISMATCH ? mismatch_keys(s.mismatch).c_str() : "");
  // Every rank still connected learns it at once, also those between two allreduces.
  Line event(GS_EVENT " " GS_EVENT_ABORTED);
  event.add(GS_KEY_JOB_ID, j.id)
      .add(GS_KEY_REASON, gs_abort_reason_name(s.abort_reason))
      .add(GS_KEY_RANK, s.abort_rank == GS_RANK_ALL ? std::string(GS_NO_RANK) : std::to_string(s.abort_rank))
      .add(GS_KEY_LEFT, ranks_text(s.left));
  if (const std::string& lost = lost_by_aborter(j, s); !lost.empty()) event.add(GS_KEY_LOST, lost);
  if (s.abort_reason == GS_ABORT_MISMATCH) event.raw(mismatch_keys(s.mismatch));
  if (s.abort_reason == GS_ABORT_UPLINK) event.add(GS_KEY_UPLINK, j.spine).raw(leaf_.uplink_keys(j, s));
  for (uint64_t cid : j.conn)
    if (Conn* c = cid ? conns_.find(cid) : nullptr) conns_.send_event(*c, event.str());
  // A leaf's job that ended here ends at the spine too: closing the members' connections there
  // aborts the spine's job, which tells the other racks.
  if (s.abort_reason != GS_ABORT_UPLINK)
    for (uint64_t& cid : j.uplink_conn) leaf_.close(std::exchange(cid, 0));
}

void Jobs::end_job_if_empty(LiveJob& j) {
  if (j.present > 0) return;
  if (!j.aborted) note_abort(j, "");  // logs an abort a data thread made since the last timer check
  uint32_t id = j.id;
  GS_LOG_INFO("job '%s' (id 0x%" PRIx32 ") ended: %s", j.spec.name.c_str(), id,
              j.aborted ? ("aborted (" + j.abort_why + ")").c_str() : "all ranks left");
  for (uint64_t cid : j.uplink_conn) leaf_.close(cid);
  engine_.destroy_job(id);
  live_.erase(id);
}

void Jobs::expire_joins(uint64_t now_ns) {
  std::vector<std::string> expired;
  for (auto& [name, p] : pending_)
    if (now_ns >= p->deadline_ns) expired.push_back(name);
  for (const std::string& name : expired) {
    PendingJob* p = find_pending(name);
    if (!p || now_ns < p->deadline_ns) continue;
    std::string missing;
    for (uint16_t r = 0; r < p->world; ++r)
      if (!p->conn[r]) missing += (missing.empty() ? "" : ",") + std::to_string(r);
    GS_LOG_INFO("job '%s': join timed out, %u of %u ranks joined (missing %s)", p->name.c_str(), p->joined,
                p->world, missing.c_str());
    fail_pending(*p, {kErrTimeout, "job '" + p->name + "': " + std::to_string(p->joined) + " of " +
                                       std::to_string(p->world) + " ranks joined within " +
                                       std::to_string(config_.join_timeout_s) + " s (missing ranks " +
                                       missing + "; --join-timeout)"});
  }
}

void Jobs::expire_idle(uint64_t now_ns) {
  const uint64_t idle_ns = uint64_t(config_.idle_timeout_s) * 1'000'000'000ull;
  for (auto& [id, j] : live_) {
    if (j->aborted) continue;
    JobStatus s;
    uint64_t last = std::max(j->last_request_ns, j->start_ns);
    if (engine_.job_status(id, &s)) last = std::max(last, s.last_activity_ns);
    if (now_ns > last && now_ns - last > idle_ns)
      abort_live(*j, GS_ABORT_IDLE, GS_RANK_ALL,
                 "idle for " + std::to_string(config_.idle_timeout_s) + " s (--idle-timeout)");
  }
}

void Jobs::check_timers(uint64_t now_ns) {
  expire_joins(now_ns);
  // Jobs a data thread aborted (ranks that disagree, a round waiting for a rank that left).
  for (auto& [id, j] : live_) {
    JobStatus s;
    if (!j->aborted && engine_.job_status(id, &s) && s.aborted) note_abort(*j, "");
  }
  expire_idle(now_ns);
}

void Jobs::shutdown(uint64_t /*now_ns*/) {
  shutting_down_ = true;
  while (!pending_.empty())
    fail_pending(*pending_.begin()->second, {kErrState, "the switch is shutting down"});
  for (auto& [id, j] : live_) abort_live(*j, GS_ABORT_SHUTDOWN, GS_RANK_ALL, "the switch is shutting down");
  conns_.flush_all();
}

void Jobs::settle_reload(const AuthChange& change) {
  std::vector<std::string> lost;
  for (auto& [name, p] : pending_)
    if (Authenticator::lost_tenant(change, p->tenant)) lost.push_back(name);
  for (const std::string& name : lost)
    if (PendingJob* p = find_pending(name)) {
      const std::string why = p->tenant == kAnonymous ? "the auth file no longer allows anonymous JOINs"
                                                      : "tenant '" + auth_.table().tenants[p->tenant].name +
                                                            "' is no longer in the auth file";
      GS_LOG_INFO("job '%s': cancelled while joining: %s (read again on SIGHUP)", name.c_str(), why.c_str());
      fail_pending(*p,
                   {GS_ERR_AUTH, "job '" + name + "' was joining when " + why + " (read again on SIGHUP)"});
    }
}

void Jobs::destroy_all() {
  for (auto& [id, j] : live_) engine_.destroy_job(id);
  live_.clear();
  pending_.clear();
}

}  // namespace gradswitch::control
