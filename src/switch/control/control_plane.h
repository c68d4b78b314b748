// The TCP control plane (docs/protocol.md section 1): joins, leaves, status and stats, and for
// optimizer jobs parameter upload, learning rate, checkpoint and restore (§1.3).
//
// One thread (the caller of run()/step()) does everything: a poll() loop over non-blocking
// sockets, line framing, and the job life cycle. Pending joins live here; the engine job is
// created once every rank has joined and destroyed once every rank's connection is gone.
// Errors answer only the connection that caused them; no input can stop the loop.
//
// The class is defined in five files along its seams: server.cpp (poll loop, connections,
// framing, dispatch, output), jobs.cpp (join, start, leave, aborts and events, timers),
// queries.cpp (STATUS, STATS, JOBS), optimizer_requests.cpp (PARAMS, SETLR, STATE_*) and leaf.cpp
// (a leaf switch's side of its spine, --uplink); control_state.h holds the records they share.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "switch/config.h"
#include "switch/control/auth.h"
#include "switch/control/parse.h"
#include "switch/engine/engine.h"

namespace gradswitch {

class ControlPlane {
 public:
  ControlPlane(Engine& engine, const SwitchConfig& config);
  ~ControlPlane();
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  // Binds control_host:control_port and listens; false with `error` set.
  bool listen(std::string* error);
  // "0.0.0.0:7700"
  std::string describe() const;

  // Serves until `stop` is set, then ends every job with ABORT(SHUTDOWN) semantics (engine
  // jobs aborted, pending joins answered with an error) and returns. Connections stay open
  // until close_all(), so that data threads can still answer DATA packets with ABORT.
  void run(const std::atomic<bool>& stop);
  // One poll() round of at most `timeout_ms`, at monotonic time `now_ns`.
  void step(int timeout_ms, uint64_t now_ns);
  void shutdown_jobs(uint64_t now_ns);
  // Closes every connection and destroys every job.
  void close_all();

  // Tenants from --auth-file: JOIN then needs AUTH (or the table's anonymous entry), names are
  // scoped by tenant, quotas apply, and only operators see every job. Without it (the default)
  // every connection is anonymous and sees every job. Call before run().
  void use_auth(control::AuthTable table);

  // Extra `key=value ...` text appended to the total STATS reply and the stats log line.
  void add_stats_source(std::function<std::string()> source);

  uint64_t jobs_started() const { return jobs_started_; }

  // For the metrics endpoint's thread (access.cpp): safe there because the auth table is fixed
  // before run(). The viewer a bearer token stands for (std::nullopt: refuse the scrape; without an
  // auth file every scrape sees everything, as every control connection does), and whether it may
  // see a job (the same rule as STATUS, STATS and JOBS: control::may_see).
  std::optional<control::Viewer> metrics_viewer(std::string_view bearer) const;
  bool may_see_job(const control::Viewer& v, const JobStatus& s) const;

  // What other threads (the metrics endpoint) may read about the control plane: published by the
  // control-plane thread at the end of every step().
  struct Gauges {
    std::atomic<uint64_t> joining{0};         // jobs waiting for their ranks
    std::atomic<uint64_t> reserved_bytes{0};  // memory of running and joining jobs
    std::atomic<uint64_t> jobs_started{0};
    std::atomic<uint64_t> connections{0};
  };
  const Gauges& gauges() const { return gauges_; }

 private:
  struct Conn;
  struct PendingJob;
  struct LiveJob;

  void accept_all(uint64_t now_ns);
  // accept() failed for want of descriptors: refuse the waiting connection with the spare one.
  // False when no connection was waiting.
  bool refuse_without_descriptors(uint64_t now_ns);
  // ---- the control port's capacity with an auth file (docs/security.md, "the control port") ----
  // Unauthenticated and in no job (neither joining nor joined): the pool that --max-unauth-connections
  // caps; its connections are the ones a new connection may evict.
  bool in_unauth_pool(const Conn& c) const;
  static bool outside_job(const Conn& c);
  // Closes `c` at once (its descriptor is free when this returns), after one ERR line sent without
  // waiting: for connections evicted to make room.
  void evict(Conn& c, const char* code, const std::string& message);
  // A tenant beyond --max-tenant-connections authenticated connections outside a job loses its oldest.
  void enforce_tenant_connections(int tenant);
  // The handshake deadline and incomplete lines (--handshake-timeout), deferred AUTH answers.
  void check_connection_deadlines(uint64_t now_ns);
  void answer_deferred_auths(uint64_t now_ns);
  void forget_deferred_auth(const Conn& c);  // it closes before its answer
  // The AUTH failure log: a few lines per interval, then one summary line with the count.
  void log_auth_failure(const Conn& c, const std::string& tenant, uint64_t now_ns);
  void flush_auth_log(uint64_t now_ns);
  void read_input(Conn& c, uint64_t now_ns);
  void process_lines(Conn& c, uint64_t now_ns);
  void handle_line(Conn& c, const std::string& line, uint64_t now_ns);
  void handle_join(Conn& c, const control::Request& r, uint64_t now_ns);
  void handle_leave(Conn& c, const control::Request& r, uint64_t now_ns);
  void handle_status(Conn& c, const control::Request& r, uint64_t now_ns);
  // STATUS's open_rounds= and, when a round is open, the oldest one's slot, age and contributors.
  void add_open_rounds(control::Line& out, uint32_t job_id, uint64_t now_ns) const;
  void handle_stats(Conn& c, const control::Request& r);
  void handle_jobs(Conn& c, const control::Request& r);
  void handle_upload(Conn& c, const control::Request& r);  // PARAMS, STATE_SET
  void handle_setlr(Conn& c, const control::Request& r);
  void handle_state_get(Conn& c, const control::Request& r);
  // access.cpp: authentication, the operator's ABORT, who sees what, quotas.
  void handle_challenge(Conn& c, const control::Request& r);
  void handle_auth(Conn& c, const control::Request& r, uint64_t now_ns);
  // Sends AUTH's answer: `tenant` >= 0 makes the connection that tenant's with the OK line `reply`;
  // kAnonymous answers ERR auth `reply` and closes.
  void complete_auth(Conn& c, int tenant, const std::string& reply);
  void handle_abort(Conn& c, const control::Request& r);
  control::Viewer viewer_of(const Conn& c) const;
  bool can_see(const Conn& c, uint32_t job_id) const;
  // The tenant of a job by its scoped name (kAnonymous for an anonymous job's).
  int owner_of(std::string_view scoped_name) const;
  // The name a JOIN's job has in the switch: "tenant/name" for a tenant, `name` when anonymous.
  std::string scoped_name(const Conn& c, const std::string& name) const;
  // "" when the JOIN may proceed; else why not (ERR auth).
  std::string join_refusal(const Conn& c) const;
  // "" when a new job of `tenant` needing `memory` bytes fits its quota; else the ERR no_resources text.
  std::string quota_refusal(int tenant, size_t memory) const;
  // Draws a random job id the engine can take and a random non-zero key (docs/security.md).
  void draw_id_and_key(JobSpec* spec) const;
  void feed_binary(Conn& c);  // consumes buffered payload bytes of an upload; replies when complete
  Optimizer* joined_optimizer(Conn& c, const std::string& verb, control::Error* err);
  // Answers the error, then FIN, drain and close (the input can no longer be framed).
  void close_with_error(Conn& c, const char* code, const std::string& message);
  JobSpec new_spec(const PendingJob& p) const;  // name, world, wire, slots, payload, optimizer, key
  // A new joining job `name` for JOIN `j`, after the switch's limits and the tenant's quota.
  bool create_pending(const Conn& c, const control::JoinRequest& j, const std::string& name, uint64_t now_ns,
                      control::Error* err);
  void start_job(PendingJob& p, uint64_t now_ns);
  // Creates the engine job, replies OK (+ `reply_tail`) to every member and makes the job live.
  void launch(PendingJob& p, const JobSpec& spec, std::vector<uint16_t> leader, const std::string& reply_tail,
              uint64_t now_ns);
  // Every rank of `rank`'s group (the ranks one leaf forwarded) has left with LEAVE.
  bool group_left(const LiveJob& j, uint16_t rank) const;
  // The switch the rank that aborted job `j` (rank_left) said it lost when it left; "" for none.
  static const std::string& lost_by_aborter(const LiveJob& j, const JobStatus& s);

  // ---- a leaf switch (leaf.cpp) ----
  bool is_leaf() const;
  void forward_join(Conn& member, const control::Request& join, PendingJob& p);
  void process_spine_lines(Conn& up, uint64_t now_ns);
  void spine_join_reply(Conn& up, const std::string& line, uint64_t now_ns);
  void spine_event(Conn& up, const std::string& line);
  void spine_lost(Conn& up);  // its connection closed
  void start_leaf_job(PendingJob& p, uint64_t now_ns);
  void withdraw_upward(PendingJob& p, uint16_t rank);            // a member withdrew before the start
  void depart_upward(LiveJob& j, uint16_t rank, bool graceful);  // a member left or disconnected
  void close_upward(uint64_t conn_id);
  std::string uplink_keys(const LiveJob& j, const JobStatus& s) const;  // " uplink_reason=.. uplink_rank=.."
  void fail_pending(PendingJob& p, const control::Error& e);
  // The connection leaves its job; `lost`: the switch a LEAVE said the rank lost ("" for none).
  void depart(Conn& c, bool graceful, uint64_t now_ns, const std::string& lost = {});
  void end_job_if_empty(LiveJob& j);
  void abort_live(LiveJob& j, uint8_t reason, uint16_t rank, const std::string& why);
  // Records an abort the engine holds (from abort_live or a data thread), logs it and sends
  // `EVENT aborted ...` to every rank still connected.
  void note_abort(LiveJob& j, const std::string& why);
  // Queues an `EVENT ...` line between two replies (after a STATE_GET payload that is going out).
  void send_event(Conn& c, const std::string& line);
  // What makes a JOIN disagree with the ranks already waiting ("" when it fits).
  std::string join_conflict(const PendingJob& p, const control::JoinRequest& j) const;
  void check_timers(uint64_t now_ns);
  void reply(Conn& c, const std::string& line);  // `line` ends with '\n'
  void reply_error(Conn& c, const char* code, const std::string& message);
  void flush(Conn& c);
  void sweep(uint64_t now_ns);
  // The STATS total; `per_reason`: with the drop.<reason> counters (operators and the log).
  std::string stats_line(bool per_reason) const;
  // A non-operator's STATS total: over the jobs it may see (queries.cpp).
  std::string visible_stats_line(const Conn& c) const;
  size_t reserved_memory() const;

  Engine& engine_;
  const SwitchConfig& config_;
  std::optional<control::AuthTable> auth_;
  int listen_fd_ = -1;
  // A descriptor held in reserve: out of descriptors (EMFILE), it is given up to accept the waiting
  // connection and refuse it, so that the listening socket does not stay readable and spin the loop.
  int spare_fd_ = -1;
  uint64_t refused_no_fd_ = 0, next_fd_warning_ns_ = 0;
  // AUTH backoff (access.cpp): failures per source address and per tenant name as given (known or
  // not, so that the backoff tells nothing about which tenants exist); each table is bounded.
  struct Backoff {
    uint32_t failures = 0;
    uint64_t ready_ns = 0;  // the next AUTH of this key is answered no earlier (once failures >= free)
    uint64_t last_ns = 0;   // the last failure, for forgetting and for eviction when the table is full
  };
  std::map<uint32_t, Backoff> auth_by_addr_;
  std::map<std::string, Backoff> auth_by_tenant_;
  std::multimap<uint64_t, uint64_t> deferred_auth_;  // answer time -> connection id
  uint64_t auth_log_interval_end_ns_ = 0, auth_log_lines_ = 0, auth_log_suppressed_ = 0;
  std::string auth_log_last_;  // "from 127.0.0.5:4711 as tenant 'x'", for the summary line
  uint64_t next_backoff_sweep_ns_ = 0;
  uint64_t evicted_ = 0, next_evict_warning_ns_ = 0;
  uint64_t next_conn_id_ = 1;
  std::map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::map<std::string, std::unique_ptr<PendingJob>> pending_;  // by name
  std::map<uint32_t, std::unique_ptr<LiveJob>> live_;           // by job id
  std::vector<std::function<std::string()>> stats_sources_;
  uint64_t jobs_started_ = 0;
  Gauges gauges_;
  uint64_t next_timer_check_ns_ = 0;
  uint64_t next_stats_ns_ = 0;
  bool shutting_down_ = false;
};

}  // namespace gradswitch
