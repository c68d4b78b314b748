// Who may do what (docs/security.md): CHALLENGE and AUTH (a tenant or an operator proves its
// secret), job names scoped by tenant, per-tenant quotas, what a connection may see, the operator's
// ABORT, and the random job ids and keys that make DATA unforgeable.
#include <algorithm>
#include <cinttypes>
#include <iterator>
#include <vector>

#include "common/challenge.h"
#include "common/sha256.h"
#include "switch/control/control_plane.h"
#include "switch/control/control_state.h"

namespace gradswitch {

using namespace control;

void ControlPlane::use_auth(AuthTable table) {
  auth_ = std::move(table);
}

void ControlPlane::handle_challenge(Conn& c, const Request& r) {
  Error err;
  if (!parse_no_args(r, &err)) return reply_error(c, err.code, err.message);
  if (!auth_)
    return reply_error(c, kErrState,
                       "authentication is off: this switch runs without --auth-file (JOIN without AUTH)");
  if (c.tenant != kAnonymous) return reply_error(c, kErrState, "this connection is already authenticated");
  c.nonce = random_hex(32);
  reply(c, Line(GS_REPLY_OK).add(GS_KEY_NONCE, c.nonce).str());
}

namespace {
// AUTH backoff (docs/protocol.md §1.5): a source address or a tenant name has kFreeFailures failed
// AUTHs answered at once; after that, the next AUTH of that key is answered no earlier than a delay
// after the last failure's answer, doubling from kFirstDelayNs to kMaxDelayNs. Whether the AUTH is
// right or wrong, its answer waits the same, so the timing of an answer tells nothing about the
// guess; the check itself is done on arrival, and the answer waits on a timer (the loop goes on).
constexpr uint32_t kFreeFailures = 3;
constexpr uint64_t kFirstDelayNs = 500'000'000, kMaxDelayNs = 8'000'000'000;
// Answers one address may have waiting at once: more AUTHs from it meanwhile are refused unchecked,
// so that many connections from one address do not multiply its guesses.
constexpr size_t kMaxWaitingPerAddress = 2;
// Each backoff table holds this many keys at most (the one whose last failure is oldest makes
// room), and forgets a key after kForgetNs without a failure.
constexpr size_t kMaxBackoffKeys = 4096;
constexpr uint64_t kForgetNs = 15ull * 60 * 1'000'000'000;
// Failed AUTHs are logged one by one up to kAuthLogLines per kAuthLogIntervalNs; the rest of the
// interval is one summary line with their count.
constexpr uint64_t kAuthLogIntervalNs = 10'000'000'000;
constexpr uint64_t kAuthLogLines = 5;

uint64_t delay_after(uint32_t failures) {
  if (failures < kFreeFailures) return 0;
  return std::min(kMaxDelayNs, kFirstDelayNs << std::min<uint32_t>(failures - kFreeFailures, 8));
}

// The time before which the next AUTH of `key` is not answered (0: at once).
template <typename Table, typename Key>
uint64_t ready_ns(const Table& table, const Key& key) {
  auto it = table.find(key);
  return it == table.end() || it->second.failures < kFreeFailures ? 0 : it->second.ready_ns;
}

template <typename Table, typename Key>
void note_failure(Table& table, const Key& key, uint64_t now_ns, uint64_t answer_ns) {
  auto it = table.find(key);
  if (it == table.end()) {
    if (table.size() >= kMaxBackoffKeys)
      table.erase(std::min_element(table.begin(), table.end(), [](const auto& a, const auto& b) {
        return a.second.last_ns < b.second.last_ns;
      }));
    it = table.emplace(key, typename Table::mapped_type{}).first;
  }
  auto& e = it->second;
  ++e.failures;
  e.last_ns = now_ns;
  e.ready_ns = answer_ns + delay_after(e.failures);
}

template <typename Table>
void forget_old(Table& table, uint64_t now_ns) {
  for (auto it = table.begin(); it != table.end();)
    it = now_ns - it->second.last_ns > kForgetNs ? table.erase(it) : std::next(it);
}
}  // namespace

void ControlPlane::handle_auth(Conn& c, const Request& r, uint64_t now_ns) {
  Error err;
  auto a = parse_auth(r, &err);
  if (!a) return reply_error(c, err.code, err.message);
  if (!auth_)
    return reply_error(c, kErrState,
                       "authentication is off: this switch runs without --auth-file (JOIN without AUTH)");
  if (c.tenant != kAnonymous) return reply_error(c, kErrState, "this connection is already authenticated");
  if (c.role != Conn::Role::kNone)
    return reply_error(c, kErrState, "AUTH comes before JOIN (this connection already joined)");
  if (c.nonce.empty()) return reply_error(c, kErrState, "AUTH answers a CHALLENGE: send CHALLENGE first");
  const std::string nonce = std::move(c.nonce);  // one AUTH per challenge, right or wrong
  c.nonce.clear();
  // When the answer goes: decided before the proof is checked, from past failures only.
  uint64_t answer_ns =
      std::max({now_ns, ready_ns(auth_by_addr_, c.peer_ipv4_be), ready_ns(auth_by_tenant_, a->tenant)});
  answer_ns = std::min(answer_ns, now_ns + kMaxDelayNs);
  if (answer_ns > now_ns) {
    size_t waiting = 0;
    for (auto& [at, id] : deferred_auth_)
      if (auto it = conns_.find(id); it != conns_.end() && it->second->peer_ipv4_be == c.peer_ipv4_be)
        ++waiting;
    if (waiting >= kMaxWaitingPerAddress)
      return close_with_error(c, GS_ERR_AUTH,
                              "too many AUTH attempts waiting from this address after failed ones; try again "
                              "in a few seconds; closing the connection");
  }
  const int t = auth_->find(a->tenant);
  // An unknown tenant costs the same HMAC as a wrong secret: the reply's timing names no tenant.
  static const std::string no_secret = random_hex(32);
  const std::string& secret = t >= 0 ? auth_->tenants[t].secret : no_secret;
  const std::string expected = auth_proof(GS_AUTH_CLIENT_LABEL, secret, a->tenant, nonce, a->cnonce);
  int tenant = kAnonymous;
  std::string reply_text;
  if (!constant_time_equal(expected, a->proof) || t < 0) {
    note_failure(auth_by_addr_, c.peer_ipv4_be, now_ns, answer_ns);
    note_failure(auth_by_tenant_, a->tenant, now_ns, answer_ns);
    log_auth_failure(c, a->tenant, now_ns);
    reply_text = "authentication failed (unknown tenant or wrong secret); closing the connection";
  } else {
    const Tenant& entry = auth_->tenants[t];
    tenant = t;
    auth_by_addr_.erase(c.peer_ipv4_be);
    auth_by_tenant_.erase(a->tenant);
    reply_text = Line(GS_REPLY_OK)
                     .add(GS_KEY_TENANT, entry.name)
                     .add(GS_KEY_ROLE, entry.is_operator ? GS_ROLE_OPERATOR : GS_ROLE_TENANT)
                     .add(GS_KEY_PROOF, auth_proof(GS_AUTH_SWITCH_LABEL, secret, a->tenant, nonce, a->cnonce))
                     .str();
  }
  if (answer_ns <= now_ns) return complete_auth(c, tenant, reply_text);
  c.auth_wait = Conn::DeferredAuth{answer_ns, tenant, std::move(reply_text)};
  deferred_auth_.emplace(answer_ns, c.id);
}

void ControlPlane::complete_auth(Conn& c, int tenant, const std::string& reply_text) {
  if (tenant == kAnonymous) return close_with_error(c, GS_ERR_AUTH, reply_text);
  const Tenant& entry = auth_->tenants[tenant];
  c.tenant = tenant;
  c.privileged = entry.is_operator;
  GS_LOG_DEBUG("control: %s authenticated as %s '%s'", c.peer.c_str(),
               entry.is_operator ? "operator" : "tenant", entry.name.c_str());
  reply(c, reply_text);
  enforce_tenant_connections(tenant);
}

void ControlPlane::answer_deferred_auths(uint64_t now_ns) {
  while (!deferred_auth_.empty() && deferred_auth_.begin()->first <= now_ns) {
    const uint64_t id = deferred_auth_.begin()->second;
    deferred_auth_.erase(deferred_auth_.begin());
    auto it = conns_.find(id);
    if (it == conns_.end() || !it->second->auth_wait) continue;  // closed or evicted meanwhile
    Conn& c = *it->second;
    Conn::DeferredAuth d = std::move(*c.auth_wait);
    c.auth_wait.reset();
    if (c.dead || c.closing) continue;
    complete_auth(c, d.tenant, d.reply);
    if (d.tenant != kAnonymous) process_lines(c, now_ns);  // what it sent behind the AUTH
  }
}

void ControlPlane::enforce_tenant_connections(int tenant) {
  std::vector<Conn*> outside;  // oldest first: conns_ is ordered by id
  for (auto& [id, c] : conns_)
    if (c->tenant == tenant && outside_job(*c) && !c->dead && !c->closing) outside.push_back(c.get());
  if (outside.size() <= config_.max_tenant_connections) return;
  const Tenant& entry = auth_->tenants[tenant];
  for (size_t i = 0; i < outside.size() - config_.max_tenant_connections; ++i)
    close_with_error(*outside[i], kErrNoResources,
                     std::string(entry.is_operator ? "operator '" : "tenant '") + entry.name +
                         "' holds more than " + std::to_string(config_.max_tenant_connections) +
                         " authenticated connections outside a job (--max-tenant-connections): its oldest is "
                         "closed; closing the connection");
}

void ControlPlane::log_auth_failure(const Conn& c, const std::string& tenant, uint64_t now_ns) {
  if (auth_log_interval_end_ns_ == 0) auth_log_interval_end_ns_ = now_ns + kAuthLogIntervalNs;
  if (auth_log_lines_ < kAuthLogLines) {
    ++auth_log_lines_;
    GS_LOG_WARN("control: %s failed AUTH as tenant '%s'%s", c.peer.c_str(), tenant.c_str(),
                auth_log_lines_ == kAuthLogLines
                    ? " (more failures in the next seconds are counted, not listed)"
                    : "");
    return;
  }
  ++auth_log_suppressed_;
  auth_log_last_ = "from " + c.peer + " as tenant '" + tenant + "'";
}

void ControlPlane::flush_auth_log(uint64_t now_ns) {
  if (now_ns >= next_backoff_sweep_ns_) {
    forget_old(auth_by_addr_, now_ns);
    forget_old(auth_by_tenant_, now_ns);
    next_backoff_sweep_ns_ = now_ns + kAuthLogIntervalNs;
  }
  if (auth_log_interval_end_ns_ == 0 || now_ns < auth_log_interval_end_ns_) return;
  if (auth_log_suppressed_ > 0)
    GS_LOG_WARN("control: %llu more failed AUTHs in the last %llu s, not logged one by one (the last %s)",
                static_cast<unsigned long long>(auth_log_suppressed_),
                static_cast<unsigned long long>(kAuthLogIntervalNs / 1'000'000'000), auth_log_last_.c_str());
  auth_log_interval_end_ns_ = auth_log_lines_ = auth_log_suppressed_ = 0;
  auth_log_last_.clear();
}

void ControlPlane::handle_abort(Conn& c, const Request& r) {
  Error err;
  auto id = parse_abort(r, &err);
  if (!id) return reply_error(c, err.code, err.message);
  if (!c.privileged)
    return reply_error(c, GS_ERR_AUTH,
                       "ABORT is the operator's: AUTH with an operator entry of the auth file");
  auto it = live_.find(*id);
  if (it == live_.end()) return reply_error(c, kErrNotFound, "no running job with id " + std::to_string(*id));
  LiveJob& j = *it->second;
  if (j.aborted) return reply_error(c, kErrState, "job " + std::to_string(*id) + " was already aborted");
  abort_live(j, GS_ABORT_OPERATOR, GS_RANK_ALL, "aborted by the operator at " + c.peer);
  reply(c, GS_REPLY_OK "\n");
}

Viewer ControlPlane::viewer_of(const Conn& c) const {
  Viewer v;
  v.privileged = c.privileged;
  v.tenant = c.tenant;
  if (c.role == Conn::Role::kJoined || c.role == Conn::Role::kLeft) v.job = c.job_id;
  return v;
}

bool ControlPlane::can_see(const Conn& c, uint32_t job_id) const {
  auto it = live_.find(job_id);
  return may_see(viewer_of(c), job_id, it != live_.end() ? it->second->tenant : kAnonymous);
}

std::optional<Viewer> ControlPlane::metrics_viewer(std::string_view bearer) const {
  if (!auth_) return Viewer{true, kAnonymous, std::nullopt};  // loopback trust, as on the control port
  const int t = auth_->find_metrics_token(bearer);
  if (t < 0) return std::nullopt;
  return Viewer{auth_->tenants[t].is_operator, t, std::nullopt};
}

int ControlPlane::owner_of(std::string_view scoped) const {
  // The inverse of scoped_name(): a JOIN's own name has no '/' (is_valid_name), so one in a job's
  // name was put there by the switch, after its tenant's name.
  const size_t sep = scoped.find(GS_TENANT_SEPARATOR);
  if (!auth_ || sep == std::string_view::npos) return kAnonymous;
  return auth_->find(scoped.substr(0, sep));
}

bool ControlPlane::may_see_job(const Viewer& v, const JobStatus& s) const {
  return may_see(v, s.job_id, owner_of(s.name));
}

std::string ControlPlane::scoped_name(const Conn& c, const std::string& name) const {
  return c.tenant == kAnonymous ? name : auth_->tenants[c.tenant].name + GS_TENANT_SEPARATOR + name;
}

std::string ControlPlane::join_refusal(const Conn& c) const {
  if (!auth_) return "";
  if (c.tenant == kAnonymous && !auth_->anonymous)
    return "this switch needs AUTH before JOIN (CHALLENGE, then AUTH tenant=<name> cnonce=<hex> proof=<hex>: "
           "docs/protocol.md section 1.5); give the client its tenant and secret";
  if (c.tenant != kAnonymous && auth_->tenants[c.tenant].is_operator)
    return "operator credentials watch and abort jobs; a job joins as a tenant";
  return "";
}

std::string ControlPlane::quota_refusal(int tenant, size_t memory) const {
  if (!auth_) return "";  // anonymous switch: the switch's own limits are the only quota
  const Quota& q = tenant == kAnonymous ? *auth_->anonymous : auth_->tenants[tenant].quota;
  const std::string who =
      tenant == kAnonymous ? std::string("anonymous use") : "tenant '" + auth_->tenants[tenant].name + "'";
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

void ControlPlane::draw_id_and_key(JobSpec* spec) const {
  do secure_random(&spec->id, sizeof spec->id);
  while (!engine_.id_usable(spec->id));
  do secure_random(&spec->key, sizeof spec->key);
  while (spec->key == 0);
}

}  // namespace gradswitch
