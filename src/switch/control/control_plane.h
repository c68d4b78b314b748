// The TCP control plane (docs/protocol.md section 1): joins, leaves, status and stats, and for
// optimizer jobs parameter upload, learning rate, checkpoint and restore (§1.3).
//
// One thread (the caller of run()/step()) does everything: a poll() loop over non-blocking
// sockets, line framing, and the job life cycle. Errors answer only the connection that caused
// them; no input can stop the loop.
//
// ControlPlane owns the types that do the work, one job each, and dispatches each request line to
// the one it is for: Connections (connections.h: the socket, accept, input and output),
// Authenticator (authenticator.h: AUTH, backoff, the handshake deadline, who sees what), Jobs
// (jobs.h: JOIN, LEAVE, ABORT, EVENT lines, quotas, timeouts), Queries (queries.h: STATUS, STATS,
// JOBS), OptimizerRequests (optimizer_requests.h: PARAMS, SETLR, STATE_*) and LeafUplink
// (leaf_uplink.h: a leaf switch's side of its spine, --uplink); control_state.h holds the records
// they share.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "switch/config.h"
#include "switch/control/auth.h"
#include "switch/control/authenticator.h"
#include "switch/control/connections.h"
#include "switch/control/jobs.h"
#include "switch/control/leaf_uplink.h"
#include "switch/control/optimizer_requests.h"
#include "switch/control/queries.h"
#include "switch/engine/engine.h"

namespace gradswitch {

class ControlPlane : private control::ConnectionHandler {
 public:
  ControlPlane(Engine& engine, const SwitchConfig& config);
  ~ControlPlane() override;
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  // Binds control_host:control_port and listens; false with `error` set.
  bool listen(std::string* error) { return conns_.listen(error); }
  // "0.0.0.0:7700"
  std::string describe() const { return conns_.describe(); }

  // Serves until `stop` is set, then ends every job with ABORT(SHUTDOWN) semantics (engine
  // jobs aborted, pending joins answered with an error) and returns. Connections stay open
  // until close_all(), so that data threads can still answer DATA packets with ABORT.
  // `reload` (a signal handler sets it: SIGHUP) makes it read the auth file again (reload_auth).
  void run(const std::atomic<bool>& stop, std::atomic<bool>* reload = nullptr);
  // One poll() round of at most `timeout_ms`, at monotonic time `now_ns`.
  void step(int timeout_ms, uint64_t now_ns);
  void shutdown_jobs(uint64_t now_ns);
  // Closes every connection and destroys every job.
  void close_all();

  // Tenants from --auth-file: JOIN then needs AUTH (or the table's anonymous entry), names are
  // scoped by tenant, quotas apply, and only operators see every job. Without it (the default)
  // every connection is anonymous and sees every job. Call before run().
  void use_auth(control::AuthTable table);
  // Reads --auth-file again and puts it in force without dropping running jobs (docs/security.md,
  // "Changing the auth file"); a file that does not load is refused and the table in force stays.
  void reload_auth();

  // Extra `key=value ...` text appended to the total STATS reply and the stats log line.
  void add_stats_source(std::function<std::string()> source) { queries_.add_source(std::move(source)); }

  uint64_t jobs_started() const { return jobs_.started(); }

  // For the metrics endpoint's thread (Authenticator): the viewer a bearer token stands for
  // (std::nullopt: refuse the scrape), and whether it may see a job (control::may_see).
  std::optional<control::Viewer> metrics_viewer(std::string_view bearer) const {
    return auth_.metrics_viewer(bearer);
  }
  bool may_see_job(const control::Viewer& v, const JobStatus& s) const { return auth_.may_see_job(v, s); }

  // What other threads (the metrics endpoint) may read about the control plane: published by the
  // control-plane thread at the end of every step().
  struct Gauges {
    std::atomic<uint64_t> joining{0};         // jobs waiting for their ranks
    std::atomic<uint64_t> reserved_bytes{0};  // memory of running and joining jobs
    std::atomic<uint64_t> jobs_started{0};
    std::atomic<uint64_t> connections{0};
    std::atomic<uint64_t> auth_reloads{0};          // SIGHUP: the auth file read again and in force
    std::atomic<uint64_t> auth_reload_failures{0};  // SIGHUP: a new auth file refused
  };
  const Gauges& gauges() const { return gauges_; }

 private:
  // control::ConnectionHandler: the request lines (or upload bytes) buffered on `c`, and departures.
  void on_input(control::Conn& c, uint64_t now_ns) override;
  void on_depart(control::Conn& c, uint64_t now_ns) override;
  void handle_line(control::Conn& c, const std::string& line, uint64_t now_ns);
  void check_timers(uint64_t now_ns);

  control::Connections conns_;
  control::Authenticator auth_;
  control::LeafUplink leaf_;
  control::Jobs jobs_;
  control::OptimizerRequests optimizer_;
  control::Queries queries_;
  Gauges gauges_;
  uint64_t next_timer_check_ns_ = 0;
};

}  // namespace gradswitch
