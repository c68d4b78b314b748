// The switch's metrics endpoint (--metrics-port): a small HTTP/1.1 server on its own thread that
// answers `GET /metrics` with the text `render()` returns (Prometheus' text format), `GET /` with a
// pointer to it, and anything else with 404/405/400. It never touches the data path: render() is
// called on this thread for each scrape and reads counters without locks (collector.h).
//
// Deliberately small: one request per connection (the reply says Connection: close), at most 64
// connections, requests over 8 KiB or slower than 5 s are dropped. A scraper such as Prometheus
// simply reconnects for its next scrape.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

namespace gradswitch::metrics {

class HttpServer {
 public:
  using Render = std::function<std::string()>;

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

 private:
  void run();

  std::string host_;
  uint16_t port_;
  Render render_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: stop() wakes the poll
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> scrapes_{0};
  std::thread thread_;
};

// The reply to one HTTP request (exposed for tests): the full response bytes, and whether it was a
// scrape. `request` is everything up to and including the blank line.
struct HttpReply {
  std::string bytes;
  bool scrape = false;
};
HttpReply answer_http(const std::string& request, const HttpServer::Render& render);

}  // namespace gradswitch::metrics
