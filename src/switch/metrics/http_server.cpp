// The metrics endpoint's HTTP server (see http_server.h).
#include "switch/metrics/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/tcp_listen.h"

namespace gradswitch::metrics {

namespace {

constexpr size_t kMaxRequestBytes = 8192;
// Connections open at once. Idle ones cannot hold them all: when full, a new connection evicts the
// oldest one that has not sent its request yet, so a scraper, which sends its request at once, is
// always served (an idle socket costs its opener as much as it costs us).
constexpr size_t kMaxConnections = 64;
constexpr int64_t kRequestTimeoutNs = 3'000'000'000;  // the whole request must arrive within this
constexpr int64_t kReplyTimeoutNs = 10'000'000'000;   // and the reply must be taken within this
constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

std::string response(int status, const char* reason, const std::string& content_type, const std::string& body,
                     bool head_only, const std::string& extra_headers = "") {
  std::string r = "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\nContent-Type: " + content_type +
                  "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n" +
                  extra_headers + "\r\n";
  if (!head_only) r += body;
  return r;
}

bool iequal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\r')) v.remove_suffix(1);
  return v;
}

// One connection: its request as it arrives, then its reply as the socket takes it.
struct Conn {
  int fd = -1;
  uint64_t order = 0;  // accept order: the lowest is the oldest
  std::string in, out;
  size_t sent = 0;
  bool replied = false;
  int64_t deadline_ns = 0;

  // Reads what arrived, answers a whole request (through `answer`), sends what the socket takes:
  // false once the connection is done (answered, failed, or past its deadline).
  template <typename Answer>
  bool advance(int64_t now, Answer&& answer) {
    if (!replied && !read_request(now, answer)) return false;
    if (replied && sent < out.size()) {
      ssize_t n = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) sent += static_cast<size_t>(n);
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    }
    if (replied && sent == out.size()) return false;
    return now <= deadline_ns;
  }

 private:
  // False when the peer closed or failed; a whole request (or one too long) gets its reply.
  template <typename Answer>
  bool read_request(int64_t now, Answer& answer) {
    char buf[4096];
    for (;;) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
      if (n < 0) break;
      in.append(buf, static_cast<size_t>(n));
      if (in.size() > kMaxRequestBytes || in.find("\r\n\r\n") != std::string::npos) break;
    }
    const size_t end = in.find("\r\n\r\n");
    if (end == std::string::npos && in.size() > kMaxRequestBytes) {
      out = "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
      replied = true;
    } else if (end != std::string::npos) {
      out = answer(in.substr(0, end + 4));
      in.clear();
      replied = true;
      deadline_ns = now + kReplyTimeoutNs;
    }
    return true;
  }
};

// The open connections, by fd; at most kMaxConnections, the oldest still waiting evicted first.
class Connections {
 public:
  ~Connections() {
    for (auto& [fd, c] : conns_) ::close(fd);
  }
  bool room() const { return conns_.size() < kMaxConnections || oldest_waiting() >= 0; }
  // Adds every connection to the poll set, for its request or its reply.
  void poll_set(std::vector<pollfd>* fds) const {
    for (auto& [fd, c] : conns_) fds->push_back({fd, static_cast<short>(c->replied ? POLLOUT : POLLIN), 0});
  }
  // Advances the connections poll found ready (from fds[first]) or past their deadline.
  template <typename Answer>
  void service(const std::vector<pollfd>& fds, size_t first, int64_t now, Answer&& answer) {
    std::vector<int> done;
    for (size_t i = first; i < fds.size(); ++i) {
      auto it = conns_.find(fds[i].fd);
      if (it == conns_.end()) continue;
      if ((fds[i].revents || now > it->second->deadline_ns) && !it->second->advance(now, answer))
        done.push_back(fds[i].fd);
    }
    for (int fd : done) close(fd);
  }
  // Accepts what the listening socket holds, evicting to make room; returns the evictions.
  template <typename Answer>
  uint64_t accept_all(int listen_fd, int64_t now, Answer&& answer) {
    uint64_t evicted = 0;
    for (int n = 0; n < 4 * static_cast<int>(kMaxConnections); ++n) {
      if (conns_.size() >= kMaxConnections) {
        const int victim = oldest_waiting();
        if (victim < 0) break;
        close(victim);
        ++evicted;
      }
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) break;
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->order = accepted_++;
      c->deadline_ns = now + kRequestTimeoutNs;
      // A scraper's request is usually there already: answer it now, before any later connection
      // of this burst could evict it.
      if (!c->advance(now, answer)) {
        ::close(fd);
        continue;
      }
      conns_.emplace(fd, std::move(c));
    }
    return evicted;
  }

 private:
  void close(int fd) {
    if (conns_.erase(fd)) ::close(fd);
  }
  // The oldest connection still waiting for its request, or -1.
  int oldest_waiting() const {
    int fd = -1;
    uint64_t order = UINT64_MAX;
    for (auto& [f, c] : conns_)
      if (!c->replied && c->order < order) fd = f, order = c->order;
    return fd;
  }
  std::map<int, std::unique_ptr<Conn>> conns_;
  uint64_t accepted_ = 0;
};

}  // namespace

Credential bearer_credential(const std::string& request) {
  Credential c;
  // Header lines follow the request line; names are case-insensitive (RFC 9110), and so is the
  // scheme. The first Authorization header counts.
  size_t pos = request.find('\n');
  while (pos != std::string::npos && pos + 1 < request.size()) {
    const size_t next = request.find('\n', pos + 1);
    const std::string_view line(request.data() + pos + 1,
                                (next == std::string::npos ? request.size() : next) - pos - 1);
    pos = next;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || !iequal(trim(line.substr(0, colon)), "authorization")) continue;
    c.given = true;
    const std::string_view value = trim(line.substr(colon + 1));
    const size_t sp = value.find(' ');
    if (sp != std::string_view::npos && iequal(value.substr(0, sp), "bearer"))
      c.bearer = std::string(trim(value.substr(sp + 1)));
    break;
  }
  return c;
}

HttpReply answer_http(const std::string& request, const HttpServer::Render& render) {
  HttpReply r;
  const size_t eol = request.find("\r\n");
  const std::string first = request.substr(0, eol == std::string::npos ? request.find('\n') : eol);
  const size_t sp1 = first.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : first.find(' ', sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos || first.compare(sp2 + 1, 5, "HTTP/") != 0) {
    r.bytes = response(400, "Bad Request", "text/plain", "expected an HTTP request line\n", false);
    return r;
  }
  const std::string method = first.substr(0, sp1);
  std::string target = first.substr(sp1 + 1, sp2 - sp1 - 1);
  target = target.substr(0, target.find('?'));  // Prometheus may add parameters; there are none
  const bool head = method == "HEAD";
  if (method != "GET" && !head) {
    r.bytes = response(405, "Method Not Allowed", "text/plain", "only GET and HEAD\n", false,
                       "Allow: GET, HEAD\r\n");
    return r;
  }
  if (target == "/metrics") {
    const Credential cred = bearer_credential(request);
    std::optional<std::string> body = render(cred.bearer);
    if (!body) {
      // RFC 6750: the scheme to use, and whether the one given was wrong. No metric in the body.
      r.bytes = response(401, "Unauthorized", "text/plain",
                         "/metrics needs Authorization: Bearer <token> (docs/observability.md)\n", head,
                         std::string("WWW-Authenticate: Bearer realm=\"gradswitch\"") +
                             (cred.given ? ", error=\"invalid_token\"" : "") + "\r\n");
      r.refused = true;
      return r;
    }
    r.bytes = response(200, "OK", kContentType, *body, head);
    r.scrape = !head;
  } else if (target == "/") {
    r.bytes = response(200, "OK", "text/html; charset=utf-8",
                       "<html><head><title>gradswitchd</title></head><body><h1>gradswitchd</h1>"
                       "<p><a href=\"/metrics\">Metrics</a></p></body></html>\n",
                       head);
  } else {
    r.bytes = response(404, "Not Found", "text/plain", "not found: try /metrics\n", head);
  }
  return r;
}

HttpServer::HttpServer(std::string host, uint16_t port, Render render)
    : host_(std::move(host)), port_(port), render_(std::move(render)) {}

HttpServer::~HttpServer() {
  stop();
}

std::string HttpServer::url() const {
  return "http://" + host_ + ":" + std::to_string(port_) + "/metrics";
}

bool HttpServer::start(std::string* error) {
  std::string why;
  int fd = tcp_listen(host_, port_, 64, &port_, &why);
  if (fd < 0) {
    *error = "metrics: " + why + " (choose another --metrics-port)";
    return false;
  }
  listen_fd_ = fd;
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  thread_ = std::thread([this] { run(); });
  return true;
}

void HttpServer::stop() {
  if (!thread_.joinable()) return;
  stopping_.store(true);
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
  thread_.join();
  ::close(listen_fd_);
  ::close(wake_fd_);
  listen_fd_ = wake_fd_ = -1;
}

void HttpServer::run() {
  Connections conns;
  std::vector<pollfd> fds;
  auto answer = [this](const std::string& request) {
    HttpReply r = answer_http(request, render_);
    if (r.scrape) scrapes_.fetch_add(1, std::memory_order_relaxed);
    if (r.refused) refused_.fetch_add(1, std::memory_order_relaxed);
    return std::move(r.bytes);
  };
  while (!stopping_.load()) {
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, static_cast<short>(conns.room() ? POLLIN : 0), 0});
    conns.poll_set(&fds);
    if (::poll(fds.data(), fds.size(), 500) < 0 && errno != EINTR) break;
    const int64_t now = steady_now_ns();
    conns.service(fds, 2, now, answer);
    if (fds[1].revents & POLLIN)
      evicted_.fetch_add(conns.accept_all(listen_fd_, now, answer), std::memory_order_relaxed);
  }
}

}  // namespace gradswitch::metrics
