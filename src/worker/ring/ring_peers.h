// Where the ring's ranks are and how they recognise each other's datagrams: peer addresses from
// the switch's JOIN reply or from the application ("host:port" per rank), and the job identity the
// ranks derive alone when no switch hands one out (docs/protocol.md section 7).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/ring/ring_allreduce.h"

namespace gradswitch::worker {

// Resolves "host:port" (IPv4 or a name). Throws InvalidArgument naming `what` and the address.
RingPeer resolve_peer(const std::string& addr, const std::string& what);

// Every rank's address from a list of "host:port" (one per rank); throws InvalidArgument when the
// list has not `world` entries or an entry does not resolve.
std::vector<RingPeer> resolve_peers(const std::vector<std::string>& addrs, unsigned world);

// The JOIN reply's peers= value "ip:port,ip:port,..."; empty when absent or malformed.
std::vector<RingPeer> parse_join_peers(const std::string& value, unsigned world);

// job_id and key of a ring without a switch: FNV-1a-64 of job, token and world size.
void ring_identity(const std::string& job, const std::string& token, unsigned world, uint32_t* job_id,
                   uint32_t* key);

}  // namespace gradswitch::worker
