// The auth file (see auth.h).
#include "switch/control/auth.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/sha256.h"
#include "gradswitch/control.h"
#include "switch/config.h"
#include "switch/options/values.h"

namespace gradswitch::control {

namespace {

bool in_charset(std::string_view s, std::string_view extra) {
  return std::all_of(s.begin(), s.end(), [&](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           extra.find(c) != std::string_view::npos;
  });
}

// One `key=value` field of an entry into the tenant or quota it describes.
bool apply_field(std::string_view field, const Quota& limits, Tenant* t, Quota* q, std::string* why) {
  const size_t eq = field.find('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 == field.size())
    return *why = "expected key=value, got '" + std::string(field.substr(0, 40)) + "'", false;
  const std::string key(field.substr(0, eq)), value(field.substr(eq + 1));
  if (key == "secret") {
    if (!t) return *why = "this entry takes no secret", false;
    if (!is_valid_secret(value))
      return *why =
                 "the secret must be 16..256 characters of [A-Za-z0-9._~+/=-] (e.g. `openssl rand -hex 32`)",
             false;
    t->secret = value;
    return true;
  }
  if (key == "max_jobs") {
    if (!q) return *why = "an operator has no quota", false;
    return option_values::parse_uint(value, 0, limits.max_jobs, &q->max_jobs, why) ||
           (*why = "max_jobs: " + *why + " (at most --max-jobs)", false);
  }
  if (key == "max_memory") {
    if (!q) return *why = "an operator has no quota", false;
    if (!option_values::parse_bytes(value, &q->max_memory, why)) return *why = "max_memory: " + *why, false;
    if (q->max_memory > limits.max_memory)
      return *why =
                 "max_memory " + value + " exceeds --max-memory (" + std::to_string(limits.max_memory) + ")",
             false;
    return true;
  }
  return *why = "unknown key '" + key + "' (secret, max_jobs, max_memory)", false;
}

}  // namespace

int AuthTable::find(std::string_view name) const {
  for (size_t i = 0; i < tenants.size(); ++i)
    if (!tenants[i].retired && tenants[i].name == name) return static_cast<int>(i);
  return -1;
}

int AuthTable::find_metrics_token(std::string_view token) const {
  int found = -1;
  for (size_t i = 0; i < metrics_tokens.size(); ++i)  // a retired entry's token is empty
    if (!metrics_tokens[i].empty() && constant_time_equal(metrics_tokens[i], token))
      found = static_cast<int>(i);
  return found;
}

bool may_see(const Viewer& v, uint32_t job_id, int job_tenant) {
  return v.privileged || (v.job && *v.job == job_id) || (v.tenant != kAnonymous && v.tenant == job_tenant);
}

std::string metrics_token(std::string_view secret, std::string_view name) {
  std::string message = GS_METRICS_TOKEN_LABEL "\n";
  message += name;
  return to_hex(hmac_sha256(secret, message));
}

bool is_valid_tenant_name(std::string_view s) {
  return !s.empty() && s.size() <= 64 && in_charset(s, "._-");
}

bool is_valid_secret(std::string_view s) {
  return s.size() >= 16 && s.size() <= 256 && in_charset(s, "._~+/=-");
}

Quota default_quota(const Quota& limits, unsigned percent) {
  percent = std::min(percent, 100u);
  Quota q;
  q.max_jobs = std::max<uint64_t>(1, limits.max_jobs * percent / 100);
  // max_memory is at most 2^50 (parse_bytes): the product cannot overflow.
  q.max_memory =
      std::max<uint64_t>(1, limits.max_memory / 100 * percent + limits.max_memory % 100 * percent / 100);
  return q;
}

namespace {

// An entry as read, before the quotas it leaves out are filled in.
struct Entry {
  Tenant t;
  bool has_quota[2] = {false, false};  // max_jobs, max_memory given
};

// A line's fields: its comment cut, split on blanks.
std::vector<std::string_view> fields_of(std::string_view line) {
  if (const size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
  std::vector<std::string_view> fields;
  for (size_t i = 0; i < line.size();) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    const size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
    if (i > start) fields.push_back(line.substr(start, i - start));
  }
  return fields;
}

// One entry's fields into `p`; "" or what is wrong with it. `entries`: the named ones before it.
std::string parse_entry(const std::vector<std::string_view>& fields, const Quota& limits,
                        const std::vector<Entry>& entries, Entry* p) {
  const std::string_view kind = fields[0];
  if (kind != "tenant" && kind != "operator" && kind != "anonymous" && kind != "defaults")
    return "unknown entry '" + std::string(kind.substr(0, 40)) + "' (tenant, operator, anonymous, defaults)";
  const bool named = kind == "tenant" || kind == "operator";
  p->t.is_operator = kind == "operator";
  if (named) {
    if (fields.size() < 2 || !is_valid_tenant_name(fields[1]))
      return std::string(kind) + " needs a name of [A-Za-z0-9._-]{1,64}";
    p->t.name = fields[1];
    if (std::any_of(entries.begin(), entries.end(), [&](const Entry& e) { return e.t.name == p->t.name; }))
      return "'" + p->t.name + "' is named twice";
  }
  std::string why;
  for (size_t f = named ? 2 : 1; f < fields.size(); ++f) {
    if (!apply_field(fields[f], limits, named ? &p->t : nullptr, p->t.is_operator ? nullptr : &p->t.quota,
                     &why))
      return why;
    if (fields[f].rfind("max_jobs=", 0) == 0) p->has_quota[0] = true;
    if (fields[f].rfind("max_memory=", 0) == 0) p->has_quota[1] = true;
  }
  if (named && p->t.secret.empty()) return std::string(kind) + " '" + p->t.name + "' needs secret=";
  return "";
}

}  // namespace

std::optional<AuthTable> parse_auth_file(std::string_view text, const Quota& limits, std::string* error,
                                         unsigned share_percent) {
  Quota defaults = default_quota(limits, share_percent);
  std::vector<Entry> entries;
  std::optional<Entry> anonymous;
  size_t line_no = 0;
  for (size_t pos = 0; pos <= text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    const std::vector<std::string_view> fields = fields_of(text.substr(pos, nl - pos));
    pos = nl + 1;
    ++line_no;
    if (fields.empty()) continue;
    Entry p;
    std::string why = parse_entry(fields, limits, entries, &p);
    if (why.empty() && fields[0] == "anonymous" && anonymous) why = "a second 'anonymous' entry";
    if (!why.empty()) {
      *error = "line " + std::to_string(line_no) + ": " + why;
      return std::nullopt;
    }
    if (fields[0] == "defaults") {
      if (p.has_quota[0]) defaults.max_jobs = p.t.quota.max_jobs;
      if (p.has_quota[1]) defaults.max_memory = p.t.quota.max_memory;
    } else if (fields[0] == "anonymous") {
      anonymous = std::move(p);
    } else {
      entries.push_back(std::move(p));
    }
  }
  // `defaults` may come anywhere in the file: quotas an entry leaves out are filled in at the end.
  auto fill = [&](Entry& p) {
    if (!p.has_quota[0]) p.t.quota.max_jobs = defaults.max_jobs;
    if (!p.has_quota[1]) p.t.quota.max_memory = defaults.max_memory;
  };
  AuthTable table;
  for (Entry& p : entries) {
    fill(p);
    table.metrics_tokens.push_back(metrics_token(p.t.secret, p.t.name));
    table.tenants.push_back(std::move(p.t));
  }
  if (anonymous) {
    fill(*anonymous);
    table.anonymous = anonymous->t.quota;
  }
  if (table.tenants.empty() && !table.anonymous) {
    *error = "no tenant, operator or anonymous entry: nobody could use the switch";
    return std::nullopt;
  }
  return table;
}

std::optional<AuthTable> load_auth_file(const std::string& path, const Quota& limits, std::string* error,
                                        unsigned share_percent) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    *error = "--auth-file " + path + ": " + std::strerror(errno);
    return std::nullopt;
  }
  if (!S_ISREG(st.st_mode)) {  // a directory reads as an empty file: say what it is instead
    *error = "--auth-file " + path + ": not a regular file";
    return std::nullopt;
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    *error = "--auth-file " + path + " holds secrets but group or others may read it: chmod 600 " + path;
    return std::nullopt;
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) {
    *error = "--auth-file " + path + ": cannot read it";
    return std::nullopt;
  }
  auto table = parse_auth_file(text.str(), limits, error, share_percent);
  if (!table) *error = "--auth-file " + path + ": " + *error;
  return table;
}

std::string AuthChange::summary() const {
  return std::to_string(added) + " added, " + std::to_string(gone) + " removed, " +
         std::to_string(new_secrets) + " with a new secret" +
         (anonymous_gone ? ", anonymous JOINs no longer allowed" : "");
}

AuthTable merge_reloaded(const AuthTable& old, const AuthTable& fresh, AuthChange* change) {
  AuthTable out;
  out.anonymous = fresh.anonymous;
  *change = AuthChange{};
  change->anonymous_gone = old.anonymous && !fresh.anonymous;
  std::vector<bool> placed(fresh.tenants.size(), false);
  for (const Tenant& was : old.tenants) {
    const int f = fresh.find(was.name);
    const bool same_role = f >= 0 && !placed[f] && fresh.tenants[f].is_operator == was.is_operator;
    AuthChange::What what = AuthChange::kKept;
    if (same_role) {
      placed[f] = true;
      out.tenants.push_back(fresh.tenants[f]);
      out.metrics_tokens.push_back(fresh.metrics_tokens[f]);
      if (was.retired)
        ++change->added;  // back in the file: its jobs that still run are its own again
      else if (was.secret != fresh.tenants[f].secret)
        what = AuthChange::kNewSecret, ++change->new_secrets;
    } else {
      Tenant retired = was;
      retired.secret.clear();
      if (!was.retired) what = AuthChange::kGone, ++change->gone;
      retired.retired = true;
      out.tenants.push_back(std::move(retired));
      out.metrics_tokens.emplace_back();
    }
    change->tenants.push_back(what);
  }
  for (size_t f = 0; f < fresh.tenants.size(); ++f)
    if (!placed[f]) {
      out.tenants.push_back(fresh.tenants[f]);
      out.metrics_tokens.push_back(fresh.metrics_tokens[f]);
      ++change->added;
    }
  return out;
}

}  // namespace gradswitch::control
