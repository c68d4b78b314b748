// Receive-side cost of the worker's source check (docs/protocol.md §2.1): a UDP transport drains a
// socket buffer pre-filled with N datagrams of 64 bytes, without accept_from (no check) and with it
// (the sender's address among two ranges, as a switch with two data threads and a sharded second
// switch give), alternated per round. Prints ns per datagram of each round.
// Build: g++ -O2 -std=c++20 -Iinclude -Isrc recv_check.cpp build/test/src/worker/libgs_worker.a \
//        build/test/src/common/libgs_common.a -o /tmp/recv_check
// Main's transport (before the check: no msg_name either), from its own sources in $M/src/worker:
//        g++ -O2 -std=c++20 -DMAIN_TRANSPORT -I$M/src -Iinclude -Isrc recv_check.cpp \
//        $M/src/worker/udp_transport.cpp -o /tmp/recv_check_main
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <vector>

#include "worker/transport.h"

using namespace gradswitch::worker;

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 20000, rounds = argc > 2 ? std::atoi(argv[2]) : 10;
  int tx = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(tx, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t l = sizeof a;
  ::getsockname(tx, reinterpret_cast<sockaddr*>(&a), &l);
  const uint16_t src_port = ntohs(a.sin_port);
  std::vector<uint8_t> buf(64, 1);
  for (int r = 0; r < 2 * rounds; ++r) {
    const bool check = r % 4 == 1 || r % 4 == 2;  // off on on off ...: each order as often
    auto rx = make_udp_transport("127.0.0.1", 4 << 20, false, false);  // holds each fill of 2000
    std::atomic<uint64_t> dropped{0};
#ifndef MAIN_TRANSPORT  // main's transport has no accept_from: every round is "off"
    if (check)
      rx->accept_from(
          {SourceRange{htonl(0x0A000001), 9000, 2}, SourceRange{htonl(INADDR_LOOPBACK), src_port, 1}},
          &dropped);
#endif
    sockaddr_in d{};
    d.sin_family = AF_INET;
    d.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    d.sin_port = htons(rx->local_port());
    std::vector<InPacket> in(1024);
    int got = 0;
    double ns = 0;
    while (got < n) {  // fill what the buffer holds, then drain it timed
      int sent = 0;
      for (; sent < 2000 && got + sent < n; ++sent)
        ::sendto(tx, buf.data(), buf.size(), 0, reinterpret_cast<sockaddr*>(&d), sizeof d);
      auto t0 = std::chrono::steady_clock::now();
      int batch = 0;
      for (size_t k; (k = rx->recv_batch(in.data(), in.size(), 0)) > 0;) batch += static_cast<int>(k);
      ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
      if (batch == 0) break;
      got += batch;
    }
    std::printf("check %d round %d datagrams %d ns_per_datagram %.1f dropped %llu\n", check ? 1 : 0, r / 2,
                got, ns / got, static_cast<unsigned long long>(dropped.load()));
  }
}
