#include "switch/control/control_plane.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <deque>
#include <optional>
#include <random>

namespace gradswitch {

using namespace control;

namespace {
constexpr size_t kMaxConnections = 4096;
constexpr size_t kMaxPausedInput = 64 * 1024;  // buffered input of a connection waiting for its JOIN reply
constexpr size_t kMaxOutput = 1 << 20;         // a client that does not read its replies is closed
constexpr uint64_t kTimerPeriodNs = 100'000'000;
// Per connection and poll round: bytes read (binary uploads) and written (STATE_GET), so that one
// large transfer cannot stall the other connections.
constexpr size_t kReadBudget = 1 << 20;
constexpr size_t kWriteBudget = 4 << 20;
// The state blob is the switch's memory as it is: little-endian floats and counters.
static_assert(std::endian::native == std::endian::little,
              "the STATE_GET/STATE_SET layout assumes little-endian");

const char* abort_reason_name(uint8_t r) {
  switch (r) {
    case 0:
      return "none";
    case GS_ABORT_RANK_LEFT:
      return "rank_left";
    case GS_ABORT_IDLE:
      return "idle";
    case GS_ABORT_SHUTDOWN:
      return "shutdown";
    case GS_ABORT_OPERATOR:
      return "operator";
    case GS_ABORT_MISMATCH:
      return "mismatch";
    default:
      return "unknown";
  }
}

// ` mismatch_seq=.. mismatch_offset=.. mismatch_ranks=a,b mismatch_counts=.. mismatch_last=..
// mismatch_types=.. mismatch_scales=..`: the two contributions that could not be summed (held, arriving).
std::string mismatch_keys(const Mismatch& m) {
  auto pair = [](auto a, auto b) { return std::to_string(a) + "," + std::to_string(b); };
  return " mismatch_seq=" + std::to_string(m.seq) + " mismatch_offset=" + std::to_string(m.offset) +
         " mismatch_ranks=" + pair(m.held.rank, m.arriving.rank) +
         " mismatch_counts=" + pair(m.held.count, m.arriving.count) +
         " mismatch_last=" + pair(int(m.held.last), int(m.arriving.last)) +
         " mismatch_types=" + gs_elem_name(m.held.elem_type) + "," + gs_elem_name(m.arriving.elem_type) +
         " mismatch_scales=" + pair(int(m.held.scale_exp), int(m.arriving.scale_exp));
}

std::string ranks_text(uint64_t mask) {
  std::string out;
  for (unsigned b = 0; b < 64; ++b)
    if (mask >> b & 1) out += (out.empty() ? "" : ",") + std::to_string(b);
  return out;
}

std::string counters_text(const CounterValues& v) {
  std::string s = v.format("");
  if (s.find("drops=") == std::string::npos) s = "drops=" + std::to_string(v.drops_total()) + " " + s;
  return s;
}
}  // namespace

struct ControlPlane::Conn {
  enum class Role { kNone, kPending, kJoined, kLeft };
  uint64_t id = 0;
  int fd = -1;
  uint32_t peer_ipv4_be = 0;
  std::string peer;  // "a.b.c.d:port", for messages
  LineFramer in;
  std::string out;
  bool eof = false;      // the peer closed its side
  bool closing = false;  // input is discarded; once the error is sent: FIN, drain, close
  bool wr_shut = false;
  uint64_t drain_deadline_ns = 0;
  bool dead = false;  // close at the end of this step
  Role role = Role::kNone;
  std::string job_name;  // kPending, kJoined, kLeft
  uint32_t job_id = 0;   // kJoined, kLeft
  uint16_t rank = 0;

  // The payload of PARAMS / STATE_SET being received (docs/protocol.md §1.3). Until it is complete,
  // input bytes are payload, not request lines.
  struct BinaryIn {
    enum Kind { kParams, kState, kDiscard } kind = kDiscard;
    uint64_t total = 0, done = 0;
    uint32_t job_id = 0;
    uint64_t param_offset = 0;  // kParams: first element written
    StateHeader expect;         // kState: what the header must say
    uint8_t header[kStateHeaderBytes] = {};
    Error error;     // kDiscard: the reply once the payload is consumed
    std::string ok;  // the reply on success
  };
  std::optional<BinaryIn> bin;
  // Raw bytes sent after `out` (STATE_GET): borrowed from the job's optimizer, which lives as long
  // as this connection is joined (no request is processed until the stream is sent), or owned.
  struct Segment {
    const uint8_t* borrowed = nullptr;
    std::string owned;
    size_t len = 0, sent = 0;
    const uint8_t* data() const {
      return borrowed ? borrowed : reinterpret_cast<const uint8_t*>(owned.data());
    }
  };
  std::deque<Segment> stream;
  std::string deferred_events;  // EVENT lines that wait for `stream` to end (never inside a payload)
  bool input_paused() const {
    return (role == Role::kPending || !stream.empty()) && in.buffered() > kMaxPausedInput;
  }
};

struct ControlPlane::PendingJob {
  std::string name, token;
  uint16_t world = 0;
  uint8_t wire = 0;
  uint64_t deadline_ns = 0;
  size_t memory = 0;
  std::shared_ptr<const OptimizerSpec> optimizer;  // optimizer jobs only
  std::vector<uint64_t> conn;                      // per rank: connection id, 0 = not joined yet
  std::vector<uint16_t> port;
  unsigned joined = 0;
};

struct ControlPlane::LiveJob {
  uint32_t id = 0;
  JobSpec spec;
  std::string token;
  size_t memory = 0;
  std::vector<uint64_t> conn;  // per rank: connection id, 0 = gone (left or closed)
  unsigned present = 0;
  bool aborted = false;
  std::string abort_why;
  uint64_t start_ns = 0, last_request_ns = 0;
};

ControlPlane::ControlPlane(Engine& engine, const SwitchConfig& config) : engine_(engine), config_(config) {}

ControlPlane::~ControlPlane() {
  close_all();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

bool ControlPlane::listen(std::string* error) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = std::string("control plane: socket(): ") + std::strerror(errno);
    return false;
  }
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(config_.control_port);
  inet_pton(AF_INET, config_.control_host.c_str(), &a.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 128) != 0) {
    *error = "control plane: cannot listen on TCP " + describe() + ": " + std::strerror(errno) +
             " (another gradswitchd running? choose another --control-port)";
    ::close(fd);
    return false;
  }
  listen_fd_ = fd;
  return true;
}

std::string ControlPlane::describe() const {
  return config_.control_host + ":" + std::to_string(config_.control_port);
}

void ControlPlane::add_job_listener(std::function<void(const JobEvent&)> l) {
  listeners_.push_back(std::move(l));
}
void ControlPlane::add_stats_source(std::function<std::string()> s) {
  stats_sources_.push_back(std::move(s));
}

void ControlPlane::run(const std::atomic<bool>& stop) {
  while (!stop.load(std::memory_order_relaxed)) step(100, monotonic_ns());
  shutdown_jobs(monotonic_ns());
}

void ControlPlane::step(int timeout_ms, uint64_t now_ns) {
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
  if (n > 0) {
    for (size_t i = 1; i < fds.size(); ++i) {
      Conn& c = *who[i];
      if (fds[i].revents & POLLOUT) {
        const bool streaming = !c.stream.empty();
        flush(c);
        // Requests that arrived while a STATE_GET stream was going out.
        if (streaming && c.stream.empty() && c.in.buffered()) process_lines(c, now_ns);
      }
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR | POLLRDHUP)) read_input(c, now_ns);
    }
    if (fds[0].revents & POLLIN) accept_all(now_ns);
  }
  check_timers(now_ns);
  sweep(now_ns);
}

void ControlPlane::accept_all(uint64_t now_ns) {
  for (;;) {
    sockaddr_in a{};
    socklen_t alen = sizeof a;
    int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&a), &alen, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        GS_LOG_WARN("control plane: accept(): %s", std::strerror(errno));
      return;
    }
    if (conns_.size() >= kMaxConnections) {
      static const char msg[] = "ERR no_resources too many control connections\n";
      (void)!::send(fd, msg, sizeof msg - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      ::close(fd);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_unique<Conn>();
    c->id = next_conn_id_++;
    c->fd = fd;
    c->peer_ipv4_be = a.sin_addr.s_addr;
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
    c->peer = std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
    GS_LOG_DEBUG("control: connection from %s", c->peer.c_str());
    conns_.emplace(c->id, std::move(c));
  }
}

void ControlPlane::read_input(Conn& c, uint64_t now_ns) {
  if (c.dead) return;
  char buf[65536];
  size_t budget = kReadBudget;
  while (!c.eof && budget > 0) {  // the rest of a large upload waits for the next poll round
    ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n > 0) budget -= std::min(budget, static_cast<size_t>(n));
    if (n > 0 && c.closing) continue;  // draining before the close
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
      process_lines(c, now_ns);
      if (c.input_paused()) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    c.eof = true;  // closed or reset
  }
  // A peer that closed its side is gone, but its complete lines (e.g. a final LEAVE) count.
  if (c.eof) {
    process_lines(c, now_ns);
    c.dead = true;
  }
}

void ControlPlane::process_lines(Conn& c, uint64_t now_ns) {
  std::string line;
  while (!c.dead && !c.closing && c.role != Conn::Role::kPending && c.stream.empty()) {
    if (c.bin) {
      feed_binary(c);
      if (c.bin) return;  // waits for more payload
      continue;
    }
    auto next = c.in.next(&line);
    if (next == LineFramer::Next::kNone) return;
    if (next == LineFramer::Next::kTooLong)
      return close_with_error(c, kErrTooLong,
                              "line over " + std::to_string(kMaxLineBytes) +
                                  " bytes (terminator included); closing the connection");
    handle_line(c, line, now_ns);
  }
}

void ControlPlane::close_with_error(Conn& c, const char* code, const std::string& message) {
  c.closing = true;
  c.in = LineFramer();
  c.bin.reset();
  reply_error(c, code, message);
}

void ControlPlane::handle_line(Conn& c, const std::string& line, uint64_t now_ns) {
  Error err;
  auto req = parse_request(line, &err);
  if (!req) {
    // A binary request whose line is malformed: the length of what follows is unknown.
    std::string_view verb(line);
    verb.remove_prefix(std::min(verb.find_first_not_of(' '), verb.size()));
    verb = verb.substr(0, verb.find(' '));
    if (verb == "PARAMS" || verb == "STATE_SET")
      return close_with_error(c, err.code,
                              err.message +
                                  "; the length of the payload that follows is unknown: "
                                  "closing the connection");
    return reply_error(c, err.code, err.message);
  }
  if (c.role == Conn::Role::kJoined) {
    auto it = live_.find(c.job_id);
    if (it != live_.end()) it->second->last_request_ns = now_ns;
  }
  const std::string& v = req->verb;
  if (v == "JOIN") return handle_join(c, *req, now_ns);
  if (v == "LEAVE") return handle_leave(c, *req, now_ns);
  if (v == "STATUS") return handle_status(c, *req, now_ns);
  if (v == "STATS") return handle_stats(c, *req);
  if (v == "JOBS") return handle_jobs(c, *req);
  if (v == "PING") {
    if (!parse_no_args(*req, &err)) return reply_error(c, err.code, err.message);
    return reply(c, "OK\n");
  }
  if (v == "PARAMS" || v == "STATE_SET") return handle_upload(c, *req);
  if (v == "SETLR") return handle_setlr(c, *req);
  if (v == "STATE_GET") return handle_state_get(c, *req);
  reply_error(c, kErrBadRequest,
              "unknown verb '" + v +
                  "' (expected JOIN, LEAVE, STATUS, STATS, JOBS, PING, PARAMS, SETLR, STATE_GET or "
                  "STATE_SET)");
}

// ---- Optimizer jobs: PARAMS, SETLR, STATE_GET, STATE_SET (docs/protocol.md §1.3) ----

Optimizer* ControlPlane::joined_optimizer(Conn& c, const std::string& verb, Error* err) {
  if (c.role != Conn::Role::kJoined) {
    *err = {kErrState,
            verb + " needs a connection that has joined an optimizer job (JOIN ... optimizer=...)"};
    return nullptr;
  }
  Optimizer* opt = engine_.job_optimizer(c.job_id);
  if (!opt) {
    *err = {kErrState,
            "job '" + c.job_name + "' does not optimize in the switch (it was joined without optimizer=)"};
    return nullptr;
  }
  return opt;
}

void ControlPlane::handle_upload(Conn& c, const Request& r) {
  auto length = binary_length(r);
  if (!length)
    return close_with_error(
        c, kErrBadRequest,
        r.verb + (r.verb == "PARAMS" ? " needs count=<0..4294967295>" : " needs bytes=<n>") +
            ": the length of the payload that follows is unknown; closing the connection");
  Conn::BinaryIn b;
  b.total = *length;
  b.job_id = c.job_id;
  Error err;
  Optimizer* opt = joined_optimizer(c, r.verb, &err);
  if (opt && c.rank != 0) {
    err = {kErrState, r.verb + " is rank 0's (this connection is rank " + std::to_string(c.rank) + ")"};
    opt = nullptr;
  }
  if (opt && r.verb == "PARAMS") {
    auto p = parse_params(r, &err);
    if (!p) {
      opt = nullptr;
    } else if (p->offset + p->count > opt->spec().params) {
      err = {kErrBadRequest, "offset=" + std::to_string(p->offset) + " count=" + std::to_string(p->count) +
                                 " is beyond the job's " + std::to_string(opt->spec().params) +
                                 " parameters"};
      opt = nullptr;
    } else {
      b.kind = Conn::BinaryIn::kParams;
      b.param_offset = p->offset;
      b.ok = "OK\n";
    }
  } else if (opt) {
    auto bytes = parse_state_set(r, &err);
    const uint32_t chunk = config_.payload_bytes() / 4;
    b.expect = state_header_for(opt->spec(), chunk, opt->lr());
    if (!bytes) {
      opt = nullptr;
    } else if (*bytes != state_blob_bytes(b.expect)) {
      err = {kErrConflict, "STATE_SET bytes=" + std::to_string(*bytes) +
                               " does not fit this job: its state is " +
                               std::to_string(state_blob_bytes(b.expect)) + " bytes"};
      opt = nullptr;
    } else {
      b.kind = Conn::BinaryIn::kState;
      b.ok = "OK\n";
    }
  }
  if (!opt) {
    b.kind = Conn::BinaryIn::kDiscard;
    b.error = err;
  }
  c.bin = std::move(b);
  // process_lines() feeds it from the bytes already buffered and those still to come.
}

void ControlPlane::feed_binary(Conn& c) {
  Conn::BinaryIn& b = *c.bin;
  while (b.done < b.total) {
    const size_t avail = c.in.buffered();
    if (avail == 0) return;
    size_t want = static_cast<size_t>(std::min<uint64_t>(avail, b.total - b.done));
    Optimizer* opt = b.kind == Conn::BinaryIn::kDiscard ? nullptr : engine_.job_optimizer(b.job_id);
    if (!opt && b.kind != Conn::BinaryIn::kDiscard) {  // cannot happen while joined; be safe
      b.kind = Conn::BinaryIn::kDiscard;
      b.error = {kErrState, "the job ended during the upload"};
    }
    if (b.kind == Conn::BinaryIn::kDiscard) {
      c.in.take(nullptr, want);
    } else if (b.kind == Conn::BinaryIn::kParams) {
      c.in.take(reinterpret_cast<char*>(opt->params() + b.param_offset) + b.done, want);
    } else if (b.done < kStateHeaderBytes) {
      want = std::min<size_t>(want, kStateHeaderBytes - b.done);
      c.in.take(reinterpret_cast<char*>(b.header) + b.done, want);
      if (b.done + want == kStateHeaderBytes) {
        Error err;
        if (!decode_state_header(b.header, b.expect, &err)) {
          b.kind = Conn::BinaryIn::kDiscard;
          b.error = err;
        }
      }
    } else {
      const uint64_t array_bytes = b.expect.params * 4;
      const uint64_t pos = b.done - kStateHeaderBytes;
      const uint64_t a = pos / array_bytes;
      char* dst;
      uint64_t room;
      if (a < b.expect.arrays) {
        float* arr = a == 0 ? opt->params() : opt->state(static_cast<unsigned>(a - 1));
        dst = reinterpret_cast<char*>(arr) + (pos - a * array_bytes);
        room = array_bytes - (pos - a * array_bytes);
      } else {
        const uint64_t off = pos - b.expect.arrays * array_bytes;
        dst = reinterpret_cast<char*>(opt->steps()) + off;
        room = uint64_t{b.expect.chunks} * 4 - off;
      }
      want = static_cast<size_t>(std::min<uint64_t>(want, room));
      c.in.take(dst, want);
    }
    b.done += want;
  }
  // Complete.
  if (b.kind == Conn::BinaryIn::kState) {
    float lr;
    std::memcpy(&lr, b.header + 28, 4);
    if (Optimizer* opt = engine_.job_optimizer(b.job_id)) opt->set_lr(lr);
  }
  // The data threads read what was written only after this reply reached rank 0 (a step needs its
  // next DATA packet); the fence orders the writes before the reply's send().
  std::atomic_thread_fence(std::memory_order_seq_cst);
  Conn::BinaryIn done = std::move(b);
  c.bin.reset();
  if (done.kind == Conn::BinaryIn::kDiscard)
    reply_error(c, done.error.code, done.error.message);
  else
    reply(c, done.ok);
}

void ControlPlane::handle_setlr(Conn& c, const Request& r) {
  Error err;
  auto lr = parse_setlr(r, &err);
  if (!lr) return reply_error(c, err.code, err.message);
  Optimizer* opt = joined_optimizer(c, "SETLR", &err);
  if (!opt) return reply_error(c, err.code, err.message);
  opt->set_lr(*lr);
  reply(c, "OK lr=" + format_float(*lr) + "\n");
}

void ControlPlane::handle_state_get(Conn& c, const Request& r) {
  Error err;
  if (!parse_no_args(r, &err)) return reply_error(c, err.code, err.message);
  Optimizer* opt = joined_optimizer(c, "STATE_GET", &err);
  if (!opt) return reply_error(c, err.code, err.message);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const StateHeader h = state_header_for(opt->spec(), config_.payload_bytes() / 4, opt->lr());
  const uint64_t bytes = state_blob_bytes(h);
  std::string line = "OK bytes=" + std::to_string(bytes) + " algo=" + optimizer_algo_name(opt->spec().algo) +
                     " params=" + std::to_string(h.params) + " arrays=" + std::to_string(h.arrays) +
                     " chunk=" + std::to_string(h.chunk) + " chunks=" + std::to_string(h.chunks) +
                     " lr=" + format_float(h.lr) + "\n";
  uint8_t header[kStateHeaderBytes];
  encode_state_header(h, header);
  line.append(reinterpret_cast<const char*>(header), sizeof header);
  for (unsigned a = 0; a < h.arrays; ++a) {
    Conn::Segment s;
    s.borrowed = reinterpret_cast<const uint8_t*>(a == 0 ? opt->params() : opt->state(a - 1));
    s.len = h.params * 4;
    c.stream.push_back(std::move(s));
  }
  Conn::Segment steps;
  steps.owned.assign(reinterpret_cast<const char*>(opt->steps()), size_t{h.chunks} * 4);
  steps.len = steps.owned.size();
  c.stream.push_back(std::move(steps));
  reply(c, line);  // sends the line, the header and then the stream as the peer reads
}

size_t ControlPlane::reserved_memory() const {
  size_t m = 0;
  for (auto& [n, p] : pending_) m += p->memory;
  for (auto& [id, j] : live_) m += j->memory;
  return m;
}

void ControlPlane::handle_join(Conn& c, const Request& r, uint64_t now_ns) {
  using Role = Conn::Role;
  if (c.role == Role::kJoined)
    return reply_error(c, kErrState,
                       "this connection already joined job '" + c.job_name + "' as rank " +
                           std::to_string(c.rank) + " (one JOIN per connection)");
  if (c.role == Role::kLeft)
    return reply_error(
        c, kErrState,
        "this connection already left job '" + c.job_name + "' (one JOIN per connection; open a new one)");
  if (shutting_down_) return reply_error(c, kErrState, "the switch is shutting down");
  Error err;
  auto j = parse_join(r, &err);
  if (!j) return reply_error(c, err.code, err.message);

  for (auto& [id, live] : live_)
    if (live->spec.name == j->job && !live->aborted)
      return reply_error(
          c, kErrConflict,
          "job '" + j->job + "' is already running with all " + std::to_string(live->spec.world) + " ranks");

  auto it = pending_.find(j->job);
  if (it != pending_.end()) {
    PendingJob& p = *it->second;
    if (p.token != j->token) {
      // Not provably a member of this job: refuse it alone, the waiting ranks are unaffected.
      GS_LOG_WARN("job '%s': refused JOIN of rank %u from %s: different token", j->job.c_str(), j->rank,
                  c.peer.c_str());
      return reply_error(c, kErrConflict, "job '" + j->job + "' exists with a different token");
    }
    std::string differs = join_conflict(p, *j);
    if (!differs.empty()) {
      // A member of the job disagrees with the ranks already waiting: the job cannot start, so every
      // waiting rank learns it now rather than at the join timeout.
      const std::string why = "job '" + j->job + "': rank " + std::to_string(j->rank) + " (" + c.peer +
                              ") joined with " + differs + "; the job is cancelled for every rank";
      GS_LOG_WARN("refused JOIN: %s", why.c_str());
      fail_pending(p, {kErrConflict, why});
      return reply_error(c, kErrConflict, why);
    }
  } else {
    JobSpec spec;
    spec.world = j->world;
    spec.wire = j->wire;
    spec.slots = static_cast<uint16_t>(config_.slots);
    spec.payload_bytes = config_.payload_bytes();
    const size_t slot_bytes = Engine::job_memory_bytes(spec);
    const size_t opt_bytes = j->optimizer ? optimizer_memory_bytes(*j->optimizer, spec.payload_bytes / 4) : 0;
    const size_t need = slot_bytes + opt_bytes;
    if (live_.size() + pending_.size() >= config_.max_jobs)
      return reply_error(
          c, kErrNoResources,
          "job table full: " + std::to_string(config_.max_jobs) + " jobs running or joining (--max-jobs)");
    if (reserved_memory() + need > config_.max_memory) {
      std::string what = j->optimizer
                             ? "memory: job needs " + std::to_string(need) + " bytes (slots " +
                                   std::to_string(slot_bytes) + " + optimizer " + std::to_string(opt_bytes) +
                                   " for " + std::to_string(j->optimizer->params) + " parameters, " +
                                   optimizer_algo_name(j->optimizer->algo) + ")"
                             : "slot memory: job needs " + std::to_string(need) + " bytes";
      return reply_error(
          c, kErrNoResources,
          "not enough " + what + ", " +
              std::to_string(config_.max_memory - std::min<size_t>(reserved_memory(), config_.max_memory)) +
              " of " + std::to_string(config_.max_memory) + " left (--max-memory)");
    }
    auto p = std::make_unique<PendingJob>();
    p->name = j->job;
    p->token = j->token;
    p->world = j->world;
    p->wire = j->wire;
    p->memory = need;
    if (j->optimizer) p->optimizer = std::make_shared<const OptimizerSpec>(*j->optimizer);
    p->deadline_ns = now_ns + uint64_t(config_.join_timeout_s) * 1'000'000'000ull;
    p->conn.assign(j->world, 0);
    p->port.assign(j->world, 0);
    it = pending_.emplace(j->job, std::move(p)).first;
  }
  PendingJob& p = *it->second;
  p.conn[j->rank] = c.id;
  p.port[j->rank] = j->port;
  ++p.joined;
  c.role = Role::kPending;
  c.job_name = j->job;
  c.rank = j->rank;
  GS_LOG_DEBUG("job '%s': rank %u joined from %s (%u of %u)", p.name.c_str(), j->rank, c.peer.c_str(),
               p.joined, p.world);
  if (p.joined == p.world) start_job(p, now_ns);
}

std::string ControlPlane::join_conflict(const PendingJob& p, const JoinRequest& j) const {
  if (p.world != j.world)
    return "world=" + std::to_string(j.world) + " but the job has world=" + std::to_string(p.world);
  if (p.wire != j.wire)
    return std::string("wire=") + gs_elem_name(j.wire) + " but the job has wire=" + gs_elem_name(p.wire);
  if (bool(p.optimizer) != j.optimizer.has_value() ||
      (p.optimizer && !same_optimizer(*p.optimizer, *j.optimizer)))
    return (j.optimizer ? describe_optimizer(*j.optimizer) : std::string("no optimizer")) +
           " but the job has " +
           (p.optimizer ? describe_optimizer(*p.optimizer) : std::string("no optimizer")) +
           " (every rank must give the same optimizer keys)";
  if (p.conn[j.rank] != 0) {
    auto other = conns_.find(p.conn[j.rank]);
    return "rank " + std::to_string(j.rank) + ", which already joined" +
           (other != conns_.end() ? " from " + other->second->peer : std::string());
  }
  return {};
}

void ControlPlane::start_job(PendingJob& p, uint64_t now_ns) {
  JobSpec spec;
  spec.name = p.name;
  spec.world = p.world;
  spec.wire = p.wire;
  spec.slots = static_cast<uint16_t>(config_.slots);
  spec.payload_bytes = config_.payload_bytes();
  spec.optimizer = p.optimizer;
  std::random_device rd;
  do spec.key = rd();
  while (spec.key == 0);
  for (uint16_t r = 0; r < p.world; ++r)
    spec.endpoints.push_back(Endpoint{conns_.at(p.conn[r])->peer_ipv4_be, htons(p.port[r])});

  std::string error;
  uint32_t id = engine_.create_job(spec, &error);
  if (id == 0) return fail_pending(p, {kErrNoResources, "cannot create job '" + p.name + "': " + error});

  auto live = std::make_unique<LiveJob>();
  live->id = id;
  live->spec = spec;
  live->token = p.token;
  live->memory = p.memory;
  live->conn = p.conn;
  live->present = p.world;
  live->start_ns = live->last_request_ns = now_ns;
  std::string ok = "OK job_id=" + std::to_string(id) + " key=" + std::to_string(spec.key) +
                   " slots=" + std::to_string(spec.slots) + " payload=" + std::to_string(spec.payload_bytes) +
                   " data_port=" + std::to_string(config_.data_port) +
                   " threads=" + std::to_string(config_.threads);
  // Every rank's UDP address, so the workers can run the ring among themselves (docs/protocol.md
  // section 7): on request (algorithm=ring) and as the fallback when this switch goes away.
  ok += " peers=";
  for (uint16_t r = 0; r < spec.world; ++r) {
    char ip[INET_ADDRSTRLEN] = "";
    in_addr a{};
    a.s_addr = spec.endpoints[r].ipv4_be;
    ::inet_ntop(AF_INET, &a, ip, sizeof ip);
    ok += (r ? "," : "") + std::string(ip) + ":" + std::to_string(ntohs(spec.endpoints[r].port_be));
  }
  if (spec.optimizer) {
    const StateHeader h = state_header_for(*spec.optimizer, spec.payload_bytes / 4, spec.optimizer->lr);
    ok += std::string(" optimizer=") + optimizer_algo_name(spec.optimizer->algo) +
          " params=" + std::to_string(h.params) + " chunk=" + std::to_string(h.chunk) +
          " state_bytes=" + std::to_string(state_blob_bytes(h));
  }
  ok += "\n";
  std::vector<Conn*> members;
  for (uint16_t r = 0; r < p.world; ++r) {
    Conn& c = *conns_.at(p.conn[r]);
    c.role = Conn::Role::kJoined;
    c.job_id = id;
    members.push_back(&c);
  }
  GS_LOG_INFO("job '%s' (id 0x%" PRIx32 ") started: world %u, wire %s, %u slots%s%s", spec.name.c_str(), id,
              spec.world, gs_elem_name(spec.wire), spec.slots, spec.optimizer ? ", " : "",
              spec.optimizer ? describe_optimizer(*spec.optimizer).c_str() : "");
  ++jobs_started_;
  LiveJob& lj = *live;
  live_.emplace(id, std::move(live));
  pending_.erase(p.name);  // `p` is gone from here on
  for (auto& l : listeners_) l({JobEvent::kCreated, id, &lj.spec});
  for (Conn* c : members) reply(*c, ok);
  // Requests that arrived while the JOIN reply was held.
  for (Conn* c : members) process_lines(*c, now_ns);
}

void ControlPlane::fail_pending(PendingJob& p, const Error& e) {
  for (uint64_t cid : p.conn) {
    auto it = conns_.find(cid);
    if (cid == 0 || it == conns_.end()) continue;
    Conn& c = *it->second;
    c.role = Conn::Role::kNone;
    c.job_name.clear();
    reply_error(c, e.code, e.message);
  }
  std::string name = p.name;
  pending_.erase(name);
  // The connections may now process what they sent meanwhile (done at their next input or here).
  for (auto& [id, c] : conns_)
    if (c->role == Conn::Role::kNone && c->in.buffered()) process_lines(*c, monotonic_ns());
}

void ControlPlane::handle_leave(Conn& c, const Request& r, uint64_t now_ns) {
  Error err;
  if (!parse_no_args(r, &err)) return reply_error(c, err.code, err.message);
  if (c.role == Conn::Role::kNone)
    return reply_error(c, kErrState, "LEAVE without a JOIN on this connection");
  if (c.role == Conn::Role::kLeft) return reply_error(c, kErrState, "already left job '" + c.job_name + "'");
  reply(c, "OK\n");
  depart(c, /*graceful=*/true, now_ns);
}

void ControlPlane::depart(Conn& c, bool graceful, uint64_t now_ns) {
  if (c.role == Conn::Role::kPending) {
    auto it = pending_.find(c.job_name);
    if (it != pending_.end()) {
      PendingJob& p = *it->second;
      if (p.conn[c.rank] == c.id) {
        p.conn[c.rank] = 0;
        --p.joined;
        GS_LOG_DEBUG("job '%s': rank %u withdrew before the job started", p.name.c_str(), c.rank);
      }
      if (p.joined == 0) pending_.erase(it);
    }
    c.role = Conn::Role::kNone;
    return;
  }
  if (c.role != Conn::Role::kJoined) return;
  c.role = Conn::Role::kLeft;
  auto it = live_.find(c.job_id);
  if (it == live_.end()) return;
  LiveJob& j = *it->second;
  if (j.conn[c.rank] != c.id) return;
  j.conn[c.rank] = 0;
  --j.present;
  if (!j.aborted) {
    if (!graceful) {
      abort_live(j, GS_ABORT_RANK_LEFT, c.rank, "rank " + std::to_string(c.rank) + " disconnected");
    } else if (j.present > 0 && engine_.rank_left(j.id, c.rank)) {
      // The engine aborted it: a round was waiting for the rank that left.
      abort_live(j, GS_ABORT_RANK_LEFT, c.rank,
                 "rank " + std::to_string(c.rank) + " left (LEAVE) while the others were in an allreduce");
    }
  }
  end_job_if_empty(j);
}

void ControlPlane::abort_live(LiveJob& j, uint8_t reason, uint16_t rank, const std::string& why) {
  if (j.aborted) return;
  engine_.abort_job(j.id, reason, rank);  // false when a data thread aborted it first: its reason wins
  note_abort(j, why);
}

void ControlPlane::note_abort(LiveJob& j, const std::string& why) {
  JobStatus s;
  if (!engine_.job_status(j.id, &s) || !s.aborted) return;
  j.aborted = true;
  j.abort_why = why.empty() ? abort_reason_name(s.abort_reason) : why;
  GS_LOG_INFO("job '%s' (id 0x%" PRIx32 ") aborted: %s (reason %s, rank %s)%s", j.spec.name.c_str(), j.id,
              j.abort_why.c_str(), abort_reason_name(s.abort_reason),
              s.abort_rank == GS_RANK_ALL ? "-" : std::to_string(s.abort_rank).c_str(),
              s.abort_reason == GS_ABORT_MISMATCH ? mismatch_keys(s.mismatch).c_str() : "");
  // Every rank still connected learns it at once, also those between two allreduces.
  std::string event =
      "EVENT aborted job_id=" + std::to_string(j.id) + " reason=" + abort_reason_name(s.abort_reason) +
      " rank=" + (s.abort_rank == GS_RANK_ALL ? std::string("-") : std::to_string(s.abort_rank)) +
      " left=" + ranks_text(s.left) +
      (s.abort_reason == GS_ABORT_MISMATCH ? mismatch_keys(s.mismatch) : std::string()) + "\n";
  for (uint64_t cid : j.conn) {
    auto it = conns_.find(cid);
    if (cid != 0 && it != conns_.end()) send_event(*it->second, event);
  }
}

void ControlPlane::send_event(Conn& c, const std::string& line) {
  if (!c.stream.empty()) {  // a STATE_GET payload is going out: the event follows it
    c.deferred_events += line;
    return;
  }
  reply(c, line);
}

void ControlPlane::end_job_if_empty(LiveJob& j) {
  if (j.present > 0) return;
  if (!j.aborted) note_abort(j, "");  // logs an abort a data thread made since the last timer check
  uint32_t id = j.id;
  GS_LOG_INFO("job '%s' (id 0x%" PRIx32 ") ended: %s", j.spec.name.c_str(), id,
              j.aborted ? ("aborted (" + j.abort_why + ")").c_str() : "all ranks left");
  for (auto& l : listeners_) l({JobEvent::kDestroyed, id, nullptr});
  engine_.destroy_job(id);
  live_.erase(id);
}

void ControlPlane::handle_status(Conn& c, const Request& r, uint64_t now_ns) {
  Error err;
  auto q = parse_status(r, &err);
  if (!q) return reply_error(c, err.code, err.message);
  uint32_t id;
  if (q->job_id)
    id = *q->job_id;
  else if (c.role == Conn::Role::kJoined || c.role == Conn::Role::kLeft)
    id = c.job_id;
  else
    return reply_error(c, kErrBadRequest, "STATUS needs job_id= on a connection that has not joined a job");
  JobStatus s;
  if (!engine_.job_status(id, &s))
    return reply_error(c, kErrNotFound, "no job with id " + std::to_string(id));
  auto it = live_.find(id);
  uint64_t last = s.last_activity_ns;
  if (it != live_.end()) last = std::max({last, it->second->last_request_ns, it->second->start_ns});
  std::string out =
      "OK job_id=" + std::to_string(id) + " name=" + s.name + " world=" + std::to_string(s.world) +
      " state=" + (s.aborted ? "aborted" : "running") +
      " abort_reason=" + abort_reason_name(s.aborted ? s.abort_reason : 0) + " abort_rank=" +
      (s.aborted && s.abort_rank != GS_RANK_ALL ? std::to_string(s.abort_rank) : std::string("-")) +
      " idle_ms=" + std::to_string(now_ns > last ? (now_ns - last) / 1'000'000 : 0) + " rank_seq=";
  for (size_t i = 0; i < s.rank_last_seq.size(); ++i)
    out += (i ? "," : "") + std::to_string(s.rank_last_seq[i]);
  out += " left=" + ranks_text(s.left);
  if (s.aborted && s.abort_reason == GS_ABORT_MISMATCH) out += mismatch_keys(s.mismatch);
  if (q->slot) {
    if (*q->slot >= s.slots)
      return reply_error(c, kErrBadRequest,
                         "slot=" + std::to_string(*q->slot) + " is out of range (the job has " +
                             std::to_string(s.slots) + " slots)");
    SlotStatus ss;
    if (!engine_.slot_status(id, *q->slot, q->version, &ss))
      return reply_error(c, kErrNotFound,
                         "no slot " + std::to_string(*q->slot) + " in job " + std::to_string(id));
    out += std::string(" slot_state=") +
           (ss.open       ? "open"
            : ss.complete ? "complete"
                          : "empty") +
           " slot_seq=" + std::to_string(ss.seq) + " slot_offset=" + std::to_string(ss.offset) + " seen=";
    out += ranks_text(ss.seen);
  }
  reply(c, out + "\n");
}

std::string ControlPlane::stats_line() const {
  std::string s = counters_text(engine_.total_counters()) + " jobs=" + std::to_string(live_.size()) +
                  " joining=" + std::to_string(pending_.size()) +
                  " jobs_started=" + std::to_string(jobs_started_);
  for (auto& src : stats_sources_) {
    std::string extra = src();
    if (!extra.empty()) s += " " + extra;
  }
  return s;
}

void ControlPlane::handle_stats(Conn& c, const Request& r) {
  Error err;
  auto q = parse_stats(r, &err);
  if (!q) return reply_error(c, err.code, err.message);
  if (!q->job_id) return reply(c, "OK " + stats_line() + "\n");
  JobStatus s;
  if (!engine_.job_status(*q->job_id, &s))
    return reply_error(c, kErrNotFound, "no job with id " + std::to_string(*q->job_id));
  reply(c, "OK " + counters_text(s.counters) + "\n");
}

void ControlPlane::handle_jobs(Conn& c, const Request& r) {
  Error err;
  if (!parse_no_args(r, &err)) return reply_error(c, err.code, err.message);
  std::string out = "OK jobs=";
  bool first = true;
  for (auto& [id, j] : live_) {
    out += (first ? "" : ",") + std::to_string(id) + ":" + j->spec.name + ":" +
           std::to_string(j->spec.world) + ":" + (j->aborted ? "aborted" : "running");
    first = false;
  }
  for (auto& [name, p] : pending_) {
    out += (first ? "" : ",") + std::string("0:") + name + ":" + std::to_string(p->world) + ":joining";
    first = false;
  }
  reply(c, out + "\n");
}

void ControlPlane::check_timers(uint64_t now_ns) {
  if (now_ns < next_timer_check_ns_) return;
  next_timer_check_ns_ = now_ns + kTimerPeriodNs;
  for (auto& [id, c] : conns_)
    if (c->wr_shut && now_ns >= c->drain_deadline_ns) c->dead = true;
  // Join timeout.
  std::vector<std::string> expired;
  for (auto& [name, p] : pending_)
    if (now_ns >= p->deadline_ns) expired.push_back(name);
  for (const std::string& name : expired) {
    auto it = pending_.find(name);
    if (it == pending_.end() || now_ns < it->second->deadline_ns) continue;
    PendingJob* p = it->second.get();
    std::string missing;
    for (uint16_t r = 0; r < p->world; ++r)
      if (!p->conn[r]) missing += (missing.empty() ? "" : ",") + std::to_string(r);
    GS_LOG_INFO("job '%s': join timed out, %u of %u ranks joined (missing %s)", p->name.c_str(), p->joined,
                p->world, missing.c_str());
    fail_pending(*p, {kErrTimeout, "job '" + p->name + "': " + std::to_string(p->joined) + " of " +
                                       std::to_string(p->world) + " ranks joined within " +
                                       std::to_string(config_.join_timeout_s) + " s (missing ranks " +
                                       missing + "; --join-timeout)"});
  }
  // Jobs a data thread aborted (ranks that disagree, a round waiting for a rank that left).
  for (auto& [id, j] : live_) {
    JobStatus s;
    if (!j->aborted && engine_.job_status(id, &s) && s.aborted) note_abort(*j, "");
  }
  // Idle timeout.
  const uint64_t idle_ns = uint64_t(config_.idle_timeout_s) * 1'000'000'000ull;
  for (auto& [id, j] : live_) {
    if (j->aborted) continue;
    JobStatus s;
    uint64_t last = std::max(j->last_request_ns, j->start_ns);
    if (engine_.job_status(id, &s)) last = std::max(last, s.last_activity_ns);
    if (now_ns > last && now_ns - last > idle_ns)
      abort_live(*j, GS_ABORT_IDLE, GS_RANK_ALL,
                 "idle for " + std::to_string(config_.idle_timeout_s) + " s (--idle-timeout)");
  }
  // Periodic stats.
  if (config_.stats_interval_s > 0) {
    if (next_stats_ns_ == 0) next_stats_ns_ = now_ns + uint64_t(config_.stats_interval_s) * 1'000'000'000ull;
    if (now_ns >= next_stats_ns_) {
      next_stats_ns_ = now_ns + uint64_t(config_.stats_interval_s) * 1'000'000'000ull;
      GS_LOG_INFO("stats: %s", stats_line().c_str());
    }
  }
}

void ControlPlane::shutdown_jobs(uint64_t now_ns) {
  shutting_down_ = true;
  while (!pending_.empty())
    fail_pending(*pending_.begin()->second, {kErrState, "the switch is shutting down"});
  for (auto& [id, j] : live_) abort_live(*j, GS_ABORT_SHUTDOWN, GS_RANK_ALL, "the switch is shutting down");
  for (auto& [id, c] : conns_) flush(*c);
}

void ControlPlane::close_all() {
  for (auto& [id, c] : conns_) c->dead = true;
  sweep(monotonic_ns());
  for (auto& [id, j] : live_) {
    for (auto& l : listeners_) l({JobEvent::kDestroyed, id, nullptr});
    engine_.destroy_job(id);
  }
  live_.clear();
  pending_.clear();
}

void ControlPlane::reply(Conn& c, const std::string& line) {
  if (c.dead) return;
  c.out += line;
  flush(c);
}

void ControlPlane::reply_error(Conn& c, const char* code, const std::string& message) {
  GS_LOG_DEBUG("control: %s: ERR %s %s", c.peer.c_str(), code, message.c_str());
  reply(c, format_error({code, message}));
}

void ControlPlane::flush(Conn& c) {
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

void ControlPlane::sweep(uint64_t now_ns) {
  std::vector<uint64_t> gone;
  for (auto& [id, c] : conns_)
    if (c->dead) gone.push_back(id);
  for (uint64_t id : gone) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    Conn& c = *it->second;
    depart(c, /*graceful=*/false, now_ns);
    GS_LOG_DEBUG("control: %s closed", c.peer.c_str());
    ::close(c.fd);
    conns_.erase(it);
  }
}

}  // namespace gradswitch
