// The control port's connections (docs/protocol.md section 1): the listening socket, accepting
// within the port's capacity (docs/security.md, "the control port"), reading, writing, the FIN and
// drain of a connection closed with an error, and closing. It moves bytes only: what the input
// means is its handler's (ControlPlane's dispatch), and who a connection is, the Authenticator's.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "switch/config.h"
#include "switch/control/control_state.h"

namespace gradswitch::control {

// What the connections ask of their owner.
class ConnectionHandler {
 public:
  virtual ~ConnectionHandler() = default;
  // `c` has buffered input (request lines or upload bytes) that may be processed now.
  virtual void on_input(Conn& c, uint64_t now_ns) = 0;
  // `c` stops taking part in its job: it is closing (evicted, gone, or timed out) or withdrew its JOIN.
  // Called again when it finally closes; a second call finds nothing left to do.
  virtual void on_depart(Conn& c, uint64_t now_ns) = 0;
};

class Connections {
 public:
  using Map = std::map<uint64_t, std::unique_ptr<Conn>>;  // by id, so oldest first

  Connections(const SwitchConfig& config, ConnectionHandler& handler);
  ~Connections();
  Connections(const Connections&) = delete;
  Connections& operator=(const Connections&) = delete;

  // Binds control_host:control_port and listens; false with `error` set.
  bool listen(std::string* error);
  std::string describe() const;  // "0.0.0.0:7700"
  // With an auth file, unauthenticated connections are a pool of their own that new ones may evict,
  // and a new connection is not privileged until it authenticates.
  void set_authenticating(bool on) { authenticating_ = on; }

  // One poll() round of at most `timeout_ms`: output, input (handed to the handler) and new connections.
  void poll_once(int timeout_ms, uint64_t now_ns);
  // Closes the connections marked dead (each departs first).
  void sweep(uint64_t now_ns);
  // Marks every connection dead and sweeps.
  void close_all(uint64_t now_ns);
  // A connection whose FIN went out and whose drain deadline passed is closed at the next sweep.
  void expire_drains(uint64_t now_ns);

  Map& all() { return conns_; }
  const Map& all() const { return conns_; }
  Conn* find(uint64_t id);
  const Conn* find(uint64_t id) const;
  Conn& at(uint64_t id) { return *conns_.at(id); }
  // A connection the switch opened itself (a leaf's to its spine), with an id from new_id().
  void add(std::unique_ptr<Conn> c);
  uint64_t new_id() { return next_conn_id_++; }

  void reply(Conn& c, const std::string& line);  // `line` ends with '\n'
  void reply_error(Conn& c, const char* code, const std::string& message);
  // Queues an `EVENT ...` line between two replies (after a STATE_GET payload that is going out).
  void send_event(Conn& c, const std::string& line);
  // Answers the error, then FIN, drain and close (the input can no longer be framed).
  void close_with_error(Conn& c, const char* code, const std::string& message);
  void flush(Conn& c);
  void flush_all();

  // Neither joining nor joined.
  static bool outside_job(const Conn& c);
  // Unauthenticated and outside a job with an auth file: the pool that --max-unauth-connections
  // caps; its connections are the ones a new connection may evict.
  bool in_unauth_pool(const Conn& c) const;

 private:
  struct Pool;
  void accept_all(uint64_t now_ns);
  // Makes room for a new connection by closing one of `pool` (or, when the switch is full, one that
  // is closing anyway); false when there was none to close.
  bool make_room(Pool& pool, bool total_full, uint64_t now_ns);
  // accept() failed for want of descriptors: refuse the waiting connection with the spare one.
  // False when no connection was waiting.
  bool refuse_without_descriptors(uint64_t now_ns);
  // Closes `c` at once (its descriptor is free when this returns), after one ERR line sent without
  // waiting: for connections evicted to make room.
  void evict(Conn& c, const char* code, const std::string& message);
  void read_input(Conn& c, uint64_t now_ns);
  // What came in: appended to the framer, handed on; false when it closed the connection.
  bool take_input(Conn& c, const char* buf, size_t n, uint64_t now_ns);

  const SwitchConfig& config_;
  ConnectionHandler& handler_;
  bool authenticating_ = false;
  int listen_fd_ = -1;
  // A descriptor held in reserve: out of descriptors (EMFILE), it is given up to accept the waiting
  // connection and refuse it, so that the listening socket does not stay readable and spin the loop.
  int spare_fd_ = -1;
  uint64_t refused_no_fd_ = 0, next_fd_warning_ns_ = 0;
  uint64_t evicted_ = 0, next_evict_warning_ns_ = 0;
  uint64_t next_conn_id_ = 1;
  Map conns_;
};

}  // namespace gradswitch::control
