// Ring peer addresses and identity (see ring_peers.h).
#include "worker/ring/ring_peers.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>
#include <sstream>

#include "worker/errors.h"

namespace gradswitch::worker {

RingPeer resolve_peer(const std::string& addr, const std::string& what) {
  auto colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw InvalidArgument("gradswitch: " + what + " '" + addr + "' must be host:port");
  std::string host = addr.substr(0, colon), port_text = addr.substr(colon + 1);
  char* end = nullptr;
  long port = std::strtol(port_text.c_str(), &end, 10);
  if (port_text.empty() || *end != '\0' || port <= 0 || port > 65535)
    throw InvalidArgument("gradswitch: " + what + " '" + addr + "' has no valid port (1..65535)");
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  int gai = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (gai != 0 || res == nullptr)
    throw InvalidArgument("gradswitch: cannot resolve " + what + " '" + addr + "': " + ::gai_strerror(gai) +
                          " (an IPv4 address or resolvable name is needed)");
  RingPeer p;
  p.ipv4_be = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr.s_addr;
  p.port = static_cast<uint16_t>(port);
  ::freeaddrinfo(res);
  return p;
}

std::vector<RingPeer> resolve_peers(const std::vector<std::string>& addrs, unsigned world) {
  if (addrs.size() != world)
    throw InvalidArgument("gradswitch: peers must list one host:port per rank (world_size " +
                          std::to_string(world) + "), got " + std::to_string(addrs.size()));
  std::vector<RingPeer> out;
  for (unsigned r = 0; r < world; ++r)
    out.push_back(resolve_peer(addrs[r], "the address of rank " + std::to_string(r)));
  return out;
}

std::vector<RingPeer> parse_join_peers(const std::string& value, unsigned world) {
  std::vector<RingPeer> out;
  std::stringstream in(value);
  std::string tok;
  while (std::getline(in, tok, ',')) {
    auto colon = tok.rfind(':');
    if (colon == std::string::npos) return {};
    in_addr a{};
    if (::inet_pton(AF_INET, tok.substr(0, colon).c_str(), &a) != 1) return {};
    long port = std::strtol(tok.c_str() + colon + 1, nullptr, 10);
    if (port <= 0 || port > 65535) return {};
    out.push_back(RingPeer{a.s_addr, static_cast<uint16_t>(port)});
  }
  if (out.size() != world) return {};
  return out;
}

void ring_identity(const std::string& job, const std::string& token, unsigned world, uint32_t* job_id,
                   uint32_t* key) {
  std::string text = job + "\n" + token + "\n" + std::to_string(world);
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  *job_id = static_cast<uint32_t>(h) | 1u;
  *key = static_cast<uint32_t>(h >> 32);
}

}  // namespace gradswitch::worker
