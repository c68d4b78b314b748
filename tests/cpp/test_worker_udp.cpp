// The worker's UDP transport on loopback: plain and GSO batches arrive as the same datagrams; the
// source check of accept_from takes only the given addresses and counts the rest.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "harness.h"
#include "worker/transport.h"

using namespace gradswitch::worker;

namespace {

struct Receiver {
  int fd;
  uint16_t port;
  Receiver() {
    fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    int big = 4 << 20;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t l = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &l);
    port = ntohs(a.sin_port);
  }
  ~Receiver() { ::close(fd); }
  // Every datagram until 200 ms of silence.
  std::vector<std::vector<uint8_t>> drain() {
    std::vector<std::vector<uint8_t>> out;
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) return out;
      std::vector<uint8_t> buf(65536);
      ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
      if (n < 0) return out;
      buf.resize(static_cast<size_t>(n));
      out.push_back(std::move(buf));
    }
  }
};

void roundtrip(bool gso) {
  Receiver r1, r2;
  auto t = make_udp_transport("127.0.0.1", 1 << 20, gso);
  t->set_peer(htonl(INADDR_LOOPBACK));
  // 150 datagrams: runs of equal sizes, shorter tails, two ports interleaved, tiny headers-only ones.
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<OutPacket> pkts;
  for (int i = 0; i < 150; ++i) {
    size_t len = i % 37 == 36 ? 100 + i : (i % 50 < 5 ? 32 : 1472);
    std::vector<uint8_t> b(len);
    for (size_t k = 0; k < len; ++k) b[k] = static_cast<uint8_t>(i * 31 + k);
    std::memcpy(b.data(), &i, sizeof i);
    bufs.push_back(std::move(b));
  }
  for (int i = 0; i < 150; ++i)
    pkts.push_back(
        OutPacket{bufs[i].data(), static_cast<uint32_t>(bufs[i].size()), i % 3 == 0 ? r2.port : r1.port});
  size_t handed = t->send_batch(pkts.data(), pkts.size());
  CHECK_EQ(handed, pkts.size());
  std::map<int, std::vector<uint8_t>> got;
  for (auto* r : {&r1, &r2})
    for (auto& d : r->drain()) {
      int id = -1;
      if (d.size() >= sizeof id) std::memcpy(&id, d.data(), sizeof id);
      CHECK(id >= 0 && id < 150);
      if (id >= 0 && id < 150) {
        CHECK((id % 3 == 0) == (r == &r2));
        got[id] = d;
      }
    }
  CHECK_EQ(got.size(), size_t{150});
  for (auto& [id, d] : got) CHECK(d == bufs[id]);
}

}  // namespace

TEST(udp_plain_batch) {
  roundtrip(false);
}
TEST(udp_gso_batch) {
  roundtrip(true);
}

// GSO sender -> GRO receiver: trains are split back into the original datagrams.
TEST(udp_gso_to_gro_transport) {
  auto tx = make_udp_transport("127.0.0.1", 1 << 20, true, false);
  auto rx = make_udp_transport("127.0.0.1", 4 << 20, false, true);
  tx->set_peer(htonl(INADDR_LOOPBACK));
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<OutPacket> pkts;
  for (int i = 0; i < 300; ++i) {
    size_t len = i % 41 == 40 ? 200 : (i % 60 < 6 ? 32 : 1472);
    std::vector<uint8_t> b(len);
    for (size_t k = 0; k < len; ++k) b[k] = static_cast<uint8_t>(i * 7 + k);
    std::memcpy(b.data(), &i, sizeof i);
    bufs.push_back(std::move(b));
  }
  for (auto& b : bufs) pkts.push_back(OutPacket{b.data(), static_cast<uint32_t>(b.size()), rx->local_port()});
  CHECK_EQ(tx->send_batch(pkts.data(), pkts.size()), pkts.size());
  std::map<int, std::vector<uint8_t>> got;
  std::vector<InPacket> in(1024);
  for (;;) {
    size_t n = rx->recv_batch(in.data(), in.size(), 200'000'000);
    if (n == 0) break;
    for (size_t i = 0; i < n; ++i) {
      int id = -1;
      if (in[i].len >= sizeof id) std::memcpy(&id, in[i].data, sizeof id);
      CHECK(id >= 0 && id < 300);
      if (id >= 0 && id < 300) got[id].assign(in[i].data, in[i].data + in[i].len);
    }
  }
  CHECK_EQ(got.size(), size_t{300});
  for (auto& [id, d] : got) CHECK(d == bufs[id]);
}

// With stamp_arrivals each datagram carries the kernel's receive time on the steady clock: the time
// it waited in the socket before this thread read it is not part of it (plain and GRO sockets). The
// kernel turns arrival stamping on for the whole system a moment after the first socket asks for it
// (a deferred static key; until then it stamps at the read), so a few tries are allowed.
TEST(udp_arrival_times_exclude_the_wait_in_the_socket) {
  for (bool gro : {false, true}) {
    auto tx = make_udp_transport("127.0.0.1", 1 << 20, false, false);
    auto rx = make_udp_transport("127.0.0.1", 1 << 20, false, gro);
    rx->stamp_arrivals(true);
    tx->set_peer(htonl(INADDR_LOOPBACK));
    uint8_t b[64] = {1};
    OutPacket out{b, sizeof b, rx->local_port()};
    InPacket in[4];
    bool before_the_wait = false;
    for (int attempt = 0; attempt < 20 && !before_the_wait; ++attempt) {
      const int64_t sent = gradswitch::steady_now_ns();
      CHECK_EQ(tx->send_batch(&out, 1), size_t{1});
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      CHECK_EQ(rx->recv_batch(in, 4, 200'000'000), size_t{1});
      const int64_t read = gradswitch::steady_now_ns();
      CHECK(in[0].arrival_ns >= sent - 1'000'000);  // clocks converted once per batch: allow 1 ms
      CHECK(in[0].arrival_ns <= read);
      before_the_wait = in[0].arrival_ns <= read - 25'000'000;
    }
    CHECK(before_the_wait);
    rx->stamp_arrivals(false);
    CHECK_EQ(tx->send_batch(&out, 1), size_t{1});
    CHECK_EQ(rx->recv_batch(in, 4, 200'000'000), size_t{1});
    CHECK_EQ(in[0].arrival_ns, int64_t{0});
  }
}

TEST(udp_recv_timeout) {
  auto t = make_udp_transport("127.0.0.1", 0);
  std::vector<InPacket> in(64);
  CHECK_EQ(t->recv_batch(in.data(), in.size(), 20'000'000), size_t{0});
  CHECK(t->local_port() != 0);
}

// Worker-to-worker datagrams (the ring): a per-packet address overrides the switch's, with and
// without GSO; a transport bound to a given port receives there.
TEST(udp_per_packet_destination_and_bind_port) {
  for (bool gso : {false, true}) {
    auto rx = make_udp_transport("127.0.0.1", 1 << 20, false, false);
    uint16_t port = rx->local_port();
    rx.reset();
    rx = make_udp_transport("127.0.0.1", 1 << 20, false, false, port);  // the same port again, on purpose
    CHECK_EQ(rx->local_port(), port);
    auto tx = make_udp_transport("127.0.0.1", 1 << 20, gso, false);
    tx->set_peer(htonl(0x7F000002));  // 127.0.0.2: nothing listens there
    std::vector<std::vector<uint8_t>> bufs(10, std::vector<uint8_t>(100));
    std::vector<OutPacket> pkts;
    for (int i = 0; i < 10; ++i) {
      bufs[i][0] = static_cast<uint8_t>(i);
      pkts.push_back(OutPacket{bufs[i].data(), 100, port, htonl(INADDR_LOOPBACK)});
    }
    CHECK_EQ(tx->send_batch(pkts.data(), pkts.size()), pkts.size());
    std::vector<InPacket> in(64);
    size_t total = 0;
    for (size_t n; (n = rx->recv_batch(in.data(), in.size(), 200'000'000)) > 0;) total += n;
    CHECK_EQ(total, size_t{10});
  }
}

// wake() ends a waiting recv_batch at once.
TEST(udp_wake_ends_the_wait) {
  auto t = make_udp_transport("127.0.0.1", 0);
  std::vector<InPacket> in(64);
  auto t0 = std::chrono::steady_clock::now();
  std::thread waker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    t->wake();
  });
  CHECK_EQ(t->recv_batch(in.data(), in.size(), 5'000'000'000), size_t{0});
  waker.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(secs < 2.0);
}

namespace {

// A plain UDP socket bound to `ip`:`port` (0: any free port), for sending from a chosen source.
struct Sender {
  int fd;
  uint16_t port;
  Sender(uint32_t ip_host, uint16_t want = 0) {
    fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(ip_host);
    a.sin_port = htons(want);
    CHECK_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t l = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &l);
    port = ntohs(a.sin_port);
  }
  ~Sender() { ::close(fd); }
  void send(uint16_t to, uint8_t tag, int n) const {
    sockaddr_in d{};
    d.sin_family = AF_INET;
    d.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    d.sin_port = htons(to);
    std::vector<uint8_t> b(64, tag);
    for (int i = 0; i < n; ++i)
      ::sendto(fd, b.data(), b.size(), 0, reinterpret_cast<sockaddr*>(&d), sizeof d);
  }
};

// The tags of every datagram received until 200 ms of silence.
std::map<uint8_t, int> received(Transport& t) {
  std::map<uint8_t, int> got;
  std::vector<InPacket> in(1024);
  for (size_t n; (n = t.recv_batch(in.data(), in.size(), 200'000'000)) > 0;)
    for (size_t i = 0; i < n; ++i) ++got[in[i].data[0]];
  return got;
}

}  // namespace

// docs/protocol.md §2.1: after accept_from only the listed sources (an address and a port range) are
// taken, with and without GRO; another port, or the right port on another address, is dropped and
// counted. Before accept_from everything is taken (the transport exists before JOIN); an empty list
// takes nothing.
TEST(udp_source_check_takes_only_the_given_addresses) {
  for (bool gro : {false, true}) {
    auto rx = make_udp_transport("", 4 << 20, false, gro);
    const uint16_t port = rx->local_port();
    Sender a(INADDR_LOOPBACK), b(INADDR_LOOPBACK), foreign(INADDR_LOOPBACK);
    Sender other_ip(0x7F000002, a.port);  // 127.0.0.2, a's port
    CHECK(foreign.port != a.port && foreign.port != b.port);
    std::atomic<uint64_t> dropped{0};
    a.send(port, 1, 1);
    auto got = received(*rx);
    CHECK_EQ(got[1], 1);  // no check yet
    // a: a range of three ports that ends at its own; b: exactly its own.
    rx->accept_from({SourceRange{htonl(INADDR_LOOPBACK), static_cast<uint16_t>(a.port - 2), 3},
                     SourceRange{htonl(INADDR_LOOPBACK), b.port, 1}},
                    &dropped);
    const bool foreign_in_range = foreign.port + 2 >= a.port && foreign.port <= a.port;
    a.send(port, 1, 20);
    b.send(port, 2, 20);
    foreign.send(port, 3, 20);
    other_ip.send(port, 4, 20);
    got = received(*rx);
    CHECK_EQ(got[1], 20);
    CHECK_EQ(got[2], 20);
    CHECK_EQ(got[3], foreign_in_range ? 20 : 0);
    CHECK_EQ(got[4], 0);
    CHECK_EQ(dropped.load(), uint64_t{foreign_in_range ? 20u : 40u});
    rx->accept_from({}, &dropped);
    a.send(port, 1, 5);
    got = received(*rx);
    CHECK_EQ(got[1], 0);
    CHECK_EQ(dropped.load(), uint64_t{foreign_in_range ? 25u : 45u});
  }
}

GS_TEST_MAIN()
