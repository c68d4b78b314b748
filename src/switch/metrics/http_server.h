// The switch's metrics endpoint (--metrics-port): a small HTTP/1.1 server on its own thread that
// answers `GET /metrics` with the text `render()` returns (Prometheus' text format), `GET /` with a
// pointer to it, and anything else with 404/405/400. It never touches the data path: render() is
// called on this thread for each scrape and reads counters without locks (collector.h).
//
// Deliberately small: one request per connection (the reply says Connection: close), at most 64
// connections, requests over 8 KiB or not complete within 3 s are dropped, and when all 64 are
// taken a new connection evicts the oldest that has not sent its request: idle sockets cannot keep
// a scraper out. A scraper such as Prometheus simply reconnects for its next scrape.
//
// `GET /metrics` passes the request's bearer token (`Authorization: Bearer <token>`, "" for none)
// to the render function, which refuses it (401 with `WWW-Authenticate: Bearer`, no metric in the
// body) or answers with what that token may see (docs/observability.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>

namespace gradswitch::metrics {

class HttpServer {
 public:
  // The body for a scrape with this bearer token, or std::nullopt to refuse it (401).
  using Render = std::function<std::optional<std::string>(const std::string& bearer)>;

  HttpServer(std::string host, uint16_t port, Render render);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the thread; false with `error` set (the port is taken, ...).
  bool start(std::string* error);
  // Stops the thread and closes every connection. Idempotent.
  void stop();
  // The port listened on (the one chosen by the kernel when constructed with 0).
  uint16_t port() const { return port_; }
  // "http://127.0.0.1:9100/metrics"
  std::string url() const;
  // Scrapes answered so far (GET /metrics with status 200).
  uint64_t scrapes() const { return scrapes_.load(std::memory_order_relaxed); }
  // Scrapes refused for want of a valid token (401), and connections evicted to make room.
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  uint64_t evicted() const { return evicted_.load(std::memory_order_relaxed); }

 private:
  void run();

  std::string host_;
  uint16_t port_;
  Render render_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: stop() wakes the poll
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> scrapes_{0}, refused_{0}, evicted_{0};
  std::thread thread_;
};

// The reply to one HTTP request (exposed for tests): the full response bytes, and whether it was a
// scrape. `request` is everything up to and including the blank line.
struct HttpReply {
  std::string bytes;
  bool scrape = false;
  bool refused = false;  // 401
};
HttpReply answer_http(const std::string& request, const HttpServer::Render& render);

// The request's Authorization header: whether there is one, and its bearer token ("" when there is
// none or it has another scheme).
struct Credential {
  bool given = false;
  std::string bearer;
};
Credential bearer_credential(const std::string& request);

}  // namespace gradswitch::metrics
