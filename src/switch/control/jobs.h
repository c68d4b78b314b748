// Jobs and their life cycle (docs/protocol.md section 1): JOIN (a pending job waits for its ranks,
// within the switch's limits and the tenant's quota), the start, LEAVE and closed connections,
// aborts (the operator's ABORT among them) and their EVENT lines, the join and idle timeouts, and
// shutdown. The engine job is created once every rank has joined and destroyed once every rank's
// connection is gone.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "switch/config.h"
#include "switch/control/authenticator.h"
#include "switch/control/connections.h"
#include "switch/engine/engine.h"

namespace gradswitch::control {

class LeafUplink;

class Jobs {
 public:
  using PendingMap = std::map<std::string, std::unique_ptr<PendingJob>>;  // by scoped name
  using LiveMap = std::map<uint32_t, std::unique_ptr<LiveJob>>;           // by job id

  Jobs(Engine& engine, const SwitchConfig& config, Connections& conns, const Authenticator& auth,
       LeafUplink& leaf, ConnectionHandler& handler);

  void handle_join(Conn& c, const Request& r, uint64_t now_ns);
  void handle_leave(Conn& c, const Request& r, uint64_t now_ns);
  void handle_abort(Conn& c, const Request& r);  // the operator's
  // A request on a joined connection keeps its job from the idle timeout.
  void note_request(const Conn& c, uint64_t now_ns);
  // The connection leaves its job; `lost`: the switch a LEAVE said the rank lost ("" for none).
  void depart(Conn& c, bool graceful, uint64_t now_ns, const std::string& lost = {});
  // Join and idle timeouts, and aborts a data thread made.
  void check_timers(uint64_t now_ns);
  // Every job ends with ABORT(SHUTDOWN) semantics: engine jobs aborted, pending joins answered.
  void shutdown(uint64_t now_ns);
  void destroy_all();  // after every connection closed
  // The auth file was read again: joining jobs of a tenant it no longer has are refused (their ranks
  // answered ERR auth); running jobs go on.
  void settle_reload(const AuthChange& change);

  const PendingMap& pending() const { return pending_; }
  const LiveMap& live() const { return live_; }
  PendingJob* find_pending(const std::string& name);
  LiveJob* find_live(uint32_t id);
  const LiveJob* find_live(uint32_t id) const;
  uint64_t started() const { return jobs_started_; }
  size_t reserved_memory() const;  // of running and joining jobs

  // For the leaf's uplink (leaf_uplink.cpp), which starts and ends jobs with the spine:
  JobSpec new_spec(const PendingJob& p) const;  // name, world, wire, slots, payload, optimizer, key
  // Creates the engine job, replies OK (+ `reply_tail`) to every member and makes the job live.
  void launch(PendingJob& p, const JobSpec& spec, std::vector<uint16_t> leader, const std::string& reply_tail,
              uint64_t now_ns);
  // Answers every member the error and forgets the job.
  void fail_pending(PendingJob& p, const Error& e);
  // Records an abort the engine holds (from abort_live, a data thread or the spine), logs it and
  // sends `EVENT aborted ...` to every rank still connected.
  void note_abort(LiveJob& j, const std::string& why);
  // The switch the rank that aborted job `j` (rank_left) said it lost when it left; "" for none.
  static const std::string& lost_by_aborter(const LiveJob& j, const JobStatus& s);

 private:
  // A new joining job `name` for JOIN `j`, after the switch's limits and the tenant's quota.
  bool create_pending(const Conn& c, const JoinRequest& j, const std::string& name, uint64_t now_ns,
                      Error* err);
  // The switch's own limits (--max-jobs, --max-memory) for a new job needing `need` bytes.
  bool within_limits(const JoinRequest& j, size_t slot_bytes, size_t need, Error* err) const;
  // "" when a new job of `tenant` needing `memory` bytes fits its quota; else the ERR no_resources text.
  std::string quota_refusal(int tenant, size_t memory) const;
  // What makes a JOIN disagree with the ranks already waiting ("" when it fits).
  std::string join_conflict(const PendingJob& p, const JoinRequest& j) const;
  // A JOIN for the waiting job `p`: false when it was refused (and answered), also for every waiting
  // rank when it disagrees with them.
  bool may_join(Conn& c, PendingJob& p, const JoinRequest& j);
  void add_rank(Conn& c, PendingJob& p, const JoinRequest& j);
  void start_job(PendingJob& p, uint64_t now_ns);
  // Draws a random job id the engine can take and a random non-zero key (docs/security.md).
  void draw_id_and_key(JobSpec* spec) const;
  void withdraw(Conn& c);  // a pending rank's connection goes before the start
  // Every rank of `rank`'s group (the ranks one leaf forwarded) has left with LEAVE.
  bool group_left(const LiveJob& j, uint16_t rank) const;
  void end_job_if_empty(LiveJob& j);
  void abort_live(LiveJob& j, uint8_t reason, uint16_t rank, const std::string& why);
  void expire_joins(uint64_t now_ns);
  void expire_idle(uint64_t now_ns);

  Engine& engine_;
  const SwitchConfig& config_;
  Connections& conns_;
  const Authenticator& auth_;
  LeafUplink& leaf_;
  ConnectionHandler& handler_;
  PendingMap pending_;
  LiveMap live_;
  uint64_t jobs_started_ = 0;
  bool shutting_down_ = false;
};

}  // namespace gradswitch::control
