// Who a control connection is (docs/security.md): the tenant table from --auth-file, CHALLENGE and
// AUTH with their backoff and failure log, the handshake deadline, the per-tenant connection cap,
// what a connection or a metrics token may see, and re-reading the auth file (SIGHUP) without
// dropping the jobs that run.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "switch/control/auth.h"
#include "switch/control/connections.h"

namespace gradswitch::control {

class Authenticator {
 public:
  Authenticator(const SwitchConfig& config, Connections& conns, ConnectionHandler& handler);

  // Tenants from --auth-file: JOIN then needs AUTH (or the table's anonymous entry), names are
  // scoped by tenant, quotas apply, and only operators see every job. Without it (the default)
  // every connection is anonymous and sees every job. Call before run().
  void use(AuthTable table);
  bool on() const { return table_ != nullptr; }
  const AuthTable& table() const { return *table_; }

  // Reads the auth file again (SIGHUP) and puts it in force for what comes from now on: AUTH,
  // JOIN's checks and quotas, metrics tokens. A file that does not load is refused, logged with
  // its file and line, and the table in force stays: nullopt (also without an auth file). What the
  // change means for jobs (Jobs::settle_reload), then for connections (settle_connections), is the
  // caller's to apply.
  std::optional<AuthChange> reload();
  // Closes the connections outside a job of a tenant that `change` removed or gave a new secret
  // (they must authenticate again), and answers an AUTH held by the backoff against the new table.
  void settle_connections(const AuthChange& change);
  uint64_t reloads() const { return reloads_; }
  uint64_t reload_failures() const { return reload_failures_; }
  // Whether a job or connection of `tenant` lost its tenant at the reload `change`.
  static bool lost_tenant(const AuthChange& change, int tenant);

  void handle_challenge(Conn& c, const Request& r);
  void handle_auth(Conn& c, const Request& r, uint64_t now_ns);
  void answer_deferred(uint64_t now_ns);
  void forget_deferred(const Conn& c);  // it closes before its answer
  // The handshake deadline and incomplete lines (--handshake-timeout), and the tenant connection cap
  // for connections that left their jobs.
  void check_deadlines(uint64_t now_ns);
  // The AUTH failure log's summary line, and forgetting old backoff entries.
  void flush_log(uint64_t now_ns);

  Viewer viewer_of(const Conn& c) const;
  // The name a JOIN's job has in the switch: "tenant/name" for a tenant, `name` when anonymous.
  std::string scoped_name(const Conn& c, const std::string& name) const;
  // "" when the JOIN may proceed; else why not (ERR auth).
  std::string join_refusal(const Conn& c) const;
  // The quota of `tenant` (kAnonymous: the shared anonymous one), with an auth file only; and who
  // that is, for messages.
  const Quota& quota_of(int tenant) const;
  std::string quota_holder(int tenant) const;

  // For the metrics endpoint's thread: the viewer a bearer token stands for (std::nullopt: refuse
  // the scrape; without an auth file every scrape sees everything, as every control connection
  // does), and whether it may see a job (the rule of STATUS, STATS and JOBS: may_see). They read a
  // copy of the table that reload() replaces under a lock; indices are stable across reloads, so a
  // viewer from one copy still names the same tenant in the next.
  std::optional<Viewer> metrics_viewer(std::string_view bearer) const;
  bool may_see_job(const Viewer& v, const JobStatus& s) const;

 private:
  // AUTH backoff: failures per source address and per tenant name as given (known or not, so that
  // the backoff tells nothing about which tenants exist); each table is bounded.
  struct Backoff {
    uint32_t failures = 0;
    uint64_t ready_ns = 0;  // the next AUTH of this key is answered no earlier (once failures >= free)
    uint64_t last_ns = 0;   // the last failure, for forgetting and for eviction when the table is full
  };
  // When AUTH's answer may go, from past failures; nullopt with the connection closed (too many waiting).
  std::optional<uint64_t> answer_time(Conn& c, const std::string& tenant, uint64_t now_ns);
  // Sends AUTH's answer: `tenant` >= 0 makes the connection that tenant's with the OK line `reply`;
  // kAnonymous answers ERR auth `reply` and closes.
  void complete_auth(Conn& c, int tenant, const std::string& reply);
  // A tenant beyond --max-tenant-connections authenticated connections outside a job loses its oldest.
  void enforce_tenant_connections(int tenant);
  // The AUTH failure log: a few lines per interval, then one summary line with the count.
  void log_failure(const Conn& c, const std::string& tenant, uint64_t now_ns);
  static int owner_of(const AuthTable& t, std::string_view scoped_name);
  void publish();  // the metrics thread's copy of table_
  std::shared_ptr<const AuthTable> published() const;

  const SwitchConfig& config_;
  Connections& conns_;
  ConnectionHandler& handler_;
  std::shared_ptr<const AuthTable> table_;  // the control thread's; null without --auth-file
  mutable std::mutex published_mutex_;
  std::shared_ptr<const AuthTable> published_;  // the metrics thread's
  uint64_t reloads_ = 0, reload_failures_ = 0;
  std::map<uint32_t, Backoff> by_addr_;
  std::map<std::string, Backoff> by_tenant_;
  std::multimap<uint64_t, uint64_t> deferred_;  // answer time -> connection id
  uint64_t log_interval_end_ns_ = 0, log_lines_ = 0, log_suppressed_ = 0;
  std::string log_last_;  // "from 127.0.0.5:4711 as tenant 'x'", for the summary line
  uint64_t next_backoff_sweep_ns_ = 0;
};

}  // namespace gradswitch::control
