// One TCP listening socket for the switch's two TCP services (the control plane and the metrics
// endpoint), so both bind, reuse addresses and report failures the same way.
#pragma once

#include <cstdint>
#include <string>

namespace gradswitch {

// A non-blocking, close-on-exec IPv4 listening socket on host:port (port 0: any free port; the one
// bound is written to *bound_port when it is not null). Returns the descriptor, or -1 with *error
// saying "cannot listen on TCP host:port: <reason>" (a host that is not a dotted IPv4 address
// included, instead of falling back to every address).
int tcp_listen(const std::string& host, uint16_t port, int backlog, uint16_t* bound_port, std::string* error);

}  // namespace gradswitch
