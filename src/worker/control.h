// The worker side of the TCP control plane (docs/protocol.md section 1): one connection per
// Group, kept open for the group's lifetime (closing it without LEAVE aborts the job).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

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
  // Every rank's UDP address "ip:port,ip:port,..." in rank order (for the ring); "" from a switch
  // that does not send it.
  std::string peers;
  // Optimizer jobs (docs/protocol.md section 1.3): the algorithm ("" for a plain job), the number
  // of parameters, elements per chunk and the size of the STATE_GET blob.
  std::string optimizer;
  uint64_t params = 0;
  uint32_t chunk = 0;
  uint64_t state_bytes = 0;
  // Bounded-time rounds (docs/protocol.md §3.1): the reply's deadline_us and quorum (0: none).
  uint32_t deadline_us = 0;
  uint16_t quorum = 0;
};

// What the switch says outside replies (docs/protocol.md section 1.4): an `EVENT aborted` line
// (its keys: job_id, reason, rank, left and for a mismatch the mismatch_* keys), or that it closed
// the control connection.
struct SwitchNotice {
  enum class Kind : uint8_t { kNone, kAborted, kClosed };
  Kind kind = Kind::kNone;
  std::map<std::string, std::string> kv;
  explicit operator bool() const { return kind != Kind::kNone; }
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

  // Sends one request line followed at once by `n` raw bytes (PARAMS, STATE_SET: the binary
  // payload of docs/protocol.md section 1.3) and returns the reply line.
  std::string request_with_payload(const std::string& line, const void* payload, size_t n, double timeout_s);

  // Sends one request line; when the reply is OK and carries `bytes_key`=B, reads the B raw bytes
  // that follow it into `*payload` (STATE_GET). Returns the reply line.
  std::string request_read_payload(const std::string& line, const std::string& bytes_key,
                                   std::vector<uint8_t>* payload, double timeout_s);

  // JOIN; blocks until every rank joined (or the switch's join timeout). Throws Error for an
  // ERR reply (TimeoutError for ERR timeout or no reply within `timeout_s`). `extra` (may be
  // empty) is appended to the request line, e.g. the optimizer keys " optimizer=adam params=..".
  JoinInfo join(const std::string& job, unsigned world, unsigned rank, const std::string& wire,
                const std::string& token, uint16_t udp_port, double timeout_s, const std::string& extra = "");

  // CHALLENGE, then AUTH as `tenant` with `secret` (docs/protocol.md section 1.5); checks the
  // switch's own proof, so that a switch that does not know the secret is not believed. Throws
  // Error saying what to check.
  void authenticate(const std::string& tenant, const std::string& secret, double timeout_s);

  // Reads, without blocking, what the switch sent between replies: the first notice not yet
  // taken, an `EVENT aborted`, or kClosed (for good) once the switch has closed the connection;
  // kNone when there is nothing. Call it between requests (EVENT lines that arrive while a reply
  // is awaited are kept for it).
  SwitchNotice poll_notice();
  // The socket, for a caller that waits on several descriptors (-1 once closed).
  int fd() const { return fd_; }

  void close();
  bool is_open() const { return fd_ >= 0; }
  uint32_t peer_ipv4_be() const { return peer_ipv4_be_; }
  // This end's address of the connection: the local address that reaches the switch (the address
  // the switch lists this worker under in peers=, docs/protocol.md §1.2).
  uint32_t local_ipv4_be() const { return local_ipv4_be_; }
  const std::string& endpoint() const { return endpoint_; }  // "host:port"

 private:
  // One request under mu_: the line, then `n` raw bytes; the reply line, then (with `bytes_key`) the
  // raw bytes it announces, into `*reply_payload` (request_read_payload).
  std::string exchange(const std::string& line, const void* payload, size_t n, const std::string* bytes_key,
                       std::vector<uint8_t>* reply_payload, double timeout_s);
  // Unlocked helpers (mu_ held by the caller).
  void send_all(const void* data, size_t n, std::chrono::steady_clock::time_point deadline,
                const std::string& what);
  std::string read_line(std::chrono::steady_clock::time_point deadline, const std::string& what,
                        double timeout_s);
  void read_exact(uint8_t* out, size_t n, std::chrono::steady_clock::time_point deadline,
                  const std::string& what, double timeout_s);

  std::mutex mu_;
  int fd_ = -1;
  uint32_t peer_ipv4_be_ = 0;
  uint32_t local_ipv4_be_ = 0;
  std::string endpoint_;
  std::string rbuf_;
  std::deque<SwitchNotice> notices_;
  bool peer_closed_ = false;
  // Takes an `EVENT ...` line into notices_; false for any other line.
  bool take_event(const std::string& line);
};

// The shortest decimal that reads back (round to nearest) as exactly `x` (finite), e.g. "0.001"
// for 1e-3f: how float hyperparameters travel in JOIN and SETLR.
std::string format_float32(float x);

// A tenant and its secret from the environment, for programs that take no arguments of ours (the
// MPI library): GRADSWITCH_TENANT, and GRADSWITCH_SECRET or the first line of the file
// GRADSWITCH_SECRET_FILE. Leaves both empty (anonymous) when none is set; false with `error` for a
// half or malformed configuration. (Python reads the same variables: gradswitch.control.credentials.)
bool credentials_from_environment(std::string* tenant, std::string* secret, std::string* error);

// Splits "host:port" (port optional: default 7700).
void split_host_port(const std::string& s, std::string* host, uint16_t* port);

}  // namespace gradswitch::worker
