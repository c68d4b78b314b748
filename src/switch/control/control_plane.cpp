// The control plane's owner (see control_plane.h): the step, its timers, and the dispatch of each
// request line to the type whose job it is.
#include "switch/control/control_plane.h"

#include <algorithm>

#include "common/clock.h"

namespace gradswitch {

using namespace control;

namespace {
constexpr uint64_t kTimerPeriodNs = 100'000'000;
}  // namespace

ControlPlane::ControlPlane(Engine& engine, const SwitchConfig& config)
    : conns_(config, *this),
      auth_(config, conns_, *this),
      leaf_(engine, config, conns_, jobs_),  // jobs_ is only bound here, used once constructed
      jobs_(engine, config, conns_, auth_, leaf_, *this),
      optimizer_(engine, config, conns_),
      queries_(engine, config, conns_, auth_, jobs_, leaf_) {}

ControlPlane::~ControlPlane() {
  close_all();
}

void ControlPlane::use_auth(AuthTable table) {
  auth_.use(std::move(table));
  conns_.set_authenticating(true);
}

void ControlPlane::run(const std::atomic<bool>& stop, std::atomic<bool>* reload) {
  // A signal sets `stop` on another thread and does not interrupt this poll: looking every 10 ms
  // (not 100) lets SIGTERM abort the jobs promptly, while their allreduces are still in flight.
  while (!stop.load(std::memory_order_relaxed)) {
    if (reload && reload->exchange(false)) reload_auth();
    step(10, monotonic_ns());
  }
  shutdown_jobs(monotonic_ns());
}

void ControlPlane::reload_auth() {
  if (std::optional<AuthChange> change = auth_.reload()) {
    jobs_.settle_reload(*change);  // its ranks are outside a job then, and settled with the rest
    auth_.settle_connections(*change);
  }
  gauges_.auth_reloads.store(auth_.reloads(), std::memory_order_relaxed);
  gauges_.auth_reload_failures.store(auth_.reload_failures(), std::memory_order_relaxed);
}

void ControlPlane::step(int timeout_ms, uint64_t now_ns) {
  conns_.poll_once(timeout_ms, now_ns);
  auth_.answer_deferred(now_ns);
  check_timers(now_ns);
  conns_.sweep(now_ns);
  gauges_.joining.store(jobs_.pending().size(), std::memory_order_relaxed);
  gauges_.reserved_bytes.store(jobs_.reserved_memory(), std::memory_order_relaxed);
  gauges_.jobs_started.store(jobs_.started(), std::memory_order_relaxed);
  gauges_.connections.store(conns_.all().size(), std::memory_order_relaxed);
}

void ControlPlane::check_timers(uint64_t now_ns) {
  if (now_ns < next_timer_check_ns_) return;
  next_timer_check_ns_ = now_ns + kTimerPeriodNs;
  conns_.expire_drains(now_ns);
  auth_.check_deadlines(now_ns);
  auth_.flush_log(now_ns);
  jobs_.check_timers(now_ns);
  queries_.log_periodic(now_ns);
}

void ControlPlane::shutdown_jobs(uint64_t now_ns) {
  jobs_.shutdown(now_ns);
}

void ControlPlane::close_all() {
  conns_.close_all(monotonic_ns());
  jobs_.destroy_all();
}

void ControlPlane::on_depart(Conn& c, uint64_t now_ns) {
  jobs_.depart(c, /*graceful=*/false, now_ns);
  auth_.forget_deferred(c);
}

void ControlPlane::on_input(Conn& c, uint64_t now_ns) {
  if (c.role == Conn::Role::kUplink) return leaf_.process_lines(c, now_ns);
  std::string line;
  while (!c.dead && !c.closing && c.role != Conn::Role::kPending && !c.auth_wait && c.stream.empty()) {
    if (c.bin) {
      optimizer_.feed(c);
      if (c.bin) return;  // waits for more payload
      continue;
    }
    auto next = c.in.next(&line);
    if (next == LineFramer::Next::kNone) return;
    if (next == LineFramer::Next::kTooLong)
      return conns_.close_with_error(c, kErrTooLong,
                                     "line over " + std::to_string(kMaxLineBytes) +
                                         " bytes (terminator included); closing the connection");
    handle_line(c, line, now_ns);
  }
}

void ControlPlane::handle_line(Conn& c, const std::string& line, uint64_t now_ns) {
  Error err;
  auto req = parse_request(line, &err);
  if (!req) {
    // A binary request whose line is malformed: the length of what follows is unknown.
    std::string_view verb(line);
    verb.remove_prefix(std::min(verb.find_first_not_of(' '), verb.size()));
    verb = verb.substr(0, verb.find(' '));
    if (verb == GS_VERB_PARAMS || verb == GS_VERB_STATE_SET)
      return conns_.close_with_error(
          c, err.code,
          err.message + "; the length of the payload that follows is unknown: closing the connection");
    return conns_.reply_error(c, err.code, err.message);
  }
  jobs_.note_request(c, now_ns);
  const std::string& v = req->verb;
  if (v == GS_VERB_JOIN) return jobs_.handle_join(c, *req, now_ns);
  if (v == GS_VERB_LEAVE) return jobs_.handle_leave(c, *req, now_ns);
  if (v == GS_VERB_STATUS) return queries_.handle_status(c, *req, now_ns);
  if (v == GS_VERB_STATS) return queries_.handle_stats(c, *req);
  if (v == GS_VERB_JOBS) return queries_.handle_jobs(c, *req);
  if (v == GS_VERB_PING) {
    if (!parse_no_args(*req, &err)) return conns_.reply_error(c, err.code, err.message);
    return conns_.reply(c, GS_REPLY_OK "\n");
  }
  if (v == GS_VERB_PARAMS || v == GS_VERB_STATE_SET) return optimizer_.handle_upload(c, *req);
  if (v == GS_VERB_SETLR) return optimizer_.handle_setlr(c, *req);
  if (v == GS_VERB_STATE_GET) return optimizer_.handle_state_get(c, *req);
  if (v == GS_VERB_CHALLENGE) return auth_.handle_challenge(c, *req);
  if (v == GS_VERB_AUTH) return auth_.handle_auth(c, *req, now_ns);
  if (v == GS_VERB_ABORT) return jobs_.handle_abort(c, *req);
  conns_.reply_error(
      c, kErrBadRequest,
      "unknown verb '" + v +
          "' (expected JOIN, LEAVE, STATUS, STATS, JOBS, PING, CHALLENGE, AUTH, ABORT, PARAMS, SETLR, "
          "STATE_GET or STATE_SET)");
}

}  // namespace gradswitch
