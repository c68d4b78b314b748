// Switch over loopback: the aggregating switch's packet rate next to a bare UDP echo of the same
// packets, driven by the same load.
//
//   switch_loopback --switch 127.0.0.1:7700 [--workers 4] [--window 128] [--seconds 5]
//   switch_loopback --echo [--workers 4] [--window 128] [--seconds 5] [--mtu 1500]
//
// Each worker is a thread with its own UDP socket that keeps `window` slots in flight, self-clocked
// like the real worker: a reply frees its slot and the next chunk goes out in it. Against the switch
// the workers JOIN one job and a reply is the aggregated result (one multicast per round of
// `workers` contributions); against the echo (a recvmmsg/sendmmsg loop in a child process, the
// same batch size as the switch's UDP backend, no engine) every packet comes straight back. In
// both cases the server receives and sends the same number of packets of the same size, so
// packets/s compare directly.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/header.h"
#include "gradswitch/wire.h"

using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string switch_host = "127.0.0.1";
  int switch_port = 0;  // 0: echo mode
  int workers = 4;
  int window = 128;
  double seconds = 5;
  int mtu = 1500;
  int batch = 32;
};

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "switch_loopback: %s\n", msg.c_str());
  std::exit(1);
}

int udp_socket(uint16_t* port_out) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  int sz = 8 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("bind failed");
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port_out = ntohs(a.sin_port);
  return fd;
}

// A control-plane JOIN on a connection that stays open for the run (closing it leaves the job).
struct Joined {
  int fd = -1;
  uint32_t job_id = 0, key = 0;
  int slots = 0, payload = 0, data_port = 0, threads = 1;
};

Joined join(const Options& o, int rank, uint16_t udp_port) {
  Joined j;
  j.fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(o.switch_port);
  inet_pton(AF_INET, o.switch_host.c_str(), &a.sin_addr);
  if (connect(j.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    die("cannot reach the switch's control port");
  std::string line = "JOIN job=loopback-bench world=" + std::to_string(o.workers) +
                     " rank=" + std::to_string(rank) +
                     " wire=float32 token=bench port=" + std::to_string(udp_port) + "\n";
  if (write(j.fd, line.data(), line.size()) != ssize_t(line.size())) die("JOIN write failed");
  std::string reply;
  char c;
  while (read(j.fd, &c, 1) == 1 && c != '\n') reply += c;
  if (reply.rfind("OK", 0) != 0) die("JOIN refused: " + reply);
  auto field = [&](const char* k) {
    auto p = reply.find(std::string(" ") + k + "=");
    if (p == std::string::npos) die(std::string("JOIN reply lacks ") + k);
    return std::stoul(reply.substr(p + std::strlen(k) + 2));
  };
  j.job_id = field("job_id"), j.key = field("key"), j.slots = field("slots"), j.payload = field("payload");
  j.data_port = field("data_port"), j.threads = field("threads");
  return j;
}

struct alignas(64) WorkerStats {
  std::atomic<uint64_t> sent{0}, received{0};
};

void worker(const Options& o, int rank, int fd, const Joined& j, uint16_t echo_port,
            const std::atomic<bool>& stop, WorkerStats& stats) {
  const bool echo = o.switch_port == 0;
  const int payload = echo ? o.mtu - 60 : j.payload;
  const int window = echo ? o.window : std::min(o.window, j.slots);
  const int count = payload / 4;
  const int pkt_len = GS_HEADER_BYTES + payload;
  std::vector<std::vector<uint8_t>> pkts(window, std::vector<uint8_t>(pkt_len, 0));
  std::vector<uint32_t> uses(window, 0);
  std::vector<Clock::time_point> sent_at(window);
  std::vector<sockaddr_in> dest(window);
  for (int s = 0; s < window; ++s) {
    dest[s].sin_family = AF_INET;
    dest[s].sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    dest[s].sin_port = htons(echo ? echo_port : j.data_port + s % j.threads);
  }
  auto encode = [&](int s) {
    gradswitch::HeaderBuilder(GS_MSG_DATA, j.job_id, j.key)
        .rank(rank)
        .slot(s)
        .flags(uses[s] & 1)
        .elems(GS_ELEM_FLOAT32, count)
        .round(uses[s], s * count)
        .encode(pkts[s].data());
  };
  std::vector<mmsghdr> out(window);
  std::vector<iovec> out_iov(window);
  auto send_slots = [&](const std::vector<int>& slots) {
    size_t n = 0;
    for (int s : slots) {
      encode(s);
      out_iov[n] = {pkts[s].data(), size_t(pkt_len)};
      out[n].msg_hdr = {};
      out[n].msg_hdr.msg_name = &dest[s];
      out[n].msg_hdr.msg_namelen = sizeof dest[s];
      out[n].msg_hdr.msg_iov = &out_iov[n];
      out[n].msg_hdr.msg_iovlen = 1;
      sent_at[s] = Clock::now();
      ++n;
    }
    for (size_t done = 0; done < n;) {
      int r = sendmmsg(fd, out.data() + done, n - done, 0);
      if (r <= 0) break;
      done += r;
      stats.sent.fetch_add(r, std::memory_order_relaxed);
    }
  };
  std::vector<int> all(window);
  for (int s = 0; s < window; ++s) all[s] = s;
  send_slots(all);
  const int batch = o.batch;
  std::vector<std::vector<uint8_t>> in_buf(batch,
                                           std::vector<uint8_t>(GS_HEADER_BYTES + GS_MAX_PAYLOAD_BYTES));
  std::vector<mmsghdr> in(batch);
  std::vector<iovec> in_iov(batch);
  std::vector<int> next;
  while (!stop.load(std::memory_order_relaxed)) {
    for (int i = 0; i < batch; ++i) {
      in_iov[i] = {in_buf[i].data(), in_buf[i].size()};
      in[i].msg_hdr = {};
      in[i].msg_hdr.msg_iov = &in_iov[i];
      in[i].msg_hdr.msg_iovlen = 1;
    }
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) {
      // Nothing for 20 ms: a packet was lost (rare on loopback); resend every slot's current chunk.
      send_slots(all);
      continue;
    }
    int r = recvmmsg(fd, in.data(), batch, MSG_DONTWAIT, nullptr);
    if (r <= 0) continue;
    stats.received.fetch_add(r, std::memory_order_relaxed);
    next.clear();
    for (int i = 0; i < r; ++i) {
      if (in[i].msg_len < GS_HEADER_BYTES) continue;
      gs_header h;
      gs_header_decode(in_buf[i].data(), &h);
      if (h.slot >= window || h.seq != uses[h.slot]) continue;  // duplicate or late
      ++uses[h.slot];
      next.push_back(h.slot);
    }
    send_slots(next);
  }
}

void echo_server(int fd, int batch) {
  std::vector<std::vector<uint8_t>> buf(batch, std::vector<uint8_t>(GS_HEADER_BYTES + GS_MAX_PAYLOAD_BYTES));
  std::vector<mmsghdr> msgs(batch);
  std::vector<iovec> iov(batch);
  std::vector<sockaddr_in> from(batch);
  for (;;) {
    for (int i = 0; i < batch; ++i) {
      iov[i] = {buf[i].data(), buf[i].size()};
      msgs[i].msg_hdr = {};
      msgs[i].msg_hdr.msg_name = &from[i];
      msgs[i].msg_hdr.msg_namelen = sizeof from[i];
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    int r = recvmmsg(fd, msgs.data(), batch, MSG_WAITFORONE, nullptr);
    if (r <= 0) continue;
    for (int i = 0; i < r; ++i) iov[i].iov_len = msgs[i].msg_len;  // echo exactly what came in
    for (int done = 0; done < r;) {
      int s = sendmmsg(fd, msgs.data() + done, r - done, 0);
      if (s <= 0) break;
      done += s;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool echo = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value for " + a);
      return argv[++i];
    };
    if (a == "--switch") {
      std::string v = next();
      auto colon = v.rfind(':');
      if (colon == std::string::npos) die("--switch takes host:port");
      o.switch_host = v.substr(0, colon);
      o.switch_port = std::stoi(v.substr(colon + 1));
    } else if (a == "--echo")
      echo = true;
    else if (a == "--workers")
      o.workers = std::stoi(next());
    else if (a == "--window")
      o.window = std::stoi(next());
    else if (a == "--seconds")
      o.seconds = std::stod(next());
    else if (a == "--mtu")
      o.mtu = std::stoi(next());
    else if (a == "--batch")
      o.batch = std::stoi(next());
    else {
      std::printf(
          "usage: %s (--switch HOST:PORT | --echo) [--workers 4] [--window 128] [--seconds 5]\n"
          "          [--mtu 1500 (echo mode; the switch's own --mtu applies otherwise)] [--batch 32]\n",
          argv[0]);
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  if (echo == (o.switch_port != 0)) die("give exactly one of --switch HOST:PORT and --echo");
  if (o.mtu < 60 + 4 || o.mtu > int(GS_MAX_MTU)) die("--mtu must be 64..9000");

  pid_t echo_pid = -1;
  uint16_t echo_port = 0;
  if (echo) {
    int efd = udp_socket(&echo_port);
    echo_pid = fork();
    if (echo_pid == 0) {
      echo_server(efd, o.batch);
      _exit(0);
    }
    close(efd);
  }
  std::vector<int> fds(o.workers);
  std::vector<uint16_t> ports(o.workers);
  for (int w = 0; w < o.workers; ++w) fds[w] = udp_socket(&ports[w]);
  std::vector<Joined> joined(o.workers);
  if (!echo) {
    std::vector<std::thread> joins;
    for (int w = 0; w < o.workers; ++w) joins.emplace_back([&, w] { joined[w] = join(o, w, ports[w]); });
    for (auto& t : joins) t.join();
  }
  std::atomic<bool> stop{false};
  std::vector<WorkerStats> stats(o.workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < o.workers; ++w)
    threads.emplace_back(worker, std::cref(o), w, fds[w], std::cref(joined[w]), echo_port, std::cref(stop),
                         std::ref(stats[w]));
  // Skip the first half second (slow start of the window), then measure.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto total = [&](bool sent) {
    uint64_t s = 0;
    for (auto& st : stats) s += (sent ? st.sent : st.received).load();
    return s;
  };
  const uint64_t sent0 = total(true), recv0 = total(false);
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  const uint64_t sent = total(true) - sent0, recv = total(false) - recv0;
  stop = true;
  for (auto& t : threads) t.join();
  if (echo_pid > 0) {
    kill(echo_pid, SIGKILL);
    waitpid(echo_pid, nullptr, 0);
  }
  for (auto& j : joined)
    if (j.fd >= 0) {
      (void)!write(j.fd, "LEAVE\n", 6);
      close(j.fd);
    }
  const int payload = echo ? o.mtu - 60 : joined[0].payload;
  const double frame = payload + GS_HEADER_BYTES + 28;
  std::printf(
      "%s: %d workers, window %d, %d-byte datagrams: server in %.3f Mpps (%.2f Gbit/s), out %.3f Mpps\n",
      echo ? "echo" : "switch", o.workers, o.window, payload + int(GS_HEADER_BYTES), sent / dt / 1e6,
      sent * frame * 8 / dt / 1e9, recv / dt / 1e6);
  return 0;
}
