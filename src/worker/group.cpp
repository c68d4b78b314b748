// A worker's Group: connect/JOIN, the queue of operations and its thread, optimizer-job requests,
// and the checks every allreduce passes before a data path (path.h) runs it.
#include "worker/group.h"

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/counter.h"
#include "gradswitch/control.h"
#include "gradswitch/wire.h"
#include "worker/log.h"
#include "worker/ring/ring_peers.h"
#include "worker/switch/sharded_allreduce.h"
#include "worker/switch/switch_allreduce.h"

namespace gradswitch::worker {

std::vector<std::string> switch_list(const std::string& addrs) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = addrs.find(',', start);
    out.push_back(addrs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

namespace {

constexpr size_t kMaxShards = 64;  // the transport watches one control connection per switch

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' || c == '-'))
      return false;
  return true;
}

bool valid_key(const std::string& s) {
  if (s.empty() || s.size() > 32) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

// Control connections to a sharded job's switches beyond the first (none for one switch).
std::vector<SwitchLink> connect_more_switches(const Options& opt) {
  const std::vector<std::string> addrs = switch_list(opt.switch_addr);
  std::vector<SwitchLink> more;
  for (size_t i = 0; i < addrs.size(); ++i) {
    if (std::count(addrs.begin(), addrs.end(), addrs[i]) > 1 || addrs[i].empty())
      throw InvalidArgument(
          "gradswitch: the switch list '" + opt.switch_addr + "' " +
          (addrs[i].empty() ? std::string("has an empty entry") : "names '" + addrs[i] + "' twice") +
          ": give each switch of a sharded job once, as host:port,host:port,...");
    if (addrs.size() > kMaxShards)
      throw InvalidArgument("gradswitch: a job is sharded over at most " + std::to_string(kMaxShards) +
                            " switches, got " + std::to_string(addrs.size()));
    if (i == 0) continue;
    std::string host;
    uint16_t port = 0;
    split_host_port(addrs[i], &host, &port);
    SwitchLink l;
    l.control = std::make_unique<ControlClient>(host, port, opt.connect_timeout_s);
    more.push_back(std::move(l));
  }
  return more;
}

// JOIN's token when the caller gives none: with a switch it only tells the ranks of one job name apart
// from a stray JOIN (docs/protocol.md §1.2); the job's secret is the key the switch draws.
constexpr const char* kDefaultJoinToken = "gradswitch";

// The data socket's local address: Options::bind_ip when given; else the local address of the
// control connection (the one that reaches the switch, which the switch lists in peers=), when every
// switch of the job is reached from the same one; else any (0.0.0.0: no switch, switches reached
// through different interfaces, or an explicit ring whose entries name the addresses peers send to).
std::string data_bind_address(const Options& opt, const ControlClient* control,
                              const std::vector<SwitchLink>& more) {
  if (!opt.bind_ip.empty() || !control || !opt.peers.empty()) return opt.bind_ip;
  const uint32_t local = control->local_ipv4_be();
  if (local == 0) return "";
  for (const SwitchLink& l : more)
    if (l.control->local_ipv4_be() != local) return "";
  char text[INET_ADDRSTRLEN] = {};
  in_addr a{};
  a.s_addr = local;
  ::inet_ntop(AF_INET, &a, text, sizeof text);
  return text;
}

}  // namespace

uint32_t job_types(const Options& opt) {
  uint32_t mask = (1u << parse_wire(opt.wire)) | (1u << GS_ELEM_INT32);
  for (size_t start = 0; !opt.types.empty();) {
    const size_t comma = opt.types.find(',', start);
    mask |= 1u << parse_wire(opt.types.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return mask;
}

uint8_t parse_wire(const std::string& name) {
  if (name == "int32") return GS_ELEM_INT32;
  if (name == "float32") return GS_ELEM_FLOAT32;
  if (name == "fixed32") return GS_ELEM_FIXED32;
  if (name == "float16") return GS_ELEM_FLOAT16;
  if (name == "bfloat16") return GS_ELEM_BFLOAT16;
  if (name == "float64") return GS_ELEM_FLOAT64;
  if (name == "mx8") return GS_ELEM_MX8;
  throw InvalidArgument("gradswitch: unknown wire '" + name +
                        "' (expected float32, fixed32, float16, bfloat16, float64, mx8 or int32)");
}

// ---------------------------------------------------------------- Handle

void Handle::wait() const {
  if (!s_) throw Error("gradswitch: wait() on an empty handle");
  std::unique_lock<std::mutex> lk(s_->mu);
  s_->cv.wait(lk, [&] { return s_->done; });
  if (s_->error) std::rethrow_exception(s_->error);
}

bool Handle::wait_for(double seconds) const {
  if (!s_) return true;
  std::unique_lock<std::mutex> lk(s_->mu);
  return s_->cv.wait_for(lk, std::chrono::duration<double>(seconds), [&] { return s_->done; });
}

bool Handle::done() const {
  if (!s_) return true;
  std::lock_guard<std::mutex> lk(s_->mu);
  return s_->done;
}

uint64_t Handle::missed() const {
  if (!s_) return 0;
  std::lock_guard<std::mutex> lk(s_->mu);
  return s_->missed;
}

// ---------------------------------------------------------------- Group: setup, queue

namespace {

// The window options with their environment overrides (benchmarks compare windows without code).
Options with_window_env(Options o) {
  if (const char* e = std::getenv("GRADSWITCH_WINDOW")) o.window = e;
  if (const char* e = std::getenv("GRADSWITCH_TARGET_DELAY_US")) o.target_delay_s = std::atof(e) * 1e-6;
  if (o.window != "adaptive" && o.window != "fixed" && window_rounds(o.window) == 0)
    throw InvalidArgument(
        "gradswitch: window must be 'adaptive', 'fixed' or a number of rounds from 1 to 65535 "
        "(GRADSWITCH_WINDOW), got '" +
        o.window + "'");
  if (!(o.target_delay_s > 0 && o.target_delay_s <= 1))
    throw InvalidArgument(
        "gradswitch: the window's target delay must be in (0, 1] s (GRADSWITCH_TARGET_DELAY_US), got " +
        std::to_string(o.target_delay_s) + " s");
  return o;
}

// The job's identity and what travels: wire, world size and rank, names, credentials, types.
void check_job(const Options& opt) {
  parse_wire(opt.wire);
  if (opt.world < 1 || opt.world > GS_MAX_WORLD)
    throw InvalidArgument("gradswitch: world_size must be in 1.." + std::to_string(GS_MAX_WORLD) + ", got " +
                          std::to_string(opt.world));
  if (opt.rank >= opt.world)
    throw InvalidArgument("gradswitch: rank must be in 0..world_size-1, got rank " +
                          std::to_string(opt.rank) + " with world_size " + std::to_string(opt.world));
  if (!valid_name(opt.job))
    throw InvalidArgument("gradswitch: job name '" + opt.job +
                          "' must be 1..64 characters of [A-Za-z0-9._:-]");
  if (!opt.token.empty() && !valid_name(opt.token))
    throw InvalidArgument("gradswitch: token must be 1..64 characters of [A-Za-z0-9._:-]");
  if (!opt.tenant.empty() &&
      (opt.tenant.size() > 64 ||
       opt.tenant.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                    "0123456789._-") != std::string::npos))
    throw InvalidArgument("gradswitch: tenant '" + opt.tenant +
                          "' must be 1..64 characters of [A-Za-z0-9._-]");
  if (opt.tenant.empty() != opt.secret.empty())
    throw InvalidArgument(opt.tenant.empty()
                              ? "gradswitch: a secret was given without a tenant (GRADSWITCH_TENANT)"
                              : "gradswitch: tenant '" + opt.tenant +
                                    "' needs its secret (GRADSWITCH_SECRET or GRADSWITCH_SECRET_FILE)");
  job_types(opt);  // checks Options::types
}

// How the allreduces run: the test hooks and timeout, the algorithm and the switches it needs, what an
// optimizer job allows, the ring's pool.
void check_paths(const Options& opt) {
  if (!(opt.drop_rate >= 0.0 && opt.drop_rate < 1.0))
    throw InvalidArgument("gradswitch: drop_rate must be in [0, 1)");
  if (!(opt.timeout_s > 0.0)) throw InvalidArgument("gradswitch: timeout must be > 0");
  if (opt.algorithm != "switch" && opt.algorithm != "ring" && opt.algorithm != "auto")
    throw InvalidArgument("gradswitch: algorithm must be 'switch', 'ring' or 'auto', got '" + opt.algorithm +
                          "'");
  if (opt.switch_addr.empty() && opt.algorithm == "switch")
    throw InvalidArgument("gradswitch: algorithm='switch' needs a switch address");
  if (switch_list(opt.switch_addr).size() > 1 && !opt.optimizer.empty())
    throw InvalidArgument(
        "gradswitch: an optimizer job keeps its parameters in one switch (or behind one "
        "leaf/spine hierarchy): it cannot be sharded over the switches '" +
        opt.switch_addr + "'; give one switch address");
  if (!opt.optimizer.empty() && opt.algorithm != "switch")
    throw InvalidArgument(
        "gradswitch: an optimizer job runs its optimizer in the switch: it needs algorithm='switch'");
  if (opt.ring_slots < 1 || opt.ring_slots > 65535 || opt.ring_payload_bytes < 64 ||
      opt.ring_payload_bytes > GS_MAX_PAYLOAD_BYTES)
    throw InvalidArgument("gradswitch: ring_slots must be in 1..65535 and ring_payload_bytes in 64.." +
                          std::to_string(GS_MAX_PAYLOAD_BYTES));
}

// An explicit ring (Options::peers): this rank receives on its own entry's port, also when a switch is
// used. Empty without one.
std::vector<RingPeer> given_ring_peers(const Options& opt) {
  std::vector<RingPeer> given;
  if (!opt.peers.empty()) given = resolve_peers(opt.peers, opt.world);
  // Without a switch the ring's job_id and key derive from job, token and world size (§7): a token
  // everyone knows would give anyone who can guess the job name the key. The ranks cannot agree on a
  // drawn one before they can talk, so the caller shares one (the torch backend and the MPI library
  // draw it at rank 0 and share it through their own channel).
  const bool ring_alone = (opt.switch_addr.empty() || opt.algorithm == "auto") &&
                          (!given.empty() || opt.exchange_peers != nullptr);
  if (ring_alone && opt.token.empty())
    throw InvalidArgument(
        std::string("gradswitch: the ring ") +
        (opt.switch_addr.empty() ? "without a switch"
                                 : "that algorithm='auto' falls back to without a switch") +
        " derives the job's id and key from the job name, world size and token: pass token=, a secret "
        "every rank of the job is given (e.g. secrets.token_hex(16), shared by your launcher); there is no "
        "default");
  return given;
}

// What JOIN adds to the job's name and size: an optimizer job's algorithm, parameters and keys, and
// the job's types=. Checks the optimizer's.
std::string join_keys(const Options& opt) {
  std::string extra;
  if (!opt.optimizer.empty()) {
    if (!valid_key(opt.optimizer))
      throw InvalidArgument("gradswitch: bad optimizer name '" + opt.optimizer + "'");
    if (opt.wire != "float32")
      throw InvalidArgument(
          "gradswitch: an optimizer job needs wire='float32' (the switch holds fp32 parameters), "
          "got wire '" +
          opt.wire + "'");
    if (opt.params < 1 || opt.params > 0xFFFFFFFFull)
      throw InvalidArgument(
          "gradswitch: an optimizer job needs params in 1..4294967295 (the number of fp32 "
          "parameters), got " +
          std::to_string(opt.params));
    extra = " optimizer=" + opt.optimizer + " params=" + std::to_string(opt.params);
    for (const auto& [k, v] : opt.optimizer_keys) {
      if (!valid_key(k) || k == "optimizer" || k == "params")
        throw InvalidArgument("gradswitch: bad optimizer key '" + k + "'");
      if (v.empty() || v.size() > 64 || v.find_first_of(" \t\r\n=") != std::string::npos)
        throw InvalidArgument("gradswitch: bad value '" + v + "' for optimizer key '" + k + "'");
      extra += " " + k + "=" + v;
    }
  } else if (!opt.optimizer_keys.empty() || opt.params != 0) {
    throw InvalidArgument("gradswitch: optimizer keys and params need an optimizer (Options::optimizer)");
  }
  if (!opt.types.empty()) extra += " " GS_KEY_TYPES "=" + opt.types;
  if (opt.deadline_us) {
    if (!opt.optimizer.empty())
      throw InvalidArgument(
          "gradswitch: deadline_us does not go with an optimizer job (a step needs every rank)");
    extra += " " GS_KEY_DEADLINE_US "=" + std::to_string(opt.deadline_us);
    if (opt.quorum) extra += " " GS_KEY_QUORUM "=" + std::to_string(opt.quorum);
  } else if (opt.quorum) {
    throw InvalidArgument(
        "gradswitch: quorum needs deadline_us (a round without a deadline waits for every rank)");
  }
  if ((opt.concede || opt.concede_keep >= 0) && !opt.deadline_us)
    throw InvalidArgument(
        "gradswitch: concede needs deadline_us (only a job with bounded-time rounds closes a round "
        "without a rank)");
  if (opt.concede_keep > 1.0 || opt.concede_keep != opt.concede_keep)
    throw InvalidArgument("gradswitch: concede_keep must be in [0, 1] (negative: the policy decides)");
  return extra;
}

// The control connections to the job's switches: none without a switch address, or (algorithm auto)
// when one cannot be reached, and why.
struct Switches {
  std::unique_ptr<ControlClient> control;  // the first switch's
  std::vector<SwitchLink> more;            // a sharded job's others
  std::string unreachable;                 // why the switch could not be reached (algorithm auto)
};

Switches reach_switches(const Options& opt) {
  Switches sw;
  if (opt.switch_addr.empty()) return sw;
  std::string host;
  uint16_t port = 0;
  split_host_port(switch_list(opt.switch_addr).front(), &host, &port);
  try {
    sw.control = std::make_unique<ControlClient>(host, port, opt.connect_timeout_s);
    sw.more = connect_more_switches(opt);
  } catch (const InvalidArgument&) {
    throw;
  } catch (const Error& e) {
    if (opt.algorithm != "auto") throw;
    sw.unreachable = e.what();
    sw.control.reset();
  }
  return sw;
}

// The data socket (GRADSWITCH_GSO / GRADSWITCH_GRO override the options' offloads).
std::unique_ptr<Transport> data_transport(const Options& opt, const Switches& sw,
                                          const std::vector<RingPeer>& given) {
  bool gso = opt.gso;
  if (const char* e = std::getenv("GRADSWITCH_GSO")) gso = std::string(e) == "1";
  bool gro = opt.gro;
  if (const char* e = std::getenv("GRADSWITCH_GRO")) gro = std::string(e) == "1";
  auto t = make_udp_transport(data_bind_address(opt, sw.control.get(), sw.more), opt.sockbuf_bytes, gso, gro,
                              given.empty() ? 0 : given[opt.rank].port);
  const char* stamp = std::getenv("GRADSWITCH_RX_TIMESTAMPS");
  t->stamp_arrivals(!stamp || std::string(stamp) != "0");
  return t;
}

// JOIN at every switch of the job (blocks until every rank joined each).
std::unique_ptr<Group> join_switches(const Options& opt, std::unique_ptr<Transport> transport, Switches sw,
                                     const std::vector<RingPeer>& given, const std::string& extra) {
  if (!opt.tenant.empty()) sw.control->authenticate(opt.tenant, opt.secret, opt.join_timeout_s);
  // With a switch the token only names the job at JOIN (its ids are the switch's random ones).
  const std::string token = opt.token.empty() ? std::string(kDefaultJoinToken) : opt.token;
  JoinInfo ji = sw.control->join(opt.job, opt.world, opt.rank, opt.wire, token, transport->local_port(),
                                 opt.join_timeout_s, extra);
  // Every rank joins its switches in the same order: each JOIN completes once all have made it.
  for (SwitchLink& l : sw.more) {
    l.join = l.control->join(opt.job, opt.world, opt.rank, opt.wire, token, transport->local_port(),
                             opt.join_timeout_s, extra);
    l.ipv4_be = l.control->peer_ipv4_be();
    ji.payload_bytes = std::min(ji.payload_bytes, l.join.payload_bytes);  // one chunking for all
  }
  const uint32_t ip = sw.control->peer_ipv4_be();
  return std::make_unique<Group>(opt, std::move(transport), std::move(sw.control), ji, ip, given,
                                 std::move(sw.more));
}

}  // namespace

std::unique_ptr<Group> Group::connect(const Options& requested) {
  const Options opt = with_window_env(requested);
  check_job(opt);
  check_paths(opt);
  std::vector<RingPeer> given = given_ring_peers(opt);
  const std::string extra = join_keys(opt);
  Timeline::for_rank(opt.rank);  // a timeline that cannot be written fails here, before the JOIN
  Switches sw = reach_switches(opt);
  auto transport = data_transport(opt, sw, given);
  if (sw.control) return join_switches(opt, std::move(transport), std::move(sw), given, extra);
  return join_ring(opt, std::move(transport), std::move(given), sw.unreachable);
}

std::unique_ptr<Group> Group::join_ring(const Options& opt, std::unique_ptr<Transport> transport,
                                        std::vector<RingPeer> given, const std::string& unreachable) {
  // No switch: the ring alone, on addresses the application gives.
  if (given.empty() && opt.exchange_peers)
    given = resolve_peers(opt.exchange_peers(transport->local_port()), opt.world);
  if (given.empty())
    throw Error(
        unreachable.empty()
            ? "gradswitch: the ring without a switch needs every rank's address: pass peers= (host:port "
              "per rank) or run under torch.distributed (the store exchanges them)"
            : unreachable +
                  " With algorithm='auto' the ring could take over, but it needs every rank's "
                  "address: pass peers= (host:port per rank) or use the torch backend.");
  JoinInfo ji;
  ring_identity(opt.job, opt.token, opt.world, &ji.job_id, &ji.key);
  ji.slots = static_cast<uint16_t>(opt.ring_slots);
  ji.payload_bytes = opt.ring_payload_bytes;
  auto g = std::make_unique<Group>(opt, std::move(transport), nullptr, ji, 0, given);
  if (!unreachable.empty()) {
    g->warn(unreachable + " algorithm='auto': rank " + std::to_string(opt.rank) +
            " runs its allreduces on the ring among the workers instead.");
    counter_add(g->counters_.fallbacks);
  }
  return g;
}

Group::Group(const Options& opt, std::unique_ptr<Transport> transport, std::unique_ptr<ControlClient> control,
             const JoinInfo& join, uint32_t switch_ipv4_be, std::vector<RingPeer> ring_peers,
             std::vector<SwitchLink> more_switches)
    : opt_(opt),
      transport_(std::move(transport)),
      control_(std::move(control)),
      join_(join),
      switch_ipv4_be_(switch_ipv4_be),
      more_switches_(std::move(more_switches)) {
  wire_ = parse_wire(opt_.wire);
  transport_->set_peer(switch_ipv4_be_);
  // RESULT, HELD and ABORT are taken only from the switches' data ports (docs/protocol.md §2.1): with
  // the job's id and key, anyone else could write into this rank's tensor.
  std::vector<SourceRange> switches;
  if (control_ || join_.data_port != 0)
    switches.push_back(SourceRange{switch_ipv4_be_, join_.data_port, std::max<uint16_t>(join_.threads, 1)});
  for (const SwitchLink& l : more_switches_)
    switches.push_back(SourceRange{l.ipv4_be, l.join.data_port, std::max<uint16_t>(l.join.threads, 1)});
  transport_->accept_from(switches, &counters_.dropped_foreign);
  std::vector<int> notices;  // notices end a wait at once
  if (control_) notices.push_back(control_->fd());
  for (SwitchLink& l : more_switches_) notices.push_back(l.control->fd());
  transport_->watch_fds(notices);
  ctx_.opt = &opt_;
  ctx_.join = &join_;
  ctx_.transport = transport_.get();
  ctx_.counters = &counters_;
  ctx_.cancel = &cancel_;
  ctx_.job_text = describe_job();
  timeline_ = Timeline::for_rank(opt_.rank);
  ring_cfg_.peers = ring_peers.empty() ? parse_join_peers(join_.peers, opt_.world) : std::move(ring_peers);
  ring_cfg_.job_id = join_.job_id;
  ring_cfg_.key = join_.key;
  ring_cfg_.slots = join_.slots;
  ring_cfg_.payload_bytes = join_.payload_bytes;
  choose_path();
  if (log_enabled(LogLevel::kInfo))
    log_line(LogLevel::kInfo, opt_.rank,
             describe_job() + " joined" +
                 (control_ ? " at " + opt_.switch_addr : std::string(" without a switch")) + ": wire " +
                 opt_.wire + ", " + std::to_string(join_.slots) + " slots of " +
                 std::to_string(join_.payload_bytes) + " B, " + std::to_string(join_.threads) +
                 " data thread(s), algorithm " + algorithm() +
                 (timeline_ ? ", timeline " + timeline_->path() : std::string()));
  thread_ = std::thread([this] { thread_main(); });
}

void Group::choose_path() {
  const bool has_switch = !more_switches_.empty() || control_ || join_.data_port != 0;
  if (has_switch && opt_.algorithm != "ring") {
    if (more_switches_.empty()) return use_path(std::make_unique<SwitchAllreduce>(ctx_, control_.get()));
    std::vector<SwitchRef> all = {SwitchRef{control_.get(), &join_, switch_ipv4_be_}};
    for (SwitchLink& l : more_switches_) all.push_back(SwitchRef{l.control.get(), &l.join, l.ipv4_be});
    return use_path(std::make_unique<ShardedAllreduce>(ctx_, all));
  }
  if (ring_cfg_.peers.empty())
    throw Error("gradswitch: " + describe_job() + " cannot run the ring: no peer addresses (the switch at " +
                opt_.switch_addr + " did not send peers=; pass peers= instead)");
  start_ring("");
}

void Group::use_path(std::unique_ptr<DataPath> p) {
  path_ = std::move(p);
  path_serves_idle_.store(path_->serves_when_idle());
  algorithm_.store(path_->name());
}

void Group::warn(const std::string& what) const {
  log_line(LogLevel::kWarn, opt_.rank, what);
}

void Group::start_ring(const std::string& why) {
  // The ring does not wait on the control connection: a switch that goes away (its connection
  // then stays readable) must not wake every wait of a ring that no longer needs it.
  transport_->watch_fd(-1);
  if (!why.empty()) {
    warn(why);
    counter_add(counters_.fallbacks);
    if (control_) control_->close();
    for (SwitchLink& l : more_switches_) l.control->close();
  }
  path_.reset();  // the switch's, if it ran
  // The ring's datagrams come only from its peers (§7); the switch has no say in it any more.
  std::vector<SourceRange> peers;
  for (unsigned r = 0; r < ring_cfg_.peers.size(); ++r)
    if (r != opt_.rank) peers.push_back(SourceRange{ring_cfg_.peers[r].ipv4_be, ring_cfg_.peers[r].port, 1});
  transport_->accept_from(peers, &counters_.dropped_foreign);
  use_path(std::make_unique<RingAllreduce>(ctx_, ring_cfg_));
}

Group::~Group() {
  try {
    close();
  } catch (...) {
  }
}

Handle Group::allreduce_async(const void* src, void* dst, size_t count, DType dtype, uint8_t wire) {
  if (wire != 0 && (gs_elem_size(wire) == 0 || (dtype == DType::kInt32) != (wire == GS_ELEM_INT32)))
    throw InvalidArgument("gradswitch: wire " + std::string(gs_elem_name(wire)) + " (" +
                          std::to_string(wire) + ") cannot carry a" +
                          (dtype == DType::kInt32 ? "n int32" : " float") + " tensor");
  if (wire != 0 && control_ && !(job_types(opt_) >> wire & 1))
    throw InvalidArgument("gradswitch: wire " + std::string(gs_elem_name(wire)) +
                          " is not one of the job's (" + opt_.wire + ", int32" +
                          (opt_.types.empty() ? "" : ", " + opt_.types) +
                          "): the switch drops other types; list it in Options::types (JOIN types=)");
  Op op{dst, count, dtype, nullptr, nullptr};
  op.src = src;
  op.wire = wire;
  return enqueue(std::move(op));
}

Handle Group::allreduce_async(void* data, size_t count, float* unsummed) {
  if (unsummed && !opt_.deadline_us)
    throw InvalidArgument(
        "gradswitch: unsummed needs deadline_us (only a job with bounded-time rounds sums without a "
        "rank's contribution)");
  Op op{data, count, DType::kFloat32, nullptr, nullptr};
  op.src = data;
  op.unsummed = unsummed;
  return enqueue(std::move(op));
}

Handle Group::enqueue(Op op) {
  auto st = std::make_shared<Handle::State>();
  op.state = st;
  if (timeline_ || log_enabled(LogLevel::kDebug)) op.queued_ns = timeline_now_ns();
  {
    std::lock_guard<std::mutex> lk(qmu_);
    if (stopping_) throw Error("gradswitch: the group of job '" + opt_.job + "' is closed");
    queue_.push_back(std::move(op));
    if (path_serves_idle_.load()) transport_->wake();  // the thread may be serving the path
  }
  qcv_.notify_one();
  return Handle(st);
}

void Group::close(bool abort) {
  std::lock_guard<std::mutex> cl(close_mu_);
  if (closed_.load()) return;
  {
    std::lock_guard<std::mutex> lk(qmu_);
    stopping_ = true;
  }
  if (abort) cancel_.store(true);
  qcv_.notify_all();
  transport_->wake();
  if (thread_.joinable()) thread_.join();
  std::vector<ControlClient*> controls = {control_.get()};
  for (SwitchLink& l : more_switches_) controls.push_back(l.control.get());
  const std::string lost = lost_switch();
  for (ControlClient* c : controls) {
    if (!c || !c->is_open() || (!lost.empty() && c->endpoint() == lost)) continue;
    if (!abort) {
      try {
        // A sharded job's other switches learn which switch made this rank leave: the aborts they
        // send the other ranks then name it (docs/protocol.md §1.2, LEAVE).
        c->request(
            lost.empty() ? std::string(GS_VERB_LEAVE) : std::string(GS_VERB_LEAVE " " GS_KEY_LOST "=") + lost,
            5.0);
      } catch (...) {
      }
    }
    c->close();  // without LEAVE: the switch aborts the job (rank left)
  }
  {
    // The UDP port is free again at once (a ring of fixed ports may be set up anew right away).
    std::lock_guard<std::mutex> lk(qmu_);
    transport_.reset();
  }
  if (timeline_) timeline_->flush();
  if (log_enabled(LogLevel::kInfo)) {
    const Stats st = counters_.snapshot();
    log_line(LogLevel::kInfo, opt_.rank,
             describe_job() + (abort ? " closed without LEAVE (abort)" : " left") + " after " +
                 std::to_string(st.allreduces) + " allreduce(s), " + std::to_string(st.packets_sent) +
                 " packets sent, " + std::to_string(st.retransmissions) + " retransmission(s)");
  }
  closed_.store(true);
}

std::string Group::lost_switch() const {
  if (!fatal_ || more_switches_.empty()) return {};
  try {
    std::rethrow_exception(fatal_);
  } catch (const SwitchLostError& e) {
    return e.lost();
  } catch (...) {
  }
  return {};
}

Stats Group::stats() const {
  return counters_.snapshot();
}

std::string Group::describe_job() const {
  return "job '" + opt_.job + "' (job_id " + std::to_string(join_.job_id) + ", rank " +
         std::to_string(opt_.rank) + " of " + std::to_string(opt_.world) + ")";
}

}  // namespace gradswitch::worker
