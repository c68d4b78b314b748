// The UDP socket backend: one thread per data port, recvmmsg/sendmmsg bursts, GSO and GRO. On a
// leaf switch (--uplink) the same sockets carry the rack's rounds up to the spine and its results
// back, with the upward loss timers (switch/uplink) run between bursts.
#include "switch/io/udp/udp_backend.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/rng.h"
#include "common/udp_offload.h"
#include "switch/io/udp/result_batch.h"
#include "switch/io/udp/result_hold.h"
#include "switch/io/udp/round_deadlines.h"
#include "switch/log.h"
#include "switch/uplink/uplink_timers.h"

namespace gradswitch {
namespace {

constexpr int kSocketBufferBytes = 8 << 20;
constexpr int kPollMs = 50;                  // the stop flag is seen at least this often
constexpr size_t kMaxGroRxMemory = 8 << 20;  // per thread; beyond it (huge --batch) GRO stays off
// The leaf's upward loss timers: the worker library's defaults (Options::rto_initial_s, rto_max_s).
constexpr int64_t kUplinkRtoMinNs = 4'000'000;
constexpr int64_t kUplinkRtoMaxNs = 200'000'000;

void set_buffer(int fd, int opt, int force_opt, const char* what, bool* warned) {
  int v = kSocketBufferBytes;
  ::setsockopt(fd, SOL_SOCKET, opt, &v, sizeof v);
  int got = 0;
  socklen_t len = sizeof got;
  ::getsockopt(fd, SOL_SOCKET, opt, &got, &len);
  if (got / 2 < kSocketBufferBytes) {                       // the kernel reports twice what it grants
    ::setsockopt(fd, SOL_SOCKET, force_opt, &v, sizeof v);  // needs CAP_NET_ADMIN
    ::getsockopt(fd, SOL_SOCKET, opt, &got, &len);
  }
  if (got / 2 < kSocketBufferBytes && !*warned) {
    *warned = true;
    GS_LOG_WARN(
        "UDP %s buffer capped at %d KiB by net.core.%s_max (asked for %d KiB); bursts may be dropped: "
        "sysctl -w net.core.%s_max=%d",
        what, got / 2 / 1024, opt == SO_RCVBUF ? "rmem" : "wmem", kSocketBufferBytes / 1024,
        opt == SO_RCVBUF ? "rmem" : "wmem", 2 * kSocketBufferBytes);
  }
}

class UdpBackend final : public Backend {
 public:
  struct alignas(64) Thread {
    unsigned index = 0;
    int fd = -1;
    bool gso = false, gro = false;
    LossInjector loss;  // --drop-rate
    size_t rx_size = 0;
    std::vector<uint8_t> rx_buf;
    std::vector<mmsghdr> rx_msgs;
    std::vector<iovec> rx_iov;
    std::vector<sockaddr_in> rx_addr;  // sources: DATA counts only from its rank's address, a leaf takes
                                       // RESULT/ABORT only from its spine (the engine checks both)
    std::vector<uint8_t> rx_ctrl;
    ResultBatch out;  // what the current burst sends (and earlier bursts', while `hold` says they wait)
    ResultHold hold{0};
    UplinkTimers uplink{kUplinkRtoMinNs, kUplinkRtoMaxNs};
    RoundDeadlines deadlines;  // open rounds of jobs with deadline_us= (docs/protocol.md §3.1)
    // Read by the control thread (stats()); written by this thread only.
    std::atomic<uint64_t> injected_drops{0}, send_errors{0}, truncated{0}, gso_writes{0}, gro_trains{0},
        held_bursts{0}, rx_bursts{0}, sleeps{0};
    std::atomic<uint64_t> rx_datagrams{0};
    // The thread's CPU clock while it runs (-1 before and after), its CPU time once it ended.
    std::atomic<clockid_t> cpu_clock{-1};
    std::atomic<uint64_t> final_cpu_ns{0};
    uint64_t cpu_ns() const;
  };

  UdpBackend(Engine& engine, const SwitchConfig& config) : engine_(engine), config_(config) {}
  ~UdpBackend() override {
    for (auto& t : threads_)
      if (t->fd >= 0) ::close(t->fd);
  }

  bool open(std::string* error);
  std::string describe() const override;
  int run(const std::atomic<bool>& stop) override;
  const char* name() const override { return "udp"; }
  std::vector<BackendStat> stats() const override;

 private:
  // A data thread: receive a burst and handle it, or idle until a datagram or a timer.
  void loop(Thread& t, const std::atomic<bool>& stop);
  int receive_burst(Thread& t);
  void handle_burst(Thread& t, unsigned n);
  void idle(Thread& t);
  // One datagram from `src` through the engine; what it answers is queued.
  void ingest(Thread& t, const uint8_t* data, size_t len, const sockaddr_in& src, uint64_t now);
  // Resends the rounds whose upward loss timer expired (leaf only).
  void fire_uplink(Thread& t, uint64_t now);
  void fire_deadlines(Thread& t, uint64_t now);
  void queue(Thread& t, const IngestResult& r);
  void flush(Thread& t);
  void send_msgs(Thread& t, mmsghdr* msgs, size_t n);

  Engine& engine_;
  const SwitchConfig& config_;
  std::vector<std::unique_ptr<Thread>> threads_;
};

bool UdpBackend::open(std::string* error) {
  bool warned_rx = false, warned_tx = false;
  const unsigned batch = config_.batch;
  for (unsigned i = 0; i < config_.threads; ++i) {
    auto t = std::make_unique<Thread>();
    t->index = i;
    t->fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    const unsigned port = config_.data_port + i;
    if (t->fd < 0) {
      *error = std::string("udp backend: socket(): ") + std::strerror(errno);
      return false;
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, config_.control_host.c_str(), &a.sin_addr);
    if (::bind(t->fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      *error = "udp backend: cannot bind UDP " + config_.control_host + ":" + std::to_string(port) + ": " +
               std::strerror(errno) + " (another gradswitchd running? choose another --data-port)";
      ::close(t->fd);
      return false;
    }
    set_buffer(t->fd, SO_RCVBUF, SO_RCVBUFFORCE, "receive", &warned_rx);
    set_buffer(t->fd, SO_SNDBUF, SO_SNDBUFFORCE, "send", &warned_tx);

    t->gso = config_.udp_gso == "on";
    t->gro = size_t(batch) * kUdpRxGroBytes <= kMaxGroRxMemory && enable_udp_gro(t->fd);
    t->rx_size = t->gro ? kUdpRxGroBytes : kUdpRxPlainBytes;
    t->loss = LossInjector(config_.drop_rate, config_.seed, i);
    t->hold = ResultHold(uint64_t{config_.hold_us} * 1000);

    t->rx_buf.resize(size_t(batch) * t->rx_size);
    t->rx_msgs.resize(batch);
    t->rx_iov.resize(batch);
    t->rx_addr.resize(batch);
    t->rx_ctrl.assign(size_t(batch) * kGroControlBytes, 0);
    threads_.push_back(std::move(t));
  }
  return true;
}

std::string UdpBackend::describe() const {
  unsigned n = config_.threads;
  std::string ports = std::to_string(config_.data_port);
  if (n > 1) ports += "-" + std::to_string(config_.data_port + n - 1);
  bool gro = !threads_.empty() && threads_[0]->gro;
  return "udp " + ports + " (" + std::to_string(n) + (n == 1 ? " thread" : " threads") + ", batch " +
         std::to_string(config_.batch) + ", gso " + config_.udp_gso + ", gro " + (gro ? "on" : "off") +
         ", hold " + std::to_string(config_.hold_us) + " us)";
}

uint64_t UdpBackend::Thread::cpu_ns() const {
  const clockid_t clock = cpu_clock.load(std::memory_order_acquire);
  timespec ts;
  if (clock != -1 && clock_gettime(clock, &ts) == 0)
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
  return final_cpu_ns.load(std::memory_order_acquire);  // not started, or ended just now
}

std::vector<BackendStat> UdpBackend::stats() const {
  using Kind = BackendStat::Kind;
  uint64_t inj = 0, err = 0, trunc = 0, gso = 0, gro = 0, held = 0, bursts = 0, sleeps = 0;
  for (auto& t : threads_) {
    bursts += t->rx_bursts.load(std::memory_order_relaxed);
    sleeps += t->sleeps.load(std::memory_order_relaxed);
    inj += t->injected_drops.load(std::memory_order_relaxed);
    err += t->send_errors.load(std::memory_order_relaxed);
    trunc += t->truncated.load(std::memory_order_relaxed);
    gso += t->gso_writes.load(std::memory_order_relaxed);
    gro += t->gro_trains.load(std::memory_order_relaxed);
    held += t->held_bursts.load(std::memory_order_relaxed);
  }
  std::vector<BackendStat> out = {
      {"injected_drops", "Received datagrams dropped by --drop-rate before the engine", Kind::kCounter, inj},
      {"send_errors", "Results that could not be sent (socket errors, malformed results)", Kind::kCounter,
       err},
      {"truncated", "Received datagrams longer than the receive buffer (handed to the engine as bad length)",
       Kind::kCounter, trunc},
      {"gso_writes", "UDP_SEGMENT writes (each carries several results to one worker)", Kind::kCounter, gso},
      {"gro_trains", "Received GRO trains (several datagrams in one read)", Kind::kCounter, gro},
      {"held_bursts", "Bursts whose results waited to leave with the next burst's (--hold-us)",
       Kind::kCounter, held},
      // What a data thread's CPU per datagram follows where it is not busy: datagrams per burst and per
      // wake-up (BENCHMARKS.md §9).
      {"rx_bursts", "Receive calls that returned datagrams (each one engine burst)", Kind::kCounter, bursts},
      {"sleeps", "Waits of the data threads for a datagram or a timer (each one a wake-up)", Kind::kCounter,
       sleeps},
  };
  for (auto& t : threads_) {
    out.push_back({"rx_datagrams", "Datagrams this data thread handed to the engine or dropped",
                   Kind::kCounter, t->rx_datagrams.load(std::memory_order_relaxed), "thread", t->index});
    out.push_back({"cpu_ns", "CPU time of this data thread (user + system)", Kind::kCounter, t->cpu_ns(),
                   "thread", t->index});
  }
  return out;
}

int UdpBackend::run(const std::atomic<bool>& stop) {
  std::vector<std::thread> workers;
  for (auto& t : threads_) workers.emplace_back([this, &t, &stop] { loop(*t, stop); });
  for (auto& w : workers) w.join();
  return 0;
}

void UdpBackend::loop(Thread& t, const std::atomic<bool>& stop) {
  clockid_t clock;
  if (pthread_getcpuclockid(pthread_self(), &clock) == 0) t.cpu_clock.store(clock, std::memory_order_release);
  while (!stop.load(std::memory_order_relaxed)) {
    const int n = receive_burst(t);
    if (n > 0)
      handle_burst(t, static_cast<unsigned>(n));
    else
      idle(t);
  }
  flush(t);
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  t.final_cpu_ns.store(uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec), std::memory_order_release);
  t.cpu_clock.store(-1, std::memory_order_release);
}

// Up to --batch datagrams (or GRO trains) without waiting; what recvmmsg returned.
int UdpBackend::receive_burst(Thread& t) {
  const unsigned batch = config_.batch;
  for (unsigned i = 0; i < batch; ++i) {
    t.rx_iov[i] = {t.rx_buf.data() + size_t(i) * t.rx_size, t.rx_size};
    msghdr& h = t.rx_msgs[i].msg_hdr;
    h = msghdr{};
    h.msg_iov = &t.rx_iov[i];
    h.msg_iovlen = 1;
    h.msg_name = &t.rx_addr[i];
    h.msg_namelen = sizeof(sockaddr_in);
    if (t.gro) {
      h.msg_control = t.rx_ctrl.data() + i * kGroControlBytes;
      h.msg_controllen = kGroControlBytes;
    }
  }
  const int n = ::recvmmsg(t.fd, t.rx_msgs.data(), batch, MSG_DONTWAIT, nullptr);
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
    GS_LOG_WARN("udp thread %u: recvmmsg(): %s", t.index, std::strerror(errno));
  return n;
}

// Nothing to read: held results go once their hold ends, rounds close at their deadlines and the
// uplink's timers fire when due; until the earliest of these (or kPollMs, to see the stop flag),
// wait for a datagram.
void UdpBackend::idle(Thread& t) {
  const int64_t now = static_cast<int64_t>(monotonic_ns());
  const int64_t held_until = t.hold.waiting() ? static_cast<int64_t>(t.hold.deadline()) : INT64_MAX;
  if (held_until <= now) return flush(t);
  if (t.deadlines.next() <= now) return fire_deadlines(t, static_cast<uint64_t>(now));
  if (t.uplink.next_deadline() <= now) return fire_uplink(t, static_cast<uint64_t>(now));
  const int64_t due = std::min({t.uplink.next_deadline(), t.deadlines.next(), held_until});
  const int64_t wait_ns = std::min(int64_t{kPollMs} * 1'000'000, due - now);
  const timespec ts{static_cast<time_t>(wait_ns / 1'000'000'000), static_cast<long>(wait_ns % 1'000'000'000)};
  pollfd p{t.fd, POLLIN, 0};
  counter_add(t.sleeps);
  ::ppoll(&p, 1, &ts, nullptr);
}

// One engine burst: each datagram of each GRO train in turn, then the timers that came due, and the
// burst's results sent now or held for the next burst's (--hold-us).
void UdpBackend::handle_burst(Thread& t, unsigned n) {
  counter_add(t.rx_bursts);
  const uint64_t now = monotonic_ns();
  engine_.begin_burst(t.index);
  for (unsigned i = 0; i < n; ++i) {
    const msghdr& h = t.rx_msgs[i].msg_hdr;
    const uint8_t* data = t.rx_buf.data() + size_t(i) * t.rx_size;
    size_t len = t.rx_msgs[i].msg_len;
    if (h.msg_flags & MSG_TRUNC) {
      // Longer than any valid datagram: hand the engine a length it rejects (bad_length).
      counter_add(t.truncated);
      len = t.rx_size;
    }
    size_t seg = len;  // a GRO train is a run of datagrams of `seg` bytes (the last may be shorter)
    if (const int s = t.gro ? gro_segment_size(h) : 0; s > 0 && size_t(s) < len) {
      seg = size_t(s);
      counter_add(t.gro_trains);
    }
    size_t off = 0;
    do {
      const size_t l = std::min(seg, len - off);
      counter_add(t.rx_datagrams);
      if (t.loss.drop())
        counter_add(t.injected_drops);
      else
        ingest(t, data + off, l, t.rx_addr[i], now);
      off += l;
    } while (off < len);
  }
  engine_.end_burst(t.index);
  if (static_cast<int64_t>(now) >= t.uplink.next_deadline()) fire_uplink(t, now);
  if (static_cast<int64_t>(now) >= t.deadlines.next()) fire_deadlines(t, now);
  if (t.hold.wait(now, t.out.datagrams()))
    counter_add(t.held_bursts);
  else
    flush(t);
}

void UdpBackend::ingest(Thread& t, const uint8_t* data, size_t len, const sockaddr_in& src, uint64_t now) {
  const IngestResult r = engine_.ingest(t.index, data, len, now, Endpoint{src.sin_addr.s_addr, src.sin_port});
  // A leaf's uplink timers (docs/protocol.md §8): a rack's round going up starts one, and the spine's
  // RESULT of that round stops it.
  if (r.kind == IngestResult::kSend) {
    if (r.from_spine && r.type == GS_MSG_RESULT)
      t.uplink.delivered(r.job_id, r.slot, static_cast<int64_t>(now));
    else if (r.type == GS_MSG_DATA)
      t.uplink.sent(r.job_id, r.slot, static_cast<int64_t>(now));
  }
  if (r.deadline_ns) t.deadlines.add({r.deadline_ns, r.job_id, r.seq, r.offset, r.slot, r.version});
  t.hold.saw(r);
  if (r.kind == IngestResult::kSend) queue(t, r);
}

// Rounds whose deadline passed close with the contributions present; their results go at once.
void UdpBackend::fire_deadlines(Thread& t, uint64_t now) {
  engine_.begin_burst(t.index);
  t.deadlines.fire(now, [&](const RoundDeadlines::Due& d) {
    const IngestResult r = engine_.close_overdue(t.index, d.job_id, d.slot, d.version, d.seq, d.offset, now);
    if (r.kind == IngestResult::kSend) queue(t, r);
  });
  engine_.end_burst(t.index);
  flush(t);
}

void UdpBackend::fire_uplink(Thread& t, uint64_t now) {
  engine_.begin_burst(t.index);
  t.uplink.fire(static_cast<int64_t>(now), [&](uint32_t job_id, uint16_t slot) {
    IngestResult r = engine_.uplink_resend(t.index, job_id, slot);
    if (r.kind != IngestResult::kSend)
      return r.job_id ? UplinkTimers::Resend::kNoRound : UplinkTimers::Resend::kNoJob;
    queue(t, r);
    return UplinkTimers::Resend::kSent;
  });
  engine_.end_burst(t.index);
}

// Copies a result out of the engine (r.data and r.endpoints are only valid until the next
// ingest) into the burst's batch, with the others to the same destinations (result_batch.h).
void UdpBackend::queue(Thread& t, const IngestResult& r) {
  const uint64_t dests = destinations(r);
  if (r.len == 0 || r.len > 65507 || r.endpoints == nullptr || dests == 0) {
    counter_add(t.send_errors);
    return;
  }
  if (t.out.add(r, t.gso)) return;
  flush(t);
  if (!t.out.add(r, t.gso)) counter_add(t.send_errors);  // larger than an empty batch holds
}

void UdpBackend::flush(Thread& t) {
  t.hold.sent();
  if (t.out.empty()) return;
  t.out.write(t.gso, [&](mmsghdr* msgs, size_t n) { send_msgs(t, msgs, n); });
  t.out.for_each_sent([&](uint32_t job_id, uint64_t pkts, uint64_t bytes) {
    engine_.count_sent(t.index, job_id, static_cast<uint32_t>(pkts), bytes);
  });
  t.out.clear();
}

void UdpBackend::send_msgs(Thread& t, mmsghdr* msgs, size_t n) {
  auto bytes_of = [](const msghdr& h) {
    uint64_t b = 0;
    for (size_t k = 0; k < h.msg_iovlen; ++k) b += h.msg_iov[k].iov_len;
    return b;
  };
  size_t i = 0;
  int retries = 0;
  while (i < n) {
    int k = ::sendmmsg(t.fd, &msgs[i], static_cast<unsigned>(n - i), 0);
    if (k > 0) {
      for (int j = 0; j < k; ++j) {
        const msghdr& h = msgs[i + j].msg_hdr;
        const bool gso = h.msg_controllen != 0;
        t.out.sent(i + j, gso ? h.msg_iovlen : 1, bytes_of(h));
        if (gso) counter_add(t.gso_writes);
      }
      i += size_t(k);
      retries = 0;
      continue;
    }
    if (errno == EINTR) continue;
    if ((errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) && retries++ < 20) {
      pollfd p{t.fd, POLLOUT, 0};
      ::poll(&p, 1, 5);
      continue;
    }
    msghdr& h = msgs[i].msg_hdr;
    if (h.msg_controllen != 0 &&
        (errno == EIO || errno == EINVAL || errno == ENOPROTOOPT || errno == EMSGSIZE)) {
      // The kernel or the route cannot segment: fall back to one datagram per result for good.
      if (t.gso)
        GS_LOG_WARN("udp thread %u: UDP GSO failed (%s); sending datagrams one by one", t.index,
                    std::strerror(errno));
      t.gso = false;
      for (size_t d = 0; d < h.msg_iovlen; ++d) {  // each iovec is one datagram
        const iovec& v = h.msg_iov[d];
        if (::sendto(t.fd, v.iov_base, v.iov_len, 0, static_cast<sockaddr*>(h.msg_name), h.msg_namelen) ==
            ssize_t(v.iov_len))
          t.out.sent(i, 1, v.iov_len);
        else
          counter_add(t.send_errors);
      }
    } else {
      counter_add(t.send_errors);
    }
    ++i;
    retries = 0;
  }
}

}  // namespace

std::unique_ptr<Backend> make_udp_backend(Engine& engine, const SwitchConfig& config, std::string* error) {
  auto b = std::make_unique<UdpBackend>(engine, config);
  if (!b->open(error)) return nullptr;
  return b;
}

}  // namespace gradswitch
