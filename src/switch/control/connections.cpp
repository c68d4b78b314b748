// The control port's connections (see connections.h): the listening socket, accept and its
// capacity rules, input, output (replies, events, STATE_GET streams) and closing.
#include "switch/control/connections.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>

#include "common/clock.h"
#include "common/tcp_listen.h"
#include "switch/log.h"

namespace gradswitch::control {

namespace {
constexpr size_t kMaxConnections = 4096;

constexpr size_t kMaxOutput = 1 << 20;  // a client that does not read its replies is closed
// Per connection and poll round: bytes read (binary uploads) and written (STATE_GET), so that one
// large transfer cannot stall the other connections.
constexpr size_t kReadBudget = 1 << 20;
constexpr size_t kWriteBudget = 4 << 20;

// A connection the switch has no room for gets one line before it is closed.
void refuse(int fd, const char* why = "too many control connections") {
  const std::string line = std::string(GS_REPLY_ERR " " GS_ERR_NO_RESOURCES " ") + why + "\n";
  (void)!::send(fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::close(fd);
}
}  // namespace

Connections::Connections(const SwitchConfig& config, ConnectionHandler& handler)
    : config_(config), handler_(handler) {}

Connections::~Connections() {
  for (auto& [id, c] : conns_) ::close(c->fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (spare_fd_ >= 0) ::close(spare_fd_);
}

bool Connections::listen(std::string* error) {
  std::string why;
  int fd = tcp_listen(config_.control_host, config_.control_port, 128, nullptr, &why);
  if (fd < 0) {
    *error = "control plane: " + why + " (another gradswitchd running? choose another --control-port)";
    return false;
  }
  listen_fd_ = fd;
  spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  return true;
}

std::string Connections::describe() const {
  return config_.control_host + ":" + std::to_string(config_.control_port);
}

Conn* Connections::find(uint64_t id) {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second.get();
}

const Conn* Connections::find(uint64_t id) const {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second.get();
}

void Connections::add(std::unique_ptr<Conn> c) {
  const uint64_t id = c->id;
  conns_.emplace(id, std::move(c));
}

void Connections::poll_once(int timeout_ms, uint64_t now_ns) {
  std::vector<pollfd> fds;
  std::vector<Conn*> who;
  fds.reserve(conns_.size() + 1);
  fds.push_back({listen_fd_, POLLIN, 0});
  who.push_back(nullptr);
  for (auto& [id, c] : conns_) {
    short ev = POLLRDHUP;
    if (!c->eof && !c->input_paused()) ev |= POLLIN;
    if (!c->out.empty() || !c->stream.empty()) ev |= POLLOUT;
    fds.push_back({c->fd, ev, 0});
    who.push_back(c.get());
  }
  int n = ::poll(fds.data(), fds.size(), timeout_ms);
  if (n <= 0) return;
  for (size_t i = 1; i < fds.size(); ++i) {
    Conn& c = *who[i];
    if (fds[i].revents & POLLOUT) {
      const bool streaming = !c.stream.empty();
      flush(c);
      // Requests that arrived while a STATE_GET stream was going out.
      if (streaming && c.stream.empty() && c.in.buffered()) handler_.on_input(c, now_ns);
    }
    if (fds[i].revents & (POLLIN | POLLHUP | POLLERR | POLLRDHUP)) read_input(c, now_ns);
  }
  if (fds[0].revents & POLLIN) accept_all(now_ns);
}

// With an auth file, a new connection always gets in while some connection is neither authenticated
// nor in a job (docs/security.md, "the control port"): when the switch is full, or that pool is at
// --max-unauth-connections, one of the pool is closed for it. The victim is the oldest connection of
// the address that holds the most of the pool (ties: the oldest of all), so that a flood from some
// addresses evicts its own connections first, and a connection that just arrived survives until as
// many newer ones have arrived as the pool holds; the handshake deadline closes what is left idle.
// Out of total room, connections already closing (an error sent, draining) go first.
struct Connections::Pool {
  std::map<uint32_t, std::deque<uint64_t>> by_addr;  // oldest first (connection ids grow)
  std::deque<uint64_t> closing;
  size_t size = 0;
  void add(uint32_t addr, uint64_t id) {
    by_addr[addr].push_back(id);
    ++size;
  }
  // The victim's id, taken out of the pool; 0 for none.
  uint64_t take() {
    auto best = by_addr.end();
    for (auto it = by_addr.begin(); it != by_addr.end(); ++it)
      if (best == by_addr.end() || it->second.size() > best->second.size() ||
          (it->second.size() == best->second.size() && it->second.front() < best->second.front()))
        best = it;
    if (best == by_addr.end()) return 0;
    const uint64_t id = best->second.front();
    best->second.pop_front();
    if (best->second.empty()) by_addr.erase(best);
    --size;
    return id;
  }
};

bool Connections::outside_job(const Conn& c) {
  return c.role == Conn::Role::kNone || c.role == Conn::Role::kLeft;
}

bool Connections::in_unauth_pool(const Conn& c) const {
  return authenticating_ && !c.dead && !c.closing && c.tenant == kAnonymous && outside_job(c);
}

void Connections::evict(Conn& c, const char* code, const std::string& message) {
  if (code) {
    const std::string line = format_error({code, message});
    (void)!::send(c.fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  handler_.on_depart(c, monotonic_ns());
  ::close(c.fd);
  ++evicted_;
  conns_.erase(c.id);  // `c` is gone from here on
}

bool Connections::make_room(Pool& pool, bool total_full, uint64_t now_ns) {
  for (;;) {
    uint64_t id = 0;
    const char* code = nullptr;
    if (total_full && !pool.closing.empty()) {
      id = pool.closing.front();
      pool.closing.pop_front();
    } else {
      id = pool.take();
      code = kErrNoResources;
    }
    if (id == 0) return false;
    Conn* c = find(id);
    if (!c) continue;
    if (now_ns >= next_evict_warning_ns_) {  // one line per 10 s, however many are closed
      GS_LOG_WARN(
          "control plane: closing connections to make room for new ones (%llu so far): more than "
          "--max-unauth-connections %u are neither authenticated nor in a job, or the switch holds %zu",
          static_cast<unsigned long long>(evicted_ + 1), config_.max_unauth_connections, kMaxConnections);
      next_evict_warning_ns_ = now_ns + 10'000'000'000ull;
    }
    evict(*c, code,
          "closed to make room: " + std::to_string(config_.max_unauth_connections) +
              " control connections at most may be neither authenticated nor in a job "
              "(--max-unauth-connections), and this was the oldest of the address that holds the most");
    return true;
  }
}

void Connections::accept_all(uint64_t now_ns) {
  if (spare_fd_ < 0) spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);  // lost to a race before
  // Connections that closed in this round leave first (their departure is due anyway), so that the
  // counts below are of connections that are still there.
  sweep(now_ns);
  std::optional<Pool> pool;  // with an auth file: built at the first connection accepted
  auto build_pool = [&]() -> Pool& {
    if (pool) return *pool;
    pool.emplace();
    for (auto& [id, c] : conns_)
      if (in_unauth_pool(*c))
        pool->add(c->peer_ipv4_be, id);
      else if (c->closing && !c->dead)
        pool->closing.push_back(id);
    return *pool;
  };
  for (;;) {
    sockaddr_in a{};
    socklen_t alen = sizeof a;
    int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&a), &alen, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Linux reports EMFILE before it looks for a waiting connection: stop when none was there.
      if ((errno == EMFILE || errno == ENFILE) && spare_fd_ >= 0) {
        // With an auth file, a descriptor freed by an eviction takes the waiting connection in.
        if (authenticating_ && make_room(build_pool(), /*total_full=*/true, now_ns)) continue;
        if (refuse_without_descriptors(now_ns)) continue;
        return;
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        GS_LOG_WARN("control plane: accept(): %s", std::strerror(errno));
      return;
    }
    if (authenticating_) build_pool();
    if (conns_.size() >= kMaxConnections && !(pool && make_room(*pool, /*total_full=*/true, now_ns))) {
      refuse(fd);
      continue;
    }
    if (pool && pool->size >= config_.max_unauth_connections) make_room(*pool, /*total_full=*/false, now_ns);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_unique<Conn>();
    c->id = next_conn_id_++;
    c->fd = fd;
    c->peer_ipv4_be = a.sin_addr.s_addr;
    c->outside_since_ns = now_ns;
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
    c->peer = std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
    c->privileged = !authenticating_;  // without --auth-file everyone is trusted alike (docs/security.md)
    GS_LOG_DEBUG("control: connection from %s", c->peer.c_str());
    if (pool) pool->add(c->peer_ipv4_be, c->id);
    conns_.emplace(c->id, std::move(c));
  }
}

bool Connections::refuse_without_descriptors(uint64_t now_ns) {
  ::close(spare_fd_);
  int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) refuse(fd);
  spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ++refused_no_fd_;
  if (now_ns >= next_fd_warning_ns_) {  // one line per 10 s, however many are refused
    GS_LOG_WARN(
        "control plane: out of file descriptors (%s): %llu connection(s) refused so far; raise the "
        "limit (ulimit -n, LimitNOFILE=) above the connections and jobs this switch serves",
        std::strerror(EMFILE), static_cast<unsigned long long>(refused_no_fd_));
    next_fd_warning_ns_ = now_ns + 10'000'000'000ull;
  }
  return true;
}

bool Connections::take_input(Conn& c, const char* buf, size_t n, uint64_t now_ns) {
  c.in.append(buf, n);
  // An incomplete line times out (--handshake-timeout): note since when the input ends in one.
  if (buf[n - 1] == '\n')
    c.partial_since_ns = 0;
  else if (c.partial_since_ns == 0)
    c.partial_since_ns = now_ns;
  handler_.on_input(c, now_ns);
  if (c.auth_wait && c.in.buffered() > kMaxPausedInput) {
    close_with_error(c, kErrTooLong,
                     "more than " + std::to_string(kMaxPausedInput) +
                         " bytes of requests behind an AUTH whose answer is deferred (backoff after "
                         "failed AUTHs); closing the connection");
    return false;
  }
  if (c.role == Conn::Role::kPending && c.in.buffered() > kMaxPausedInput) {
    // Not reading it could miss its close (a FIN queued behind unread bytes): so it is read, and
    // a client that sends this much behind a held JOIN gives the JOIN up.
    handler_.on_depart(c, now_ns);
    close_with_error(c, kErrTooLong,
                     "more than " + std::to_string(kMaxPausedInput) +
                         " bytes of requests behind a JOIN whose reply is held: the JOIN is withdrawn; "
                         "closing the connection");
    return false;
  }
  return true;
}

void Connections::read_input(Conn& c, uint64_t now_ns) {
  if (c.dead) return;
  char buf[65536];
  size_t budget = kReadBudget;
  while (!c.eof && budget > 0) {  // the rest of a large upload waits for the next poll round
    ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n > 0) budget -= std::min(budget, static_cast<size_t>(n));
    if (n > 0 && c.closing) continue;  // draining before the close
    if (n > 0) {
      if (take_input(c, buf, static_cast<size_t>(n), now_ns) && c.input_paused()) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0) c.last_errno = errno;
    c.eof = true;  // closed or reset
  }
  // A peer that closed its side is gone, but its complete lines (e.g. a final LEAVE) count.
  if (c.eof) {
    handler_.on_input(c, now_ns);
    c.dead = true;
  }
}

void Connections::close_with_error(Conn& c, const char* code, const std::string& message) {
  c.closing = true;
  c.in = LineFramer();
  c.bin.reset();
  reply_error(c, code, message);
}

void Connections::send_event(Conn& c, const std::string& line) {
  if (!c.stream.empty()) {  // a STATE_GET payload is going out: the event follows it
    c.deferred_events += line;
    return;
  }
  reply(c, line);
}

void Connections::close_all(uint64_t now_ns) {
  for (auto& [id, c] : conns_) c->dead = true;
  sweep(now_ns);
}

void Connections::reply(Conn& c, const std::string& line) {
  if (c.dead) return;
  c.out += line;
  flush(c);
}

void Connections::reply_error(Conn& c, const char* code, const std::string& message) {
  GS_LOG_DEBUG("control: %s: ERR %s %s", c.peer.c_str(), code, message.c_str());
  reply(c, format_error({code, message}));
}

void Connections::flush_all() {
  for (auto& [id, c] : conns_) flush(*c);
}

void Connections::flush(Conn& c) {
  size_t budget = kWriteBudget;
  while (!c.dead && budget > 0) {
    Conn::Segment* seg = nullptr;
    const uint8_t* data;
    size_t len;
    if (!c.out.empty()) {
      data = reinterpret_cast<const uint8_t*>(c.out.data());
      len = c.out.size();
    } else if (!c.stream.empty()) {
      seg = &c.stream.front();
      if (seg->sent == seg->len) {
        c.stream.pop_front();
        if (c.stream.empty()) c.out.swap(c.deferred_events);  // c.out is empty here
        continue;
      }
      data = seg->data() + seg->sent;
      len = seg->len - seg->sent;
    } else {
      break;
    }
    ssize_t n = ::send(c.fd, data, std::min(len, budget), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      budget -= static_cast<size_t>(n);
      if (seg)
        seg->sent += static_cast<size_t>(n);
      else
        c.out.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    c.dead = true;  // broken pipe or reset
  }
  if (c.out.size() > kMaxOutput) {
    GS_LOG_WARN("control: %s does not read its replies; closing it", c.peer.c_str());
    c.dead = true;
  }
  if (c.closing && c.out.empty() && !c.wr_shut && !c.dead) {
    // Closing with unread input would reset the connection and could destroy the error reply
    // before the client reads it: send FIN, then discard input until EOF or a deadline.
    ::shutdown(c.fd, SHUT_WR);
    c.wr_shut = true;
    c.drain_deadline_ns = monotonic_ns() + 2'000'000'000ull;
  }
}

void Connections::expire_drains(uint64_t now_ns) {
  for (auto& [id, c] : conns_)
    if (c->wr_shut && now_ns >= c->drain_deadline_ns) c->dead = true;
}

void Connections::sweep(uint64_t now_ns) {
  std::vector<uint64_t> gone;
  for (auto& [id, c] : conns_)
    if (c->dead) gone.push_back(id);
  for (uint64_t id : gone) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    Conn& c = *it->second;
    handler_.on_depart(c, now_ns);
    GS_LOG_DEBUG("control: %s closed", c.peer.c_str());
    ::close(c.fd);
    conns_.erase(it);
  }
}

}  // namespace gradswitch::control
