// Tenants: the auth file (--auth-file) that names them, their secrets and quotas, and the operators
// (docs/security.md). Pure parsing, no sockets, so that it can be unit tested and fuzzed; the
// control plane's Authenticator (authenticator.h) and Jobs use the table to authenticate connections
// and enforce quotas.
//
// Format: one entry per line, fields separated by spaces, `#` starts a comment:
//   tenant NAME secret=SECRET [max_jobs=N] [max_memory=BYTES]
//   operator NAME secret=SECRET
//   anonymous [max_jobs=N] [max_memory=BYTES]     unauthenticated JOINs allowed, one shared quota
//   defaults [max_jobs=N] [max_memory=BYTES]      quotas of tenants that give none
// Without a `defaults` entry, a quota left out is a share of the switch's limits (--tenant-share,
// default_quota()), so that no tenant with defaults can take the whole job table or memory budget.
//
// Also here, because the control plane and the metrics endpoint share them: who may see which job
// (Viewer, may_see) and the metrics endpoint's bearer tokens, derived from the secrets.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gradswitch::control {

struct Quota {
  uint64_t max_jobs = 0;    // jobs running or joining at once
  uint64_t max_memory = 0;  // bytes reserved by them (slots, optimizer state)
};

struct Tenant {
  std::string name;
  std::string secret;
  bool is_operator = false;  // sees and may abort every job; joins none
  Quota quota;
  // Gone from the auth file at a reload (merge_reloaded): kept so that the jobs it still runs keep
  // their tenant; no AUTH, no metrics token, no name lookup finds it.
  bool retired = false;
};

// The tenant of an unauthenticated connection and of its jobs.
inline constexpr int kAnonymous = -1;

struct AuthTable {
  std::vector<Tenant> tenants;
  std::optional<Quota> anonymous;  // set: JOIN without AUTH is allowed, under this shared quota
  // Per tenant (same index): its metrics token, metrics_token(secret, name).
  std::vector<std::string> metrics_tokens;
  // The tenant named `name` (not a retired one), or -1.
  int find(std::string_view name) const;
  // The tenant whose metrics token `token` is, or -1. Compares with every entry's token, each in
  // constant time and without stopping at a match, so that the time taken tells nothing.
  int find_metrics_token(std::string_view token) const;
};

// Who asks about jobs (STATUS, STATS, JOBS on a connection; GET /metrics with a token), and so
// what it may see (docs/security.md "Who can do what").
struct Viewer {
  bool privileged = false;      // an operator, or anyone on a switch without --auth-file: every job
  int tenant = kAnonymous;      // an authenticated tenant: every job of that tenant
  std::optional<uint32_t> job;  // the job this connection joined (anonymous ranks see theirs)
};
// The one rule: privileged, its own job, or a job of its own (authenticated) tenant.
bool may_see(const Viewer& v, uint32_t job_id, int job_tenant);

// The bearer token of GET /metrics for the entry `name` with `secret`: HMAC-SHA-256(secret,
// GS_METRICS_TOKEN_LABEL "\n" name) in lower-case hex. Derived, so that the secret itself never
// crosses the network (HTTP carries the token in clear) and a token grants reading metrics only:
// it proves nothing in AUTH (docs/observability.md).
std::string metrics_token(std::string_view secret, std::string_view name);

// The share of the switch's limits a tenant gets by default (--tenant-share's default).
inline constexpr unsigned kDefaultTenantSharePercent = 50;

// `percent` of each limit, rounded down, and at least 1 job and 1 byte.
Quota default_quota(const Quota& limits, unsigned percent);

// Parses an auth file's text. `limits` are the switch's own (--max-jobs, --max-memory): no quota may
// exceed them; a quota that neither the entry nor a `defaults` entry gives is `share_percent` of
// them (default_quota). The error names the line.
std::optional<AuthTable> parse_auth_file(std::string_view text, const Quota& limits, std::string* error,
                                         unsigned share_percent = kDefaultTenantSharePercent);

// Reads `path` (it must not be readable by group or others: it holds secrets) and parses it.
std::optional<AuthTable> load_auth_file(const std::string& path, const Quota& limits, std::string* error,
                                        unsigned share_percent = kDefaultTenantSharePercent);

// What re-reading the auth file changed (SIGHUP, docs/security.md "Changing the auth file"), per
// index of the table in force before.
struct AuthChange {
  enum What : uint8_t { kKept, kNewSecret, kGone };  // kGone: removed, or now of the other role
  std::vector<What> tenants;
  bool anonymous_gone = false;  // unauthenticated JOINs were allowed and are no longer
  size_t added = 0, new_secrets = 0, gone = 0;
  std::string summary() const;  // "1 added, 1 removed, 1 with a new secret"
};

// The table that replaces `old` when the file is read again: `fresh`'s entries and quotas, each
// entry that `old` had at the same index (so that a job's or a connection's tenant index keeps
// naming the same tenant), a removed entry kept there as a retired one, and new entries after them.
// An entry whose role changed is retired and its name given to a new entry.
AuthTable merge_reloaded(const AuthTable& old, const AuthTable& fresh, AuthChange* change);

// [A-Za-z0-9._-]{1,64}: tenant names (no '/' and no ':', so that "tenant/job" reads back).
bool is_valid_tenant_name(std::string_view s);
// 16..256 characters of [A-Za-z0-9._~+/=-]: long enough not to be guessed, safe on a line.
bool is_valid_secret(std::string_view s);

}  // namespace gradswitch::control
