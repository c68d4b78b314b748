// Requests of optimizer jobs (docs/protocol.md section 1.3): PARAMS and STATE_SET (binary uploads
// written into the job's memory as they arrive), SETLR, and STATE_GET (streamed from it). The upload
// in progress lives on its connection (Conn::bin), so this type keeps no state of its own.
#pragma once

#include <string>

#include "switch/config.h"
#include "switch/control/connections.h"
#include "switch/engine/engine.h"

namespace gradswitch::control {

class OptimizerRequests {
 public:
  OptimizerRequests(Engine& engine, const SwitchConfig& config, Connections& conns);

  void handle_upload(Conn& c, const Request& r);  // PARAMS, STATE_SET
  // Consumes buffered payload bytes of the upload in progress; replies when it is complete.
  void feed(Conn& c);
  void handle_setlr(Conn& c, const Request& r);
  void handle_state_get(Conn& c, const Request& r);

 private:
  Optimizer* joined_optimizer(Conn& c, const std::string& verb, Error* err);
  // The upload of `r` as it will be received: into the optimizer, or discarded with an error.
  Conn::BinaryIn plan_upload(Conn& c, const Request& r, uint64_t total);
  // Takes up to `want` bytes of a STATE_SET payload into the header or the arrays; how many it took.
  size_t take_state(Conn& c, Optimizer* opt, size_t want);
  void finish_upload(Conn& c);

  Engine& engine_;
  const SwitchConfig& config_;
  Connections& conns_;
};

}  // namespace gradswitch::control
