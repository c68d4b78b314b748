// UDP segmentation offload on send (GSO, UDP_SEGMENT) and coalescing on receive (GRO, UDP_GRO), as
// the switch's UDP backend and the worker's UDP transport both use them: the options' numbers for
// older libc headers, the receive buffer sizes, the control message of a GSO write and the segment
// size of a GRO train.
#pragma once

#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace gradswitch {

constexpr size_t kUdpRxPlainBytes = 9216;  // > the largest datagram (a 9000-byte MTU's)
constexpr size_t kUdpRxGroBytes = 65536;   // a whole GRO train
// Room for the control message of one GSO write, and for that of one GRO receive.
constexpr size_t kGsoControlBytes = CMSG_SPACE(sizeof(uint16_t));
constexpr size_t kGroControlBytes = CMSG_SPACE(sizeof(int));

// Turns GRO on for `fd`; false where the kernel does not offer it.
inline bool enable_udp_gro(int fd) {
  int one = 1;
  return ::setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one) == 0;
}

// Makes `*h` one GSO write: its datagrams of `seg` bytes each (the last may be shorter) leave as
// separate datagrams. `ctrl` holds the control message (kGsoControlBytes, aligned as a cmsghdr).
inline void set_gso_segment(msghdr* h, void* ctrl, uint16_t seg) {
  h->msg_control = ctrl;
  h->msg_controllen = kGsoControlBytes;
  cmsghdr* c = CMSG_FIRSTHDR(h);
  c->cmsg_level = SOL_UDP;
  c->cmsg_type = UDP_SEGMENT;
  c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
  std::memcpy(CMSG_DATA(c), &seg, sizeof seg);
}

// The datagram size of a received GRO train (its last datagram may be shorter), or 0 when `h`
// carries none: a single datagram.
inline int gro_segment_size(const msghdr& h) {
  int seg = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(const_cast<msghdr*>(&h), c))
    if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO)
      std::memcpy(&seg, CMSG_DATA(c), std::min<size_t>(sizeof seg, c->cmsg_len - CMSG_LEN(0)));
  return seg;
}

}  // namespace gradswitch
