// The worker's control-plane client (include/gradswitch/control.h): a TCP connection to the switch
// with deadlines, request lines out and key=value replies in, credentials from the environment.

#include "gradswitch/control.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/challenge.h"
#include "common/sha256.h"
#include "worker/control.h"
#include "worker/errors.h"

namespace gradswitch::worker {

namespace {

using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point deadline) {
  auto d = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (d < 0) return 0;
  if (d > 1000000000) return 1000000000;
  return static_cast<int>(d);
}

Clock::time_point deadline_after(double s) {
  if (s <= 0) s = 0;
  if (s > 1e7) s = 1e7;
  return Clock::now() + std::chrono::microseconds(static_cast<int64_t>(s * 1e6));
}

}  // namespace

std::string Reply::get(const std::string& key, const std::string& dflt) const {
  auto it = kv.find(key);
  return it == kv.end() ? dflt : it->second;
}

long long Reply::get_int(const std::string& key) const {
  auto it = kv.find(key);
  if (it == kv.end()) throw Error("gradswitch: switch reply lacks '" + key + "': " + line);
  try {
    size_t pos = 0;
    long long v = std::stoll(it->second, &pos, 10);
    if (pos != it->second.size()) throw std::invalid_argument("trailing");
    return v;
  } catch (const std::exception&) {
    throw Error("gradswitch: switch reply has a malformed '" + key + "': " + line);
  }
}

Reply parse_reply(const std::string& line) {
  Reply r;
  r.line = line;
  std::istringstream in(line);
  std::string word;
  in >> word;
  if (word == GS_REPLY_OK) {
    r.ok = true;
    std::string tok;
    while (in >> tok) {
      auto eq = tok.find('=');
      if (eq == std::string::npos)
        r.kv[tok] = "";
      else
        r.kv[tok.substr(0, eq)] = tok.substr(eq + 1);
    }
  } else {
    r.ok = false;
    in >> r.code;
    std::getline(in, r.message);
    size_t b = r.message.find_first_not_of(' ');
    r.message = b == std::string::npos ? "" : r.message.substr(b);
    if (word != GS_REPLY_ERR) {
      r.code = "bad_reply";
      r.message = line;
    }
  }
  return r;
}

std::string format_float32(float x) {
  char buf[64];
  for (int prec = 1; prec <= 9; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, static_cast<double>(x));
    if (std::strtof(buf, nullptr) == x) return buf;
  }
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(x));
  return buf;
}

bool credentials_from_environment(std::string* tenant, std::string* secret, std::string* error) {
  const char* t = std::getenv("GRADSWITCH_TENANT");
  const char* s = std::getenv("GRADSWITCH_SECRET");
  const char* f = std::getenv("GRADSWITCH_SECRET_FILE");
  tenant->assign(t ? t : "");
  secret->clear();
  if (s && *s) {
    secret->assign(s);
  } else if (f && *f) {
    std::ifstream in(f);
    if (!in) return *error = std::string("gradswitch: cannot read GRADSWITCH_SECRET_FILE ") + f, false;
    std::getline(in, *secret);
  }
  const auto trim = [](std::string* v) {
    const size_t b = v->find_first_not_of(" \t\r\n"), e = v->find_last_not_of(" \t\r\n");
    *v = b == std::string::npos ? std::string() : v->substr(b, e - b + 1);
  };
  trim(tenant);
  trim(secret);
  if (tenant->empty() != secret->empty())
    return *error = tenant->empty()
                        ? "gradswitch: a secret is set but GRADSWITCH_TENANT is not"
                        : "gradswitch: GRADSWITCH_TENANT is set but neither GRADSWITCH_SECRET nor "
                          "GRADSWITCH_SECRET_FILE",
           false;
  return true;
}

void split_host_port(const std::string& s, std::string* host, uint16_t* port) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos) {
    *host = s;
    *port = 7700;
    return;
  }
  *host = s.substr(0, colon);
  std::string p = s.substr(colon + 1);
  char* end = nullptr;
  long v = std::strtol(p.c_str(), &end, 10);
  if (p.empty() || *end != '\0' || v <= 0 || v > 65535)
    throw InvalidArgument("gradswitch: bad switch address '" + s + "': expected host:port");
  *port = static_cast<uint16_t>(v);
  if (host->empty()) *host = "127.0.0.1";
}

ControlClient::ControlClient(const std::string& host, uint16_t port, double connect_timeout_s) {
  endpoint_ = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int gai = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (gai != 0 || res == nullptr)
    throw Error("gradswitch: cannot resolve the switch host '" + host + "': " + ::gai_strerror(gai) +
                " (an IPv4 address or resolvable name is needed)");
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  addr.sin_port = htons(port);
  peer_ipv4_be_ = addr.sin_addr.s_addr;

  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ < 0) throw Error(std::string("gradswitch: cannot create a TCP socket: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int rc = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  int err = 0;
  if (rc != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd pfd{fd_, POLLOUT, 0};
      int pr = ::poll(&pfd, 1, static_cast<int>(connect_timeout_s * 1000));
      if (pr == 0) {
        err = ETIMEDOUT;
      } else {
        socklen_t len = sizeof err;
        ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
  }
  if (err != 0) {
    ::close(fd_);
    fd_ = -1;
    std::string why = err == ETIMEDOUT
                          ? "no answer within " + std::to_string(connect_timeout_s).substr(0, 5) + " s"
                          : std::string(std::strerror(err));
    throw Error("gradswitch: cannot reach the switch control port at " + endpoint_ + ": " + why +
                ". Is gradswitchd running there (gradswitchd --control-port " + std::to_string(port) +
                "), is the address right, and does a firewall allow TCP to it?");
  }
  sockaddr_in local{};
  socklen_t len = sizeof local;
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&local), &len) == 0 && local.sin_family == AF_INET)
    local_ipv4_be_ = local.sin_addr.s_addr;
}

ControlClient::~ControlClient() {
  close();
}

void ControlClient::close() {
  std::lock_guard<std::mutex> lk(mu_);
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void ControlClient::send_all(const void* data, size_t n, Clock::time_point deadline,
                             const std::string& what) {
  const char* p = static_cast<const char*>(data);
  size_t off = 0;
  while (off < n) {
    ssize_t w = ::send(fd_, p + off, n - off, MSG_NOSIGNAL);
    if (w > 0) {
      off += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pfd{fd_, POLLOUT, 0};
      if (::poll(&pfd, 1, ms_left(deadline)) <= 0)
        throw TimeoutError("gradswitch: sending '" + what + "' to the switch at " + endpoint_ + " timed out");
      continue;
    }
    throw Error("gradswitch: lost the control connection to the switch at " + endpoint_ + ": " +
                std::strerror(errno) + " (did gradswitchd stop?)");
  }
}

namespace {
// Receives into rbuf; throws on timeout or a closed connection.
void recv_more(int fd, std::string& rbuf, Clock::time_point deadline, const std::string& endpoint,
               const std::string& what, double timeout_s) {
  for (;;) {
    pollfd pfd{fd, POLLIN, 0};
    int pr = ::poll(&pfd, 1, ms_left(deadline));
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0)
      throw TimeoutError("gradswitch: no reply from the switch at " + endpoint + " to '" + what +
                         "' within " + std::to_string(timeout_s).substr(0, 6) + " s");
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) {
      rbuf.append(buf, static_cast<size_t>(n));
      return;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    throw Error("gradswitch: the switch at " + endpoint + " closed the control connection" +
                (n < 0 ? std::string(": ") + std::strerror(errno) : std::string()) +
                " (did gradswitchd stop?)");
  }
}
}  // namespace

std::string ControlClient::read_line(Clock::time_point deadline, const std::string& what, double timeout_s) {
  for (;;) {
    auto nl = rbuf_.find('\n');
    if (nl != std::string::npos) {
      std::string reply = rbuf_.substr(0, nl);
      rbuf_.erase(0, nl + 1);
      if (!reply.empty() && reply.back() == '\r') reply.pop_back();
      if (take_event(reply)) continue;  // not the reply: kept for poll_notice()
      return reply;
    }
    recv_more(fd_, rbuf_, deadline, endpoint_, what, timeout_s);
  }
}

bool ControlClient::take_event(const std::string& line) {
  if (line.rfind(GS_EVENT " ", 0) != 0) return false;
  SwitchNotice n;
  std::istringstream in(line.substr(6));
  std::string kind, tok;
  in >> kind;
  while (in >> tok) {
    auto eq = tok.find('=');
    if (eq != std::string::npos) n.kv[tok.substr(0, eq)] = tok.substr(eq + 1);
  }
  if (kind != GS_EVENT_ABORTED) return true;  // a kind this client does not know: ignored
  n.kind = SwitchNotice::Kind::kAborted;
  notices_.push_back(std::move(n));
  return true;
}

SwitchNotice ControlClient::poll_notice() {
  std::lock_guard<std::mutex> lk(mu_);
  while (fd_ >= 0 && !peer_closed_) {
    char buf[4096];
    ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      rbuf_.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    peer_closed_ = true;  // EOF or reset
  }
  for (auto nl = rbuf_.find('\n'); nl != std::string::npos; nl = rbuf_.find('\n')) {
    std::string line = rbuf_.substr(0, nl);
    rbuf_.erase(0, nl + 1);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    take_event(line);  // a stray non-event line (no request is waiting for it) is dropped
  }
  if (!notices_.empty()) {
    SwitchNotice n = std::move(notices_.front());
    notices_.pop_front();
    return n;
  }
  SwitchNotice n;
  if (peer_closed_) n.kind = SwitchNotice::Kind::kClosed;
  return n;
}

void ControlClient::read_exact(uint8_t* out, size_t n, Clock::time_point deadline, const std::string& what,
                               double timeout_s) {
  size_t got = 0;
  while (got < n) {
    if (!rbuf_.empty()) {
      size_t k = std::min(n - got, rbuf_.size());
      std::memcpy(out + got, rbuf_.data(), k);
      rbuf_.erase(0, k);
      got += k;
      continue;
    }
    // Large payloads: receive straight into the output once the buffer is drained.
    pollfd pfd{fd_, POLLIN, 0};
    int pr = ::poll(&pfd, 1, ms_left(deadline));
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0)
      throw TimeoutError("gradswitch: the payload of '" + what + "' from the switch at " + endpoint_ +
                         " did not arrive within " + std::to_string(timeout_s).substr(0, 6) + " s (" +
                         std::to_string(got) + " of " + std::to_string(n) + " bytes)");
    ssize_t r = ::recv(fd_, out + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    throw Error("gradswitch: the switch at " + endpoint_ +
                " closed the control connection in the middle of '" + what + "' (" + std::to_string(got) +
                " of " + std::to_string(n) + " bytes)");
  }
}

std::string ControlClient::request(const std::string& line, double timeout_s) {
  return request_with_payload(line, nullptr, 0, timeout_s);
}

std::string ControlClient::request_with_payload(const std::string& line, const void* payload, size_t n,
                                                double timeout_s) {
  return exchange(line, payload, n, nullptr, nullptr, timeout_s);
}

std::string ControlClient::request_read_payload(const std::string& line, const std::string& bytes_key,
                                                std::vector<uint8_t>* payload, double timeout_s) {
  return exchange(line, nullptr, 0, &bytes_key, payload, timeout_s);
}

std::string ControlClient::exchange(const std::string& line, const void* payload, size_t n,
                                    const std::string* bytes_key, std::vector<uint8_t>* reply_payload,
                                    double timeout_s) {
  std::lock_guard<std::mutex> lk(mu_);
  if (fd_ < 0) throw Error("gradswitch: the control connection to " + endpoint_ + " is closed");
  auto deadline = deadline_after(timeout_s);
  std::string what = line.substr(0, line.find(' '));
  std::string out = line + "\n";
  send_all(out.data(), out.size(), deadline, what);
  if (n > 0) send_all(payload, n, deadline, what);
  std::string reply = read_line(deadline, what, timeout_s);
  if (!bytes_key) return reply;
  reply_payload->clear();
  Reply r = parse_reply(reply);
  if (!r.ok || r.kv.find(*bytes_key) == r.kv.end()) return reply;
  long long b = r.get_int(*bytes_key);
  if (b < 0) throw Error("gradswitch: switch reply has a negative '" + *bytes_key + "': " + reply);
  reply_payload->resize(static_cast<size_t>(b));
  read_exact(reply_payload->data(), reply_payload->size(), deadline, what, timeout_s);
  return reply;
}

void ControlClient::authenticate(const std::string& tenant, const std::string& secret, double timeout_s) {
  const std::string where = "the switch at " + endpoint_;
  Reply c = parse_reply(request(GS_VERB_CHALLENGE, timeout_s));
  if (!c.ok)
    throw Error("gradswitch: " + where + " does not authenticate (CHALLENGE: " + c.code + " " + c.message +
                "); a tenant and secret were given: is it started with --auth-file?");
  const std::string nonce = c.get(GS_KEY_NONCE);
  if (!is_nonce(nonce)) throw Error("gradswitch: " + where + " sent a malformed CHALLENGE reply: " + c.line);
  const std::string cnonce = random_hex(32);
  Reply a = parse_reply(request(std::string(GS_VERB_AUTH " " GS_KEY_TENANT "=") + tenant +
                                    " " GS_KEY_CNONCE "=" + cnonce + " " GS_KEY_PROOF "=" +
                                    auth_proof(GS_AUTH_CLIENT_LABEL, secret, tenant, nonce, cnonce),
                                timeout_s));
  if (!a.ok)
    throw Error("gradswitch: " + where + " refused tenant '" + tenant + "': " + a.code + " " + a.message +
                ". Check the tenant name and its secret (GRADSWITCH_TENANT, GRADSWITCH_SECRET or "
                "GRADSWITCH_SECRET_FILE) against the switch's auth file.");
  if (!constant_time_equal(a.get(GS_KEY_PROOF),
                           auth_proof(GS_AUTH_SWITCH_LABEL, secret, tenant, nonce, cnonce)))
    throw Error("gradswitch: " + where + " accepted tenant '" + tenant +
                "' but could not prove that it knows the secret: it is not the switch you configured");
}

JoinInfo ControlClient::join(const std::string& job, unsigned world, unsigned rank, const std::string& wire,
                             const std::string& token, uint16_t udp_port, double timeout_s,
                             const std::string& extra) {
  std::string line = GS_VERB_JOIN " " GS_KEY_JOB "=" + job + " " GS_KEY_WORLD "=" + std::to_string(world) +
                     " " GS_KEY_RANK "=" + std::to_string(rank) + " " GS_KEY_WIRE "=" + wire +
                     " " GS_KEY_TOKEN "=" + token + " " GS_KEY_PORT "=" + std::to_string(udp_port) + extra;
  std::string reply_line;
  try {
    reply_line = request(line, timeout_s);
  } catch (const TimeoutError&) {
    throw TimeoutError("gradswitch: JOIN of job '" + job + "' as rank " + std::to_string(rank) + " of " +
                       std::to_string(world) + ": not every rank joined within " +
                       std::to_string(timeout_s).substr(0, 6) +
                       " s. Are all ranks started with the same job name, world size and switch address (" +
                       endpoint_ + ")?");
  }
  Reply r = parse_reply(reply_line);
  if (!r.ok) {
    std::string what = "gradswitch: the switch at " + endpoint_ + " refused JOIN of job '" + job +
                       "' as rank " + std::to_string(rank) + " of " + std::to_string(world) + " (wire " +
                       wire + "): " + r.code + ": " + r.message;
    if (r.code == "timeout")
      throw TimeoutError(what +
                         ". Not every rank joined in time: are all ranks started with the same job name "
                         "and world size?");
    if (r.code == "conflict")
      throw Error(what +
                  (extra.find("optimizer=") != std::string::npos
                       ? ". Another job of that name exists with other parameters (every rank must give the "
                         "same optimizer, hyperparameters and number of parameters), or the rank is taken."
                       : ". Another job of that name exists with other parameters, or the rank is taken."));
    throw Error(what);
  }
  JoinInfo ji;
  ji.job_id = static_cast<uint32_t>(r.get_int(GS_KEY_JOB_ID));
  ji.key = static_cast<uint32_t>(r.get_int(GS_KEY_KEY));
  ji.slots = static_cast<uint16_t>(r.get_int(GS_KEY_SLOTS));
  ji.payload_bytes = static_cast<uint32_t>(r.get_int(GS_KEY_PAYLOAD));
  ji.data_port = static_cast<uint16_t>(r.get_int(GS_KEY_DATA_PORT));
  ji.threads = static_cast<uint16_t>(r.get_int(GS_KEY_THREADS));
  ji.peers = r.get(GS_KEY_PEERS);
  if (ji.slots == 0 || ji.threads == 0 || ji.payload_bytes < 4)
    throw Error("gradswitch: the switch sent an unusable JOIN reply: " + reply_line);
  // Bounded-time rounds (docs/protocol.md §3.1): asked for, the reply must confirm them.
  if (extra.find(" " GS_KEY_DEADLINE_US "=") != std::string::npos) {
    if (!r.kv.count(GS_KEY_DEADLINE_US))
      throw Error("gradswitch: the switch at " + endpoint_ +
                  " answered a JOIN with deadline_us= without it (" + reply_line +
                  "): does this gradswitchd support bounded-time rounds?");
    ji.deadline_us = static_cast<uint32_t>(r.get_int(GS_KEY_DEADLINE_US));
    ji.quorum = static_cast<uint16_t>(r.get_int(GS_KEY_QUORUM));
  }
  ji.optimizer = r.get(GS_KEY_OPTIMIZER);
  if (!ji.optimizer.empty()) {
    ji.params = static_cast<uint64_t>(r.get_int(GS_KEY_PARAMS));
    ji.chunk = static_cast<uint32_t>(r.get_int(GS_KEY_CHUNK));
    ji.state_bytes = static_cast<uint64_t>(r.get_int(GS_KEY_STATE_BYTES));
  } else if (extra.find("optimizer=") != std::string::npos) {
    throw Error("gradswitch: the switch at " + endpoint_ +
                " answered an optimizer JOIN without 'optimizer=' (" + reply_line +
                "): does this gradswitchd support optimization in the switch?");
  }
  return ji;
}

}  // namespace gradswitch::worker
