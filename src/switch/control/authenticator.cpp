// Who a control connection is (see authenticator.h): CHALLENGE and AUTH (a tenant or an operator
// proves its secret), the backoff after failed AUTHs, the handshake deadline, the tenant connection
// cap, scoped job names, and what a connection or a metrics token may see.
#include "switch/control/authenticator.h"

#include <algorithm>
#include <iterator>
#include <vector>

#include "common/challenge.h"
#include "common/sha256.h"
#include "switch/log.h"

namespace gradswitch::control {

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

constexpr const char* kAuthOff =
    "authentication is off: this switch runs without --auth-file (JOIN without AUTH)";
}  // namespace

Authenticator::Authenticator(const SwitchConfig& config, Connections& conns, ConnectionHandler& handler)
    : config_(config), conns_(conns), handler_(handler) {}

void Authenticator::use(AuthTable table) {
  table_ = std::make_shared<const AuthTable>(std::move(table));
  publish();
}

void Authenticator::publish() {
  std::lock_guard<std::mutex> lock(published_mutex_);
  published_ = table_;
}

std::shared_ptr<const AuthTable> Authenticator::published() const {
  std::lock_guard<std::mutex> lock(published_mutex_);
  return published_;
}

std::optional<AuthChange> Authenticator::reload() {
  if (!table_) {
    GS_LOG_WARN("SIGHUP: this switch runs without --auth-file: there is no auth file to read again");
    return std::nullopt;
  }
  std::string error;
  auto fresh = load_auth_file(config_.auth_file, {config_.max_jobs, config_.max_memory}, &error,
                              config_.tenant_share_percent);
  if (!fresh) {
    ++reload_failures_;
    GS_LOG_ERROR("SIGHUP: refused the new auth file: %s; the tenants, secrets and quotas in force stay",
                 error.c_str());
    return std::nullopt;
  }
  AuthChange change;
  table_ = std::make_shared<const AuthTable>(merge_reloaded(*table_, *fresh, &change));
  publish();
  ++reloads_;
  GS_LOG_INFO("SIGHUP: auth file %s read again: %zu tenants and operators (%s); running jobs go on",
              config_.auth_file.c_str(), fresh->tenants.size(), change.summary().c_str());
  return change;
}

bool Authenticator::lost_tenant(const AuthChange& change, int tenant) {
  if (tenant == kAnonymous) return change.anonymous_gone;
  return static_cast<size_t>(tenant) < change.tenants.size() && change.tenants[tenant] == AuthChange::kGone;
}

void Authenticator::settle_connections(const AuthChange& change) {
  for (auto& [id, cp] : conns_.all()) {
    Conn& c = *cp;
    // An AUTH answered later was checked against the old table: it is checked as of now instead.
    const int tenant = c.auth_wait ? c.auth_wait->tenant : c.tenant;
    if (tenant == kAnonymous || static_cast<size_t>(tenant) >= change.tenants.size()) continue;
    const AuthChange::What what = change.tenants[tenant];
    if (what == AuthChange::kKept || c.dead || c.closing) continue;
    const std::string why =
        "'" + table_->tenants[tenant].name + "' " +
        (what == AuthChange::kGone ? "is no longer in the auth file" : "has a new secret") +
        " (read again on SIGHUP)";
    if (c.auth_wait) {
      c.auth_wait->tenant = kAnonymous;
      c.auth_wait->reply = "authentication failed: " + why + "; closing the connection";
    } else if (Connections::outside_job(c)) {
      conns_.close_with_error(c, GS_ERR_AUTH, why + ": authenticate again; closing the connection");
    }
  }
}

void Authenticator::handle_challenge(Conn& c, const Request& r) {
  Error err;
  if (!parse_no_args(r, &err)) return conns_.reply_error(c, err.code, err.message);
  if (!table_) return conns_.reply_error(c, kErrState, kAuthOff);
  if (c.tenant != kAnonymous)
    return conns_.reply_error(c, kErrState, "this connection is already authenticated");
  c.nonce = random_hex(32);
  conns_.reply(c, Line(GS_REPLY_OK).add(GS_KEY_NONCE, c.nonce).str());
}

std::optional<uint64_t> Authenticator::answer_time(Conn& c, const std::string& tenant, uint64_t now_ns) {
  // Decided before the proof is checked, from past failures only.
  uint64_t answer_ns = std::max({now_ns, ready_ns(by_addr_, c.peer_ipv4_be), ready_ns(by_tenant_, tenant)});
  answer_ns = std::min(answer_ns, now_ns + kMaxDelayNs);
  if (answer_ns > now_ns) {
    size_t waiting = 0;
    for (auto& [at, id] : deferred_)
      if (const Conn* other = conns_.find(id); other && other->peer_ipv4_be == c.peer_ipv4_be) ++waiting;
    if (waiting >= kMaxWaitingPerAddress) {
      conns_.close_with_error(c, GS_ERR_AUTH,
                              "too many AUTH attempts waiting from this address after failed ones; try again "
                              "in a few seconds; closing the connection");
      return std::nullopt;
    }
  }
  return answer_ns;
}

void Authenticator::handle_auth(Conn& c, const Request& r, uint64_t now_ns) {
  Error err;
  auto a = parse_auth(r, &err);
  if (!a) return conns_.reply_error(c, err.code, err.message);
  if (!table_) return conns_.reply_error(c, kErrState, kAuthOff);
  if (c.tenant != kAnonymous)
    return conns_.reply_error(c, kErrState, "this connection is already authenticated");
  if (c.role != Conn::Role::kNone)
    return conns_.reply_error(c, kErrState, "AUTH comes before JOIN (this connection already joined)");
  if (c.nonce.empty())
    return conns_.reply_error(c, kErrState, "AUTH answers a CHALLENGE: send CHALLENGE first");
  const std::string nonce = std::move(c.nonce);  // one AUTH per challenge, right or wrong
  c.nonce.clear();
  const std::optional<uint64_t> when = answer_time(c, a->tenant, now_ns);
  if (!when) return;
  const uint64_t answer_ns = *when;
  const int t = table_->find(a->tenant);
  // An unknown tenant costs the same HMAC as a wrong secret: the reply's timing names no tenant.
  static const std::string no_secret = random_hex(32);
  const std::string& secret = t >= 0 ? table_->tenants[t].secret : no_secret;
  const std::string expected = auth_proof(GS_AUTH_CLIENT_LABEL, secret, a->tenant, nonce, a->cnonce);
  int tenant = kAnonymous;
  std::string reply_text;
  if (!constant_time_equal(expected, a->proof) || t < 0) {
    note_failure(by_addr_, c.peer_ipv4_be, now_ns, answer_ns);
    note_failure(by_tenant_, a->tenant, now_ns, answer_ns);
    log_failure(c, a->tenant, now_ns);
    reply_text = "authentication failed (unknown tenant or wrong secret); closing the connection";
  } else {
    const Tenant& entry = table_->tenants[t];
    tenant = t;
    by_addr_.erase(c.peer_ipv4_be);
    by_tenant_.erase(a->tenant);
    reply_text = Line(GS_REPLY_OK)
                     .add(GS_KEY_TENANT, entry.name)
                     .add(GS_KEY_ROLE, entry.is_operator ? GS_ROLE_OPERATOR : GS_ROLE_TENANT)
                     .add(GS_KEY_PROOF, auth_proof(GS_AUTH_SWITCH_LABEL, secret, a->tenant, nonce, a->cnonce))
                     .str();
  }
  if (answer_ns <= now_ns) return complete_auth(c, tenant, reply_text);
  c.auth_wait = Conn::DeferredAuth{answer_ns, tenant, std::move(reply_text)};
  deferred_.emplace(answer_ns, c.id);
}

void Authenticator::complete_auth(Conn& c, int tenant, const std::string& reply_text) {
  if (tenant == kAnonymous) return conns_.close_with_error(c, GS_ERR_AUTH, reply_text);
  const Tenant& entry = table_->tenants[tenant];
  c.tenant = tenant;
  c.privileged = entry.is_operator;
  GS_LOG_DEBUG("control: %s authenticated as %s '%s'", c.peer.c_str(),
               entry.is_operator ? "operator" : "tenant", entry.name.c_str());
  conns_.reply(c, reply_text);
  enforce_tenant_connections(tenant);
}

void Authenticator::answer_deferred(uint64_t now_ns) {
  while (!deferred_.empty() && deferred_.begin()->first <= now_ns) {
    const uint64_t id = deferred_.begin()->second;
    deferred_.erase(deferred_.begin());
    Conn* cp = conns_.find(id);
    if (!cp || !cp->auth_wait) continue;  // closed or evicted meanwhile
    Conn& c = *cp;
    Conn::DeferredAuth d = std::move(*c.auth_wait);
    c.auth_wait.reset();
    if (c.dead || c.closing) continue;
    complete_auth(c, d.tenant, d.reply);
    if (d.tenant != kAnonymous) handler_.on_input(c, now_ns);  // what it sent behind the AUTH
  }
}

void Authenticator::forget_deferred(const Conn& c) {
  if (!c.auth_wait) return;
  auto [first, last] = deferred_.equal_range(c.auth_wait->at_ns);
  for (auto it = first; it != last; ++it)
    if (it->second == c.id) {
      deferred_.erase(it);
      return;
    }
}

void Authenticator::enforce_tenant_connections(int tenant) {
  std::vector<Conn*> outside;  // oldest first: connections are ordered by id
  for (auto& [id, c] : conns_.all())
    if (c->tenant == tenant && Connections::outside_job(*c) && !c->dead && !c->closing)
      outside.push_back(c.get());
  if (outside.size() <= config_.max_tenant_connections) return;
  const Tenant& entry = table_->tenants[tenant];
  for (size_t i = 0; i < outside.size() - config_.max_tenant_connections; ++i)
    conns_.close_with_error(*outside[i], kErrNoResources,
                            std::string(entry.is_operator ? "operator '" : "tenant '") + entry.name +
                                "' holds more than " + std::to_string(config_.max_tenant_connections) +
                                " authenticated connections outside a job (--max-tenant-connections): its "
                                "oldest is closed; closing the connection");
}

void Authenticator::check_deadlines(uint64_t now_ns) {
  if (!table_) return;
  const uint64_t limit_ns = uint64_t(config_.handshake_timeout_s) * 1'000'000'000ull;
  const std::string secs = std::to_string(config_.handshake_timeout_s);
  std::map<int, size_t> outside_by_tenant;
  for (auto& [id, cp] : conns_.all()) {
    Conn& c = *cp;
    if (c.dead || c.closing || c.role == Conn::Role::kUplink) continue;
    const bool outside = Connections::outside_job(c);
    if (c.tenant != kAnonymous && outside) ++outside_by_tenant[c.tenant];
    if (!outside)
      c.outside_since_ns = 0;
    else if (c.outside_since_ns == 0)
      c.outside_since_ns = now_ns;  // it left its job, or its JOIN failed: the clock starts again
    // An AUTH waiting for its deferred answer waits for the switch, not for the client.
    if (conns_.in_unauth_pool(c) && !c.auth_wait && now_ns - c.outside_since_ns >= limit_ns) {
      conns_.close_with_error(
          c, kErrTimeout,
          "no AUTH or JOIN within " + secs + " s (--handshake-timeout); closing the connection");
    } else if (c.partial_since_ns && !c.bin && c.in.buffered() > 0 &&
               now_ns - c.partial_since_ns >= limit_ns) {
      handler_.on_depart(c, now_ns);  // a rank that cannot finish its line is gone
      conns_.close_with_error(c, kErrTimeout,
                              "an incomplete request line (no newline) for " + secs +
                                  " s (--handshake-timeout); closing the connection");
    }
  }
  // A tenant's connections that left their jobs count too (AUTH checks it when it adds one).
  for (auto& [tenant, n] : outside_by_tenant)
    if (n > config_.max_tenant_connections) enforce_tenant_connections(tenant);
}

void Authenticator::log_failure(const Conn& c, const std::string& tenant, uint64_t now_ns) {
  if (log_interval_end_ns_ == 0) log_interval_end_ns_ = now_ns + kAuthLogIntervalNs;
  if (log_lines_ < kAuthLogLines) {
    ++log_lines_;
    GS_LOG_WARN(
        "control: %s failed AUTH as tenant '%s'%s", c.peer.c_str(), tenant.c_str(),
        log_lines_ == kAuthLogLines ? " (more failures in the next seconds are counted, not listed)" : "");
    return;
  }
  ++log_suppressed_;
  log_last_ = "from " + c.peer + " as tenant '" + tenant + "'";
}

void Authenticator::flush_log(uint64_t now_ns) {
  if (now_ns >= next_backoff_sweep_ns_) {
    forget_old(by_addr_, now_ns);
    forget_old(by_tenant_, now_ns);
    next_backoff_sweep_ns_ = now_ns + kAuthLogIntervalNs;
  }
  if (log_interval_end_ns_ == 0 || now_ns < log_interval_end_ns_) return;
  if (log_suppressed_ > 0)
    GS_LOG_WARN("control: %llu more failed AUTHs in the last %llu s, not logged one by one (the last %s)",
                static_cast<unsigned long long>(log_suppressed_),
                static_cast<unsigned long long>(kAuthLogIntervalNs / 1'000'000'000), log_last_.c_str());
  log_interval_end_ns_ = log_lines_ = log_suppressed_ = 0;
  log_last_.clear();
}

Viewer Authenticator::viewer_of(const Conn& c) const {
  Viewer v;
  v.privileged = c.privileged;
  v.tenant = c.tenant;
  if (c.role == Conn::Role::kJoined || c.role == Conn::Role::kLeft) v.job = c.job_id;
  return v;
}

std::optional<Viewer> Authenticator::metrics_viewer(std::string_view bearer) const {
  const std::shared_ptr<const AuthTable> table = published();
  if (!table) return Viewer{true, kAnonymous, std::nullopt};  // loopback trust, as on the control port
  const int t = table->find_metrics_token(bearer);
  if (t < 0) return std::nullopt;
  return Viewer{table->tenants[t].is_operator, t, std::nullopt};
}

int Authenticator::owner_of(const AuthTable& t, std::string_view scoped) {
  // The inverse of scoped_name(): a JOIN's own name has no '/' (is_valid_name), so one in a job's
  // name was put there by the switch, after its tenant's name.
  const size_t sep = scoped.find(GS_TENANT_SEPARATOR);
  if (sep == std::string_view::npos) return kAnonymous;
  return t.find(scoped.substr(0, sep));
}

bool Authenticator::may_see_job(const Viewer& v, const JobStatus& s) const {
  const std::shared_ptr<const AuthTable> table = published();
  return may_see(v, s.job_id, table ? owner_of(*table, s.name) : kAnonymous);
}

std::string Authenticator::scoped_name(const Conn& c, const std::string& name) const {
  return c.tenant == kAnonymous ? name : table_->tenants[c.tenant].name + GS_TENANT_SEPARATOR + name;
}

std::string Authenticator::join_refusal(const Conn& c) const {
  if (!table_) return "";
  if (c.tenant == kAnonymous && !table_->anonymous)
    return "this switch needs AUTH before JOIN (CHALLENGE, then AUTH tenant=<name> cnonce=<hex> proof=<hex>: "
           "docs/protocol.md section 1.5); give the client its tenant and secret";
  if (c.tenant != kAnonymous && table_->tenants[c.tenant].is_operator)
    return "operator credentials watch and abort jobs; a job joins as a tenant";
  if (c.tenant != kAnonymous && table_->tenants[c.tenant].retired)
    return "'" + table_->tenants[c.tenant].name + "' is no longer in the auth file (read again on SIGHUP)";
  return "";
}

const Quota& Authenticator::quota_of(int tenant) const {
  return tenant == kAnonymous ? *table_->anonymous : table_->tenants[tenant].quota;
}

std::string Authenticator::quota_holder(int tenant) const {
  return tenant == kAnonymous ? std::string("anonymous use")
                              : "tenant '" + table_->tenants[tenant].name + "'";
}

}  // namespace gradswitch::control
