// UDP transport: one socket, sendmmsg/recvmmsg, ppoll for the receive timeout (with an eventfd
// that wake() signals), and the source check of accept_from on each received datagram's address.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <vector>

#include "common/clock.h"
#include "common/counter.h"
#include "common/udp_offload.h"
#include "worker/errors.h"
#include "worker/transport.h"

namespace gradswitch::worker {
namespace {

constexpr size_t kMaxBatch = 64;
constexpr size_t kMaxGsoSegments = 64;
constexpr size_t kRxMsgs = 64;  // datagrams (or GRO trains) per recvmmsg
constexpr size_t kMaxGsoBytes = 65000;
constexpr unsigned kMaxForeignBatches = 4;

// The kernel's receive time of a datagram (SO_TIMESTAMPNS, CLOCK_REALTIME) moved onto the steady
// clock by `realtime_to_steady`; 0 when `h` carries none.
int64_t kernel_receive_ns(const msghdr& h, int64_t realtime_to_steady) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(const_cast<msghdr*>(&h), c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS &&
        c->cmsg_len >= CMSG_LEN(sizeof(timespec))) {
      timespec ts;
      std::memcpy(&ts, CMSG_DATA(c), sizeof ts);
      return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec + realtime_to_steady;
    }
  return 0;
}

class UdpTransport final : public Transport {
 public:
  UdpTransport(const std::string& bind_ip, int sockbuf_bytes, bool gso, bool gro, uint16_t bind_port)
      : gso_(gso) {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw Error(std::string("gradswitch: cannot create a UDP socket: ") + std::strerror(errno));
    if (sockbuf_bytes > 0) {
      // Best effort: the kernel caps these at net.core.{r,w}mem_max.
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &sockbuf_bytes, sizeof sockbuf_bytes);
      ::setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &sockbuf_bytes, sizeof sockbuf_bytes);
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(bind_port);
    if (!bind_ip.empty() && ::inet_pton(AF_INET, bind_ip.c_str(), &a.sin_addr) != 1) {
      ::close(fd_);
      throw Error("gradswitch: bad local bind address '" + bind_ip + "'");
    }
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      int e = errno;
      ::close(fd_);
      throw Error("gradswitch: cannot bind a UDP socket on " + (bind_ip.empty() ? "0.0.0.0" : bind_ip) + ":" +
                  std::to_string(bind_port) + ": " + std::strerror(e) +
                  (e == EADDRINUSE ? " (is another worker using this port?)" : ""));
    }
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) {
      int e = errno;
      ::close(fd_);
      throw Error(std::string("gradswitch: cannot create an eventfd: ") + std::strerror(e));
    }
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    gro_ = gro && enable_udp_gro(fd_);
    rx_size_ = gro_ ? kUdpRxGroBytes : kUdpRxPlainBytes;
    rx_msgs_ = gro_ ? 16 : kRxMsgs;  // a train holds up to 64 datagrams
    rx_mem_.assign(rx_size_ * rx_msgs_, 0);
  }
  ~UdpTransport() override {
    if (fd_ >= 0) ::close(fd_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  void wake() override {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(wake_fd_, &one, sizeof one);
  }

  uint16_t local_port() const override { return port_; }
  void set_peer(uint32_t ipv4_be) override { peer_ = ipv4_be; }

  size_t send_batch(const OutPacket* pkts, size_t n) override {
    if (gso_) return send_gso(pkts, n);
    size_t sent = 0, handed = 0;
    while (sent < n) {
      size_t k = std::min(n - sent, kMaxBatch);
      for (size_t i = 0; i < k; ++i) {
        const OutPacket& p = pkts[sent + i];
        iov_[i].iov_base = const_cast<uint8_t*>(p.data);
        iov_[i].iov_len = p.len;
        addr_[i] = sockaddr_in{};
        addr_[i].sin_family = AF_INET;
        addr_[i].sin_addr.s_addr = p.dst_ipv4_be ? p.dst_ipv4_be : peer_;
        addr_[i].sin_port = htons(p.dst_port);
        std::memset(&smsg_[i], 0, sizeof smsg_[i]);
        smsg_[i].msg_hdr.msg_name = &addr_[i];
        smsg_[i].msg_hdr.msg_namelen = sizeof addr_[i];
        smsg_[i].msg_hdr.msg_iov = &iov_[i];
        smsg_[i].msg_hdr.msg_iovlen = 1;
      }
      int r = ::sendmmsg(fd_, smsg_, static_cast<unsigned>(k), 0);
      if (r < 0) {
        if (errno == EINTR) continue;
        // ENOBUFS/EAGAIN and friends: skip the first datagram (it counts as lost) and go on.
        ++sent;
        continue;
      }
      sent += static_cast<size_t>(r);
      handed += static_cast<size_t>(r);
    }
    return handed;
  }

  // UDP_SEGMENT: a run of datagrams to one port with one size (the last may be shorter) goes
  // to the kernel as one message. The caller's order is kept; runs form where it allows.
  size_t send_gso(const OutPacket* in, size_t n) {
    // Group by destination (order between datagrams does not matter to the protocol).
    sorted_.assign(in, in + n);
    for (auto& p : sorted_)
      if (p.dst_ipv4_be == 0) p.dst_ipv4_be = peer_;
    std::stable_sort(sorted_.begin(), sorted_.end(), [](const OutPacket& a, const OutPacket& b) {
      return a.dst_ipv4_be != b.dst_ipv4_be ? a.dst_ipv4_be < b.dst_ipv4_be : a.dst_port < b.dst_port;
    });
    const OutPacket* pkts = sorted_.data();
    size_t done = 0, handed = 0;
    while (done < n) {
      size_t nmsg = 0, niov = 0, i = done;
      while (i < n && nmsg < kMaxBatch) {
        const OutPacket& first = pkts[i];
        size_t j = i + 1, bytes = first.len;
        while (j < n && j - i < kMaxGsoSegments && pkts[j].dst_port == first.dst_port &&
               pkts[j].dst_ipv4_be == first.dst_ipv4_be && pkts[j].len <= first.len &&
               bytes + pkts[j].len <= kMaxGsoBytes) {
          bytes += pkts[j].len;
          ++j;
          if (pkts[j - 1].len < first.len) break;  // a shorter datagram ends the run
        }
        mmsghdr& m = smsg_[nmsg];
        std::memset(&m, 0, sizeof m);
        addr_[nmsg] = sockaddr_in{};
        addr_[nmsg].sin_family = AF_INET;
        addr_[nmsg].sin_addr.s_addr = first.dst_ipv4_be;
        addr_[nmsg].sin_port = htons(first.dst_port);
        m.msg_hdr.msg_name = &addr_[nmsg];
        m.msg_hdr.msg_namelen = sizeof addr_[nmsg];
        m.msg_hdr.msg_iov = &giov_[niov];
        m.msg_hdr.msg_iovlen = j - i;
        for (size_t k = i; k < j; ++k) {
          giov_[niov].iov_base = const_cast<uint8_t*>(pkts[k].data);
          giov_[niov].iov_len = pkts[k].len;
          ++niov;
        }
        if (j - i > 1) {
          set_gso_segment(&m.msg_hdr, cbuf_[nmsg], static_cast<uint16_t>(first.len));
        }
        msg_pkts_[nmsg] = j - i;
        ++nmsg;
        i = j;
        if (niov + kMaxGsoSegments > sizeof giov_ / sizeof giov_[0]) break;
      }
      size_t off = 0;
      while (off < nmsg) {
        int r = ::sendmmsg(fd_, smsg_ + off, static_cast<unsigned>(nmsg - off), 0);
        if (r < 0) {
          if (errno == EINTR) continue;
          if (errno == EINVAL || errno == EIO || errno == ENOPROTOOPT || errno == EOPNOTSUPP) {
            gso_ = false;  // no UDP GSO here: plain datagrams from now on
            size_t from = done;
            for (size_t k = 0; k < off; ++k) from += msg_pkts_[k];
            std::vector<OutPacket> rest(pkts + from, pkts + n);
            return handed + send_batch(rest.data(), rest.size());
          }
          ++off;  // the message counts as lost; retransmission recovers it
          continue;
        }
        for (int k = 0; k < r; ++k) handed += msg_pkts_[off + k];
        off += static_cast<size_t>(r);
      }
      for (size_t k = 0; k < nmsg; ++k) done += msg_pkts_[k];
    }
    return handed;
  }

  size_t recv_batch(InPacket* pkts, size_t max, int64_t timeout_ns) override {
    more_ = false;
    size_t nmsg = std::min(rx_msgs_, gro_ ? max / kMaxGsoSegments : max);
    if (nmsg == 0) nmsg = 1;
    // A batch of foreign datagrams only (all dropped) is read past, a few batches at most: a flood of
    // them must not keep this call from returning to the caller's timers.
    unsigned foreign_batches = 0;
    for (;;) {
      for (size_t i = 0; i < nmsg; ++i) {
        riov_[i].iov_base = rx_mem_.data() + rx_size_ * i;
        riov_[i].iov_len = rx_size_;
        std::memset(&rmsg_[i], 0, sizeof rmsg_[i]);
        rmsg_[i].msg_hdr.msg_iov = &riov_[i];
        rmsg_[i].msg_hdr.msg_iovlen = 1;
        if (filtering_) {  // the kernel copies each source address only when it is checked
          rmsg_[i].msg_hdr.msg_name = &raddr_[i];
          rmsg_[i].msg_hdr.msg_namelen = sizeof raddr_[i];
        }
        if (gro_ || stamp_) {
          rmsg_[i].msg_hdr.msg_control = rcbuf_[i];
          rmsg_[i].msg_hdr.msg_controllen = sizeof rcbuf_[i];
        }
      }
      int r = ::recvmmsg(fd_, rmsg_, static_cast<unsigned>(nmsg), MSG_DONTWAIT, nullptr);
      if (r > 0) {
        more_ = static_cast<size_t>(r) == nmsg;
        const int64_t realtime_to_steady = stamp_ ? -wall_minus_steady_ns() : 0;
        size_t n = 0;
        for (int i = 0; i < r; ++i) {
          const uint8_t* base = rx_mem_.data() + rx_size_ * i;
          size_t len = rmsg_[i].msg_len;
          size_t seg = len;
          if (const int v = gro_ ? gro_segment_size(rmsg_[i].msg_hdr) : 0; v > 0)
            seg = static_cast<size_t>(v);
          const int64_t arrival = stamp_ ? kernel_receive_ns(rmsg_[i].msg_hdr, realtime_to_steady) : 0;
          if (filtering_ && !accepted(raddr_[i], rmsg_[i].msg_hdr.msg_namelen)) {
            // A GRO train has one source: each of its datagrams counts.
            if (dropped_) counter_add(*dropped_, seg ? (len + seg - 1) / seg : 1);
            continue;
          }
          for (size_t off = 0; off < len && n < max; off += seg) {
            pkts[n].data = base + off;
            pkts[n].len = static_cast<uint32_t>(std::min(seg, len - off));
            pkts[n].arrival_ns = arrival;
            ++n;
          }
          if (len == 0 && n < max) {  // an empty datagram: report it (the caller ignores it)
            pkts[n].data = base;
            pkts[n].len = 0;
            pkts[n].arrival_ns = arrival;
            ++n;
          }
        }
        if (n == 0 && ++foreign_batches <= kMaxForeignBatches) continue;
        return n;
      }
      if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return 0;  // e.g. a transient ICMP error reported on the socket; the caller retries
      if (timeout_ns <= 0) return 0;
      pollfd pfd[2 + kMaxWatched] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      for (size_t i = 0; i < watched_.size(); ++i) pfd[2 + i] = {watched_[i], POLLIN, 0};
      timespec ts{static_cast<time_t>(timeout_ns / 1000000000), static_cast<long>(timeout_ns % 1000000000)};
      int pr = ::ppoll(pfd, 2 + watched_.size(), &ts, nullptr);
      if (pr <= 0) return 0;  // timeout (or EINTR: the caller recomputes its deadlines)
      if (pfd[1].revents & POLLIN) {
        uint64_t v;
        [[maybe_unused]] ssize_t r2 = ::read(wake_fd_, &v, sizeof v);
      }
      // Woken, or the watched descriptor is readable: the caller has something else to look at.
      if (!(pfd[0].revents & POLLIN)) return 0;
      timeout_ns = 0;  // one wait per call
    }
  }

  bool more_pending() const override { return more_; }
  void accept_from(const std::vector<SourceRange>& sources, std::atomic<uint64_t>* dropped) override {
    sources_ = sources;
    dropped_ = dropped;
    hit_ = 0;
    filtering_ = true;
  }
  void stamp_arrivals(bool on) override {
    int v = on ? 1 : 0;
    stamp_ = ::setsockopt(fd_, SOL_SOCKET, SO_TIMESTAMPNS, &v, sizeof v) == 0 && on;
  }
  void watch_fds(const std::vector<int>& fds) override {
    watched_.clear();
    for (int fd : fds)
      if (fd >= 0 && watched_.size() < kMaxWatched) watched_.push_back(fd);
  }

 private:
  // Whether a datagram from `a` is taken. The range that took the previous one is tried first: a
  // switch's results come from a few ports, a ring's from two neighbours.
  bool accepted(const sockaddr_in& a, socklen_t len) {
    if (len < sizeof a || a.sin_family != AF_INET) return false;
    const uint16_t port = ntohs(a.sin_port);
    const auto in = [&](const SourceRange& r) {
      return a.sin_addr.s_addr == r.ipv4_be && static_cast<uint16_t>(port - r.port) < r.ports;
    };
    if (sources_.empty()) return false;
    if (in(sources_[hit_])) return true;
    for (size_t k = 0; k < sources_.size(); ++k)
      if (in(sources_[k])) {
        hit_ = k;
        return true;
      }
    return false;
  }

  static constexpr size_t kMaxWatched = 64;  // control connections: one per switch of a sharded job
  int fd_ = -1;
  int wake_fd_ = -1;
  std::vector<int> watched_;
  bool gso_ = false;
  uint16_t port_ = 0;
  uint32_t peer_ = htonl(INADDR_LOOPBACK);
  mmsghdr smsg_[kMaxBatch];
  iovec iov_[kMaxBatch];
  sockaddr_in addr_[kMaxBatch];
  iovec giov_[kMaxBatch * 4];
  alignas(cmsghdr) char cbuf_[kMaxBatch][kGsoControlBytes];
  size_t msg_pkts_[kMaxBatch];
  std::vector<OutPacket> sorted_;
  bool gro_ = false;
  bool stamp_ = false;  // SO_TIMESTAMPNS: each datagram's kernel receive time (CLOCK_REALTIME)
  bool more_ = false;
  size_t rx_size_ = 0, rx_msgs_ = 0;
  std::vector<uint8_t> rx_mem_;
  mmsghdr rmsg_[kRxMsgs];
  iovec riov_[kRxMsgs];
  sockaddr_in raddr_[kRxMsgs];
  bool filtering_ = false;  // accept_from was called: only sources_ are taken
  std::vector<SourceRange> sources_;
  size_t hit_ = 0;
  std::atomic<uint64_t>* dropped_ = nullptr;
  alignas(cmsghdr) char rcbuf_[kRxMsgs][kGroControlBytes + CMSG_SPACE(sizeof(timespec))];
};

}  // namespace

std::unique_ptr<Transport> make_udp_transport(const std::string& bind_ip, int sockbuf_bytes, bool gso,
                                              bool gro, uint16_t bind_port) {
  return std::make_unique<UdpTransport>(bind_ip, sockbuf_bytes, gso, gro, bind_port);
}

}  // namespace gradswitch::worker
