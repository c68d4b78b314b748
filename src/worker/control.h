// The worker side of the TCP control plane (docs/protocol.md section 1): one connection per
// Group, kept open for the group's lifetime (closing it without LEAVE aborts the job).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace gradswitch::worker {

// Parsed reply line: ok, and either key=value pairs (OK) or code + message (ERR).
struct Reply {
  bool ok = false;
  std::map<std::string, std::string> kv;
  std::string code, message, line;
  // Value of `key`, or `dflt` when absent.
  std::string get(const std::string& key, const std::string& dflt = "") const;
  // Integer value of `key`; throws Error naming the reply when absent or malformed.
  long long get_int(const std::string& key) const;
};
Reply parse_reply(const std::string& line);

// What a JOIN returns.
struct JoinInfo {
  uint32_t job_id = 0;
  uint32_t key = 0;
  uint16_t slots = 0;
  uint32_t payload_bytes = 0;
  uint16_t data_port = 0;
  uint16_t threads = 1;
};

class ControlClient {
 public:
  // Resolves `host` (IPv4) and connects within `connect_timeout_s`; throws Error with a clear
  // message (what was tried, why it failed, what to check).
  ControlClient(const std::string& host, uint16_t port, double connect_timeout_s);
  ~ControlClient();
  ControlClient(const ControlClient&) = delete;
  ControlClient& operator=(const ControlClient&) = delete;

  // Sends one request line (without "\n") and returns the reply line. Throws Error on I/O
  // failure or TimeoutError when no reply arrives within `timeout_s`.
  std::string request(const std::string& line, double timeout_s);

  // JOIN; blocks until every rank joined (or the switch's join timeout). Throws Error for an
  // ERR reply (TimeoutError for ERR timeout or no reply within `timeout_s`).
  JoinInfo join(const std::string& job, unsigned world, unsigned rank, const std::string& wire,
                const std::string& token, uint16_t udp_port, double timeout_s);

  void close();
  bool is_open() const { return fd_ >= 0; }
  uint32_t peer_ipv4_be() const { return peer_ipv4_be_; }
  const std::string& endpoint() const { return endpoint_; }  // "host:port"

 private:
  std::mutex mu_;
  int fd_ = -1;
  uint32_t peer_ipv4_be_ = 0;
  std::string endpoint_;
  std::string rbuf_;
};

// Splits "host:port" (port optional: default 7700).
void split_host_port(const std::string& s, std::string* host, uint16_t* port);

}  // namespace gradswitch::worker
