// A leaf switch's side of its spine (--uplink; docs/protocol.md §8): each rack member's JOIN is
// forwarded to the spine on a connection of its own, the job starts at the leaf once the spine has
// every rank, and from then on the two levels end together: a member that leaves or disconnects
// does the same at the spine, and the spine ending the job (or going away) ends the leaf's job, which
// tells every member why.
#pragma once

#include <cstdint>
#include <string>

#include "switch/config.h"
#include "switch/control/connections.h"
#include "switch/engine/engine.h"

namespace gradswitch::control {

class Jobs;

class LeafUplink {
 public:
  LeafUplink(Engine& engine, const SwitchConfig& config, Connections& conns, Jobs& jobs);

  bool is_leaf() const { return !config_.uplink.empty(); }
  // Opens a connection to the spine that carries `member`'s JOIN (as rank of `p`).
  void forward_join(Conn& member, const Request& join, PendingJob& p);
  // The spine's lines on an uplink connection: JOIN replies and EVENT lines.
  void process_lines(Conn& up, uint64_t now_ns);
  void lost(Conn& up);                                                  // its connection closed
  void withdraw(PendingJob& p, uint16_t rank);                          // a member withdrew before the start
  void depart(LiveJob& j, uint16_t rank, bool graceful);                // a member left or disconnected
  void close(uint64_t conn_id);                                         // at the end of this step; 0: none
  std::string uplink_keys(const LiveJob& j, const JobStatus& s) const;  // " uplink_reason=.. uplink_rank=.."

 private:
  void join_reply(Conn& up, const std::string& line, uint64_t now_ns);
  void event(Conn& up, const std::string& line);
  void start_job(PendingJob& p, uint64_t now_ns);
  // The spine's job as its JOIN reply describes it; false (and the job failed) when it does not.
  bool spine_job(PendingJob& p, UplinkSpec* up);
  // The spine's address (--uplink, checked at start-up).
  void spine_address(uint32_t* ip_be, uint16_t* port) const;

  Engine& engine_;
  const SwitchConfig& config_;
  Connections& conns_;
  Jobs& jobs_;
};

}  // namespace gradswitch::control
