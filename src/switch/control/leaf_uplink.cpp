// A leaf switch's side of its spine (see leaf_uplink.h): forwarded JOINs, the spine's replies and
// events, and the two levels ending together.
#include "switch/control/leaf_uplink.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "switch/control/jobs.h"
#include "switch/log.h"
#include "switch/options/values.h"

namespace gradswitch::control {

namespace {

// The JOIN a leaf sends the spine for one member: the member's own keys (job, world, rank, wire,
// token, optimizer keys, and whatever credentials a JOIN carries) with the leaf's data port in place
// of the member's, leaf=1, and the member's own address as peer= (the ring's peers= list). The one
// place that builds it.
std::string forwarded_join(const Request& member_join, const std::string& member_peer,
                           uint16_t leaf_data_port) {
  std::string line = "JOIN";
  for (const auto& [k, v] : member_join.args)
    if (k != "port") line += " " + k + "=" + v;
  const std::string* port = member_join.find("port");
  const std::string ip = member_peer.substr(0, member_peer.rfind(':'));
  return line + " port=" + std::to_string(leaf_data_port) + " leaf=1 peer=" + ip + ":" +
         (port ? *port : "0") + "\n";
}

std::map<std::string, std::string> reply_keys(const std::string& line) {
  std::map<std::string, std::string> kv;
  size_t pos = line.find(' ');
  while (pos != std::string::npos) {
    const size_t start = pos + 1, end = line.find(' ', start);
    const std::string tok = line.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (const size_t eq = tok.find('='); eq != std::string::npos && eq > 0)
      kv[tok.substr(0, eq)] = tok.substr(eq + 1);
    pos = end;
  }
  return kv;
}

// A number from the spine's reply within [lo, hi], or nullopt.
std::optional<uint64_t> reply_number(const std::map<std::string, std::string>& kv, const char* key,
                                     uint64_t lo, uint64_t hi) {
  auto it = kv.find(key);
  if (it == kv.end()) return std::nullopt;
  auto n = parse_number(it->second, hi);
  if (!n || *n < lo) return std::nullopt;
  return n;
}

}  // namespace

LeafUplink::LeafUplink(Engine& engine, const SwitchConfig& config, Connections& conns, Jobs& jobs)
    : engine_(engine), config_(config), conns_(conns), jobs_(jobs) {}

void LeafUplink::spine_address(uint32_t* ip_be, uint16_t* port) const {
  std::string why;
  option_values::parse_ipv4_port(config_.uplink, ip_be, port, &why);
}

void LeafUplink::forward_join(Conn& member, const Request& join, PendingJob& p) {
  uint32_t spine_ip = 0;
  uint16_t spine_port = 0;
  spine_address(&spine_ip, &spine_port);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = spine_ip;
  a.sin_port = htons(spine_port);
  // The spine sends a leaf's results to the address this connection comes from (protocol.md §8), so it
  // must be one the leaf's data ports listen on: the --control-host address when it is a specific one
  // (a leaf with a rack side and an uplink side would otherwise connect from its uplink address).
  sockaddr_in local{};
  local.sin_family = AF_INET;
  inet_pton(AF_INET, config_.control_host.c_str(), &local.sin_addr);
  const bool bind_failed = fd >= 0 && local.sin_addr.s_addr != htonl(INADDR_ANY) &&
                           ::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0;
  if (fd < 0 || bind_failed ||
      (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS)) {
    const std::string err = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return jobs_.fail_pending(p, {kErrState, "job '" + p.name + "': cannot reach the spine switch at " +
                                                 config_.uplink + " (--uplink): " + err});
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  auto up = std::make_unique<Conn>();
  up->id = conns_.new_id();
  up->fd = fd;
  up->peer_ipv4_be = spine_ip;
  up->peer = config_.uplink;
  up->role = Conn::Role::kUplink;
  up->job_name = p.name;
  up->rank = member.rank;
  up->uplink_expect.push_back(Conn::UplinkReply::kJoin);
  up->out = forwarded_join(join, member.peer, static_cast<uint16_t>(config_.data_port));
  p.uplink_conn[member.rank] = up->id;
  GS_LOG_DEBUG("job '%s': rank %u's JOIN forwarded to the spine %s", p.name.c_str(), member.rank,
               config_.uplink.c_str());
  conns_.add(std::move(up));  // its output goes once the connection is up (poll: POLLOUT)
}

void LeafUplink::process_lines(Conn& up, uint64_t now_ns) {
  std::string line;
  while (!up.dead) {
    auto next = up.in.next(&line);
    if (next == LineFramer::Next::kNone) return;
    if (next == LineFramer::Next::kTooLong) {
      GS_LOG_WARN("spine %s sent a line over %zu bytes; dropping the connection", up.peer.c_str(),
                  kMaxLineBytes);
      up.dead = true;
      return;
    }
    if (line.rfind("EVENT ", 0) == 0) {
      event(up, line);
      continue;
    }
    if (up.uplink_expect.empty()) continue;  // nothing asked: not ours to answer
    const Conn::UplinkReply what = up.uplink_expect.front();
    up.uplink_expect.pop_front();
    if (what == Conn::UplinkReply::kJoin) join_reply(up, line, now_ns);
  }
}

void LeafUplink::join_reply(Conn& up, const std::string& line, uint64_t now_ns) {
  PendingJob* pp = jobs_.find_pending(up.job_name);
  if (!pp || pp->uplink_conn[up.rank] != up.id) return;  // cancelled meanwhile
  PendingJob& p = *pp;
  if (line.rfind("OK", 0) != 0) {
    std::string code = kErrState, message = line;
    if (line.rfind("ERR ", 0) == 0) {
      const size_t sp = line.find(' ', 4);
      code = line.substr(4, sp == std::string::npos ? std::string::npos : sp - 4);
      message = sp == std::string::npos ? "" : line.substr(sp + 1);
    }
    static const char* const kCodes[] = {kErrBadRequest, kErrConflict, kErrState, kErrTimeout,
                                         kErrNoResources};
    const char* known = kErrState;
    for (const char* k : kCodes)
      if (code == k) known = k;
    GS_LOG_INFO("job '%s': the spine %s refused rank %u: %s", p.name.c_str(), up.peer.c_str(), up.rank,
                line.c_str());
    return jobs_.fail_pending(p, {known, "the spine switch at " + up.peer +
                                             " (this switch's --uplink) refused " + "the job: " + message});
  }
  if (p.spine_reply.empty()) p.spine_reply = reply_keys(line);
  if (++p.uplink_ok == p.joined) start_job(p, now_ns);
}

bool LeafUplink::spine_job(PendingJob& p, UplinkSpec* up) {
  const auto& kv = p.spine_reply;
  auto job_id = reply_number(kv, "job_id", 1, UINT32_MAX), key = reply_number(kv, "key", 0, UINT32_MAX),
       slots = reply_number(kv, "slots", 1, UINT16_MAX),
       payload = reply_number(kv, "payload", 8, GS_MAX_PAYLOAD_BYTES),
       data_port = reply_number(kv, "data_port", 1, 65535), threads = reply_number(kv, "threads", 1, 65535);
  if (!job_id || !key || !slots || !payload || !data_port || !threads || *data_port + *threads - 1 > 65535) {
    jobs_.fail_pending(p, {kErrState, "the spine switch at " + config_.uplink +
                                          " answered the JOIN without a usable job_id, key, slots, payload, "
                                          "data_port or threads"});
    return false;
  }
  up->job_id = static_cast<uint32_t>(*job_id);
  up->key = static_cast<uint32_t>(*key);
  up->slots = static_cast<uint16_t>(*slots);
  up->payload_bytes = static_cast<uint32_t>(*payload) & ~3u;
  uint32_t spine_ip = 0;
  uint16_t spine_port = 0;
  spine_address(&spine_ip, &spine_port);
  for (uint64_t t = 0; t < *threads; ++t)
    up->data_threads.push_back(Endpoint{spine_ip, htons(static_cast<uint16_t>(*data_port + t))});
  return true;
}

void LeafUplink::start_job(PendingJob& p, uint64_t now_ns) {
  auto up = std::make_shared<UplinkSpec>();
  if (!spine_job(p, up.get())) return;
  JobSpec spec = jobs_.new_spec(p);
  // The rack's rounds must fit the spine's slots and packets; 16-bit and mx8 sums go up as fp32.
  spec.slots = std::min(spec.slots, up->slots);
  const bool half = spec.wire == GS_ELEM_FLOAT16 || spec.wire == GS_ELEM_BFLOAT16;
  const uint32_t fp32_count = up->payload_bytes / 4;  // the spine's packet in fp32 elements
  const uint32_t fit = half                       ? (up->payload_bytes / 2) & ~3u
                       : spec.wire == GS_ELEM_MX8 ? (fp32_count / GS_MX8_BLOCK * GS_MX8_BLOCK_BYTES) & ~3u
                                                  : up->payload_bytes;
  spec.payload_bytes = std::min(spec.payload_bytes, fit);
  if (spec.optimizer && spec.payload_bytes != up->payload_bytes)
    return jobs_.fail_pending(
        p, {kErrConflict, "job '" + p.name + "' optimizes at the spine, whose chunks are " +
                              std::to_string(up->payload_bytes / 4) + " elements, but this leaf's " +
                              "packets hold " + std::to_string(spec.payload_bytes / 4) +
                              ": give leaf and spine the same --mtu"});
  spec.optimizer = nullptr;  // the spine, the root, optimizes
  for (uint16_t r = 0; r < p.world; ++r)
    if (p.conn[r]) {
      if (!spec.members) up->rank = r;  // the lowest member stands for the rack at the spine
      spec.members |= uint64_t{1} << r;
      spec.endpoints.push_back(Endpoint{conns_.at(p.conn[r]).peer_ipv4_be, htons(p.port[r])});
    }
  spec.uplink = up;
  // The members see one job: the spine's peers (every worker's own address) and optimizer keys.
  std::string tail;
  for (const char* k : {"peers", "optimizer", "params", "chunk", "state_bytes"})
    if (auto it = p.spine_reply.find(k); it != p.spine_reply.end())
      tail += std::string(" ") + k + "=" + it->second;
  std::vector<uint16_t> leader(p.world);
  for (uint16_t r = 0; r < p.world; ++r) leader[r] = r;
  jobs_.launch(p, spec, std::move(leader), tail, now_ns);
}

void LeafUplink::withdraw(PendingJob& p, uint16_t rank) {
  close(p.uplink_conn[rank]);
  if (p.uplink_conn[rank] && p.uplink_ok > 0) {
    // The spine had started the job with this rank: it cannot start here without it.
    p.uplink_conn[rank] = 0;
    return jobs_.fail_pending(p, {kErrState, "job '" + p.name + "': rank " + std::to_string(rank) +
                                                 " withdrew as the spine started the job"});
  }
  p.uplink_conn[rank] = 0;
}

void LeafUplink::depart(LiveJob& j, uint16_t rank, bool graceful) {
  Conn* up = conns_.find(j.uplink_conn[rank]);
  if (!up) return;
  if (graceful) {  // the spine learns it as from the member itself; the connection stays until the job ends
    up->uplink_expect.push_back(Conn::UplinkReply::kLeave);
    conns_.reply(*up, "LEAVE\n");
    return;
  }
  close(j.uplink_conn[rank]);  // the spine aborts its job naming this rank
  j.uplink_conn[rank] = 0;
}

void LeafUplink::close(uint64_t conn_id) {
  Conn* up = conn_id ? conns_.find(conn_id) : nullptr;
  if (!up) return;
  up->uplink_closed_by_us = true;
  up->dead = true;  // closed at the end of this step (sweep)
}

void LeafUplink::lost(Conn& up) {
  if (up.uplink_closed_by_us) return;
  const std::string why = "lost the spine switch at " + up.peer + " (--uplink): its control connection " +
                          (up.last_errno ? std::string("failed: ") + std::strerror(up.last_errno) : "closed");
  if (PendingJob* p = jobs_.find_pending(up.job_name); p && p->uplink_conn[up.rank] == up.id) {
    p->uplink_conn[up.rank] = 0;
    return jobs_.fail_pending(*p, {kErrState, "job '" + up.job_name + "': " + why});
  }
  LiveJob* jp = jobs_.find_live(up.job_id);
  if (!jp || jp->aborted) return;
  LiveJob& j = *jp;
  for (uint64_t& cid : j.uplink_conn)
    if (cid == up.id) cid = 0;
  engine_.abort_from_uplink(j.id, 0, GS_RANK_ALL);
  jobs_.note_abort(j, why);
}

void LeafUplink::event(Conn& up, const std::string& line) {
  LiveJob* jp = up.job_id ? jobs_.find_live(up.job_id) : nullptr;
  if (!jp || jp->aborted) return;
  LiveJob& j = *jp;
  auto kv = reply_keys(line);
  const uint8_t reason = gs_abort_reason_from_name(kv[GS_KEY_REASON].c_str());
  auto rank = parse_number(kv["rank"], GS_RANK_ALL - 1);
  j.spine_event_keys.clear();
  for (const auto& [k, v] : kv)
    if (k.rfind("mismatch_", 0) == 0) j.spine_event_keys += " " + k + "=" + v;
  engine_.abort_from_uplink(j.id, reason ? reason : static_cast<uint8_t>(GS_ABORT_OPERATOR),
                            rank ? static_cast<uint16_t>(*rank) : GS_RANK_ALL);
  jobs_.note_abort(j, "the spine switch at " + up.peer + " aborted the job (" + kv["reason"] + ", rank " +
                          kv["rank"] + ")");
}

std::string LeafUplink::uplink_keys(const LiveJob& j, const JobStatus& s) const {
  Line keys("");
  keys.add(GS_KEY_UPLINK_REASON, s.uplink_reason ? gs_abort_reason_name(s.uplink_reason) : GS_UPLINK_LOST)
      .add(GS_KEY_UPLINK_RANK,
           s.uplink_rank == GS_RANK_ALL ? std::string(GS_NO_RANK) : std::to_string(s.uplink_rank))
      .raw(j.spine_event_keys);
  std::string text = keys.str();
  text.pop_back();
  return text;
}

}  // namespace gradswitch::control
