// Who may do what (docs/security.md): CHALLENGE and AUTH (a tenant or an operator proves its
// secret), job names scoped by tenant, per-tenant quotas, what a connection may see, the operator's
// ABORT, and the random job ids and keys that make DATA unforgeable.
#include <algorithm>
#include <cinttypes>

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

void ControlPlane::handle_auth(Conn& c, const Request& r) {
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
  const int t = auth_->find(a->tenant);
  // An unknown tenant costs the same HMAC as a wrong secret: the reply's timing names no tenant.
  static const std::string no_secret = random_hex(32);
  const std::string& secret = t >= 0 ? auth_->tenants[t].secret : no_secret;
  const std::string expected = auth_proof(GS_AUTH_CLIENT_LABEL, secret, a->tenant, nonce, a->cnonce);
  if (!constant_time_equal(expected, a->proof) || t < 0) {
    GS_LOG_WARN("control: %s failed AUTH as tenant '%s'", c.peer.c_str(), a->tenant.c_str());
    return close_with_error(c, GS_ERR_AUTH,
                            "authentication failed (unknown tenant or wrong secret); closing the connection");
  }
  const Tenant& tenant = auth_->tenants[t];
  c.tenant = t;
  c.privileged = tenant.is_operator;
  GS_LOG_DEBUG("control: %s authenticated as %s '%s'", c.peer.c_str(),
               tenant.is_operator ? "operator" : "tenant", tenant.name.c_str());
  reply(c, Line(GS_REPLY_OK)
               .add(GS_KEY_TENANT, tenant.name)
               .add(GS_KEY_ROLE, tenant.is_operator ? GS_ROLE_OPERATOR : GS_ROLE_TENANT)
               .add(GS_KEY_PROOF, auth_proof(GS_AUTH_SWITCH_LABEL, secret, a->tenant, nonce, a->cnonce))
               .str());
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
