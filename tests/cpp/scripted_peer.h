// A one-connection TCP peer on 127.0.0.1 standing in for a switch's control port (worker tests):
// sends `greeting` once connected, answers every request line with `answer` (if not empty), and
// closes after `close_after_ms` (if >= 0) or when destroyed.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

class ScriptedPeer {
 public:
  explicit ScriptedPeer(std::string answer) : ScriptedPeer("", std::move(answer)) {}
  ScriptedPeer(std::string greeting, std::string answer, int close_after_ms = -1) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listen_fd_, 1);
    socklen_t len = sizeof a;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([=, this] { serve(greeting, answer, close_after_ms); });
  }
  ~ScriptedPeer() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    ::close(listen_fd_);
  }
  ScriptedPeer(const ScriptedPeer&) = delete;
  ScriptedPeer& operator=(const ScriptedPeer&) = delete;
  uint16_t port() const { return port_; }

 private:
  void serve(const std::string& greeting, const std::string& answer, int close_after_ms) {
    int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) return;
    if (!greeting.empty()) (void)!::send(fd, greeting.data(), greeting.size(), MSG_NOSIGNAL);
    timeval tv{0, 20000};  // recv returns every 20 ms: the stop flag and the closing time are seen
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const auto start = std::chrono::steady_clock::now();
    std::string in;
    while (!stop_) {
      char buf[512];
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n == 0) break;
      if (n > 0) in.append(buf, static_cast<size_t>(n));
      for (auto nl = in.find('\n'); nl != std::string::npos; nl = in.find('\n')) {
        in.erase(0, nl + 1);
        if (!answer.empty()) (void)!::send(fd, answer.data(), answer.size(), MSG_NOSIGNAL);
      }
      const auto ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      if (close_after_ms >= 0 && ms.count() >= close_after_ms) break;
    }
    ::close(fd);
  }

  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};
