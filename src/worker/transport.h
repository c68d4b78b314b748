// The worker's datagram transport: send a batch to the switch or to other workers (the ring),
// receive a batch with a timeout. The UDP implementation uses sendmmsg/recvmmsg; tests substitute
// an in-process fake.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gradswitch::worker {

struct OutPacket {
  const uint8_t* data = nullptr;
  uint32_t len = 0;
  uint16_t dst_port = 0;     // UDP port (host order): a switch data thread, or a peer worker
  uint32_t dst_ipv4_be = 0;  // destination address (network order); 0 = the switch (set_peer)
};

struct InPacket {
  const uint8_t* data = nullptr;  // transport-owned; valid until the next recv_batch
  uint32_t len = 0;
  // When the kernel received it, on the steady clock (steady_now_ns); 0 = not known. The time the
  // datagram then waited for this thread is the host's delay, not the path's (docs/transport.md).
  int64_t arrival_ns = 0;
};

// An address datagrams are taken from: an IPv4 address and `ports` consecutive UDP ports from `port`
// (a switch's data threads, one port each; a ring peer is one port).
struct SourceRange {
  uint32_t ipv4_be = 0;  // network order
  uint16_t port = 0;     // host order
  uint16_t ports = 1;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // The local UDP port results are received on (announced in JOIN).
  virtual uint16_t local_port() const = 0;
  // Where DATA packets go: the switch's IPv4 address (network byte order).
  virtual void set_peer(uint32_t ipv4_be) = 0;
  // Sends `n` datagrams (best effort: a datagram the kernel refuses counts as lost; the
  // retransmission timer recovers it). Returns the number handed to the kernel.
  virtual size_t send_batch(const OutPacket* pkts, size_t n) = 0;
  // Waits up to `timeout_ns` (0 = poll) for datagrams; fills up to `max` of `pkts` (max >= 64);
  // returns how many (0 on timeout).
  virtual size_t recv_batch(InPacket* pkts, size_t max, int64_t timeout_ns) = 0;
  // True when the last recv_batch stopped at its capacity (more datagrams are likely queued).
  virtual bool more_pending() const = 0;
  // Makes a recv_batch that is waiting (or the next one) return at once; any thread may call it.
  // The group's thread serves the ring between operations in recv_batch and is woken by a new
  // operation; a transport without it (test fakes of the switch path) leaves that wait to its timeout.
  virtual void wake() {}
  // Also ends recv_batch's wait (returning 0) when descriptor `fd` becomes readable: the control
  // connection, whose notices must not wait for a timer. -1 stops watching (e.g. a closed one,
  // which would stay readable).
  void watch_fd(int fd) { watch_fds(fd >= 0 ? std::vector<int>{fd} : std::vector<int>{}); }
  // The same for several descriptors (a job sharded over several switches: one connection each).
  virtual void watch_fds(const std::vector<int>& fds) { (void)fds; }
  // From now on recv_batch returns only datagrams whose source is one of `sources` (docs/protocol.md
  // section 2.1): the others are dropped and counted in `*dropped` (by the thread that calls
  // recv_batch; may be null). Until it is called, every source (before JOIN); empty: none. A test
  // double that has no addresses ignores it.
  virtual void accept_from(const std::vector<SourceRange>& sources, std::atomic<uint64_t>* dropped) {
    (void)sources;
    (void)dropped;
  }
  // From now on recv_batch fills InPacket::arrival_ns where the transport can tell it (the UDP
  // socket's kernel receive timestamps); a transport that cannot leaves it 0.
  virtual void stamp_arrivals(bool on) { (void)on; }
};

// A UDP socket bound to `bind_ip` (dotted quad, "0.0.0.0" or "" for any) on `bind_port` (0: an
// ephemeral port), with
// receive/send buffers of `sockbuf_bytes` when the system allows it. `gso`: send runs of
// same-port, same-size datagrams as one UDP_SEGMENT message; `gro`: accept coalesced
// datagram trains (UDP_GRO) and split them. Both fall back when the kernel lacks them.
// Throws Error.
std::unique_ptr<Transport> make_udp_transport(const std::string& bind_ip, int sockbuf_bytes, bool gso = false,
                                              bool gro = false, uint16_t bind_port = 0);

}  // namespace gradswitch::worker
