// The metrics endpoint's HTTP server (see http_server.h).
#include "switch/metrics/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "common/tcp_listen.h"

namespace gradswitch::metrics {

namespace {

constexpr size_t kMaxRequestBytes = 8192;
constexpr size_t kMaxConnections = 64;
constexpr int64_t kConnectionTimeoutNs = 5'000'000'000;
constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string response(int status, const char* reason, const std::string& content_type, const std::string& body,
                     bool head_only, const char* extra_headers = "") {
  std::string r = "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\nContent-Type: " + content_type +
                  "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n" +
                  extra_headers + "\r\n";
  if (!head_only) r += body;
  return r;
}

struct Conn {
  int fd = -1;
  std::string in, out;
  size_t sent = 0;
  bool replied = false;
  int64_t deadline_ns = 0;
};

}  // namespace

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
    r.bytes = response(200, "OK", kContentType, render(), head);
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
  std::map<int, std::unique_ptr<Conn>> conns;
  std::vector<pollfd> fds;
  while (!stopping_.load()) {
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, static_cast<short>(conns.size() < kMaxConnections ? POLLIN : 0), 0});
    for (auto& [fd, c] : conns) fds.push_back({fd, static_cast<short>(c->replied ? POLLOUT : POLLIN), 0});
    if (::poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR) break;
    const int64_t now = now_ns();
    if (fds[1].revents & POLLIN) {
      for (;;) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        auto c = std::make_unique<Conn>();
        c->fd = fd;
        c->deadline_ns = now + kConnectionTimeoutNs;
        conns.emplace(fd, std::move(c));
        if (conns.size() >= kMaxConnections) break;
      }
    }
    std::vector<int> done;
    for (size_t i = 2; i < fds.size(); ++i) {
      auto it = conns.find(fds[i].fd);
      if (it == conns.end()) continue;
      Conn& c = *it->second;
      if (!c.replied && (fds[i].revents & (POLLIN | POLLHUP | POLLERR))) {
        char buf[4096];
        ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
        if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR))) {
          done.push_back(c.fd);
          continue;
        }
        if (n > 0) c.in.append(buf, static_cast<size_t>(n));
        const size_t end = c.in.find("\r\n\r\n");
        if (end == std::string::npos && c.in.size() > kMaxRequestBytes) {
          c.out =
              "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: "
              "close\r\n\r\n";
          c.replied = true;
        } else if (end != std::string::npos) {
          HttpReply r = answer_http(c.in.substr(0, end + 4), render_);
          if (r.scrape) scrapes_.fetch_add(1, std::memory_order_relaxed);
          c.out = std::move(r.bytes);
          c.replied = true;
        }
      }
      if (c.replied && c.sent < c.out.size()) {
        ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) c.sent += static_cast<size_t>(n);
        if (n < 0 && errno != EAGAIN && errno != EINTR) done.push_back(c.fd);
      }
      if ((c.replied && c.sent == c.out.size()) || now > c.deadline_ns) done.push_back(c.fd);
    }
    for (int fd : done) {
      if (conns.erase(fd)) ::close(fd);
    }
  }
  for (auto& [fd, c] : conns) ::close(fd);
}

}  // namespace gradswitch::metrics
