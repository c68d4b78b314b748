// The worker's streaming allreduce (see group.h and docs/protocol.md, worker algorithm).
#include "worker/group.h"

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>

#include "common/fixed_point.h"
#include "common/kernels.h"
#include "gradswitch/wire.h"

namespace gradswitch::worker {

namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

void bump(std::atomic<uint64_t>& a, uint64_t n = 1) {
  a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' || c == '-')) return false;
  return true;
}

bool valid_key(const std::string& s) {
  if (s.empty() || s.size() > 32) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

std::string fmt_s(double s) {
  std::ostringstream o;
  o.precision(3);
  o << s;
  return o.str();
}

std::string join_ranks(const std::vector<unsigned>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

std::vector<long long> parse_list(const std::string& s) {
  std::vector<long long> out;
  std::stringstream in(s);
  std::string tok;
  while (std::getline(in, tok, ','))
    if (!tok.empty()) {
      try {
        out.push_back(std::stoll(tok));
      } catch (...) {
      }
    }
  return out;
}

}  // namespace

std::string abort_reason_text(uint8_t reason, uint16_t rank) {
  switch (reason) {
    case GS_ABORT_RANK_LEFT:
      return "rank " + std::to_string(rank) +
             " left the job (its control connection closed: did that process exit or crash?)";
    case GS_ABORT_IDLE:
      return "the job was idle past the switch's idle timeout";
    case GS_ABORT_SHUTDOWN:
      return "the switch is shutting down";
    case GS_ABORT_OPERATOR:
      return "the job was ended through the switch's control plane";
    default:
      return "abort reason " + std::to_string(reason) +
             (rank == GS_RANK_ALL ? std::string() : " (rank " + std::to_string(rank) + ")");
  }
}

uint8_t parse_wire(const std::string& name) {
  if (name == "int32") return GS_ELEM_INT32;
  if (name == "float32") return GS_ELEM_FLOAT32;
  if (name == "fixed32") return GS_ELEM_FIXED32;
  if (name == "float16") return GS_ELEM_FLOAT16;
  if (name == "bfloat16") return GS_ELEM_BFLOAT16;
  throw InvalidArgument("gradswitch: unknown wire '" + name + "' (expected float32, fixed32, float16, bfloat16 or int32)");
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

// ---------------------------------------------------------------- Group: setup, queue

std::unique_ptr<Group> Group::connect(const Options& opt) {
  parse_wire(opt.wire);
  if (opt.world < 1 || opt.world > GS_MAX_WORLD)
    throw InvalidArgument("gradswitch: world_size must be in 1.." + std::to_string(GS_MAX_WORLD) + ", got " +
                          std::to_string(opt.world));
  if (opt.rank >= opt.world)
    throw InvalidArgument("gradswitch: rank must be in 0..world_size-1, got rank " + std::to_string(opt.rank) +
                          " with world_size " + std::to_string(opt.world));
  if (!valid_name(opt.job))
    throw InvalidArgument("gradswitch: job name '" + opt.job + "' must be 1..64 characters of [A-Za-z0-9._:-]");
  if (!valid_name(opt.token))
    throw InvalidArgument("gradswitch: token must be 1..64 characters of [A-Za-z0-9._:-]");
  if (!(opt.drop_rate >= 0.0 && opt.drop_rate < 1.0))
    throw InvalidArgument("gradswitch: drop_rate must be in [0, 1)");
  if (!(opt.timeout_s > 0.0)) throw InvalidArgument("gradswitch: timeout must be > 0");
  std::string host;
  uint16_t port = 0;
  split_host_port(opt.switch_addr, &host, &port);
  auto control = std::make_unique<ControlClient>(host, port, opt.connect_timeout_s);
  bool gso = opt.gso;
  if (const char* e = std::getenv("GRADSWITCH_GSO")) gso = std::string(e) == "1";
  bool gro = opt.gro;
  if (const char* e = std::getenv("GRADSWITCH_GRO")) gro = std::string(e) == "1";
  std::string extra;
  if (!opt.optimizer.empty()) {
    if (!valid_key(opt.optimizer))
      throw InvalidArgument("gradswitch: bad optimizer name '" + opt.optimizer + "'");
    if (opt.wire != "float32")
      throw InvalidArgument("gradswitch: an optimizer job needs wire='float32' (the switch holds fp32 parameters), "
                            "got wire '" + opt.wire + "'");
    if (opt.params < 1 || opt.params > 0xFFFFFFFFull)
      throw InvalidArgument("gradswitch: an optimizer job needs params in 1..4294967295 (the number of fp32 "
                            "parameters), got " + std::to_string(opt.params));
    extra = " optimizer=" + opt.optimizer + " params=" + std::to_string(opt.params);
    for (const auto& [k, v] : opt.optimizer_keys) {
      if (!valid_key(k) || k == "optimizer" || k == "params")
        throw InvalidArgument("gradswitch: bad optimizer key '" + k + "'");
      if (v.empty() || v.size() > 64 ||
          v.find_first_of(" \t\r\n=") != std::string::npos)
        throw InvalidArgument("gradswitch: bad value '" + v + "' for optimizer key '" + k + "'");
      extra += " " + k + "=" + v;
    }
  } else if (!opt.optimizer_keys.empty() || opt.params != 0) {
    throw InvalidArgument("gradswitch: optimizer keys and params need an optimizer (Options::optimizer)");
  }
  auto transport = make_udp_transport(opt.bind_ip, opt.sockbuf_bytes, gso, gro);
  JoinInfo ji = control->join(opt.job, opt.world, opt.rank, opt.wire, opt.token, transport->local_port(),
                              opt.join_timeout_s, extra);
  uint32_t ip = control->peer_ipv4_be();
  return std::make_unique<Group>(opt, std::move(transport), std::move(control), ji, ip);
}

Group::Group(const Options& opt, std::unique_ptr<Transport> transport, std::unique_ptr<ControlClient> control,
             const JoinInfo& join, uint32_t switch_ipv4_be)
    : opt_(opt), transport_(std::move(transport)), control_(std::move(control)), join_(join),
      switch_ipv4_be_(switch_ipv4_be) {
  wire_ = parse_wire(opt_.wire);
  transport_->set_peer(switch_ipv4_be_);
  version_.assign(join_.slots, 0);
  rng_state_ = opt_.seed * 0x9E3779B97F4A7C15ull + opt_.rank + 1;
  pkt_cap_ = (GS_HEADER_BYTES + join_.payload_bytes + 63) & ~size_t{63};
  slot_mem_.assign(pkt_cap_ * join_.slots, 0);
  thread_ = std::thread([this] { thread_main(); });
}

Group::~Group() {
  try {
    close();
  } catch (...) {
  }
}

Handle Group::allreduce_async(void* data, size_t count, DType dtype) {
  return enqueue(Op{data, count, dtype, nullptr, nullptr});
}

Handle Group::enqueue(Op op) {
  auto st = std::make_shared<Handle::State>();
  op.state = st;
  {
    std::lock_guard<std::mutex> lk(qmu_);
    if (stopping_) throw Error("gradswitch: the group of job '" + opt_.job + "' is closed");
    queue_.push_back(std::move(op));
  }
  qcv_.notify_one();
  return Handle(st);
}

// ---------------------------------------------------------------- optimizer jobs

void Group::require_optimizer(const char* what) const {
  if (join_.optimizer.empty())
    throw InvalidArgument(std::string("gradswitch: ") + what + " needs an optimizer job, but " + describe_job() +
                          " was joined without optimizer=");
}

double Group::control_timeout(size_t bytes) const {
  // The request's own timeout plus the time to move the payload at a pessimistic 50 MB/s.
  return std::max(opt_.timeout_s, 10.0) + static_cast<double>(bytes) / 50e6;
}

namespace {
[[noreturn]] void throw_reply(const std::string& what, const std::string& job, const Reply& r) {
  std::string msg = "gradswitch: " + what + " of " + job + " refused by the switch: " + r.code + ": " + r.message;
  if (r.code == "bad_request" || r.code == "conflict") throw InvalidArgument(msg);
  throw Error(msg);
}
}  // namespace

Handle Group::upload_params_async(const float* data, size_t n) {
  require_optimizer("upload_params");
  if (opt_.rank != 0)
    throw InvalidArgument("gradswitch: upload_params is for rank 0 only (this is rank " + std::to_string(opt_.rank) +
                          "): the switch takes the initial parameters from rank 0");
  if (n != join_.params)
    throw InvalidArgument("gradswitch: upload_params got " + std::to_string(n) + " values, but " + describe_job() +
                          " has params=" + std::to_string(join_.params));
  Op op{nullptr, 0, DType::kFloat32, nullptr, nullptr};
  op.fn = [this, data, n] {
    if (fatal_) std::rethrow_exception(fatal_);
    if (seq_ != 0)
      throw InvalidArgument("gradswitch: upload_params must come before the first allreduce of " + describe_job() +
                            " (the switch may already have applied steps); use state_set to replace the "
                            "parameters and state later");
    // Little-endian float32 is the in-memory layout on every supported host (x86-64, aarch64).
    size_t bytes = n * sizeof(float);
    Reply r = parse_reply(control_->request_with_payload(
        "PARAMS offset=0 count=" + std::to_string(n), data, bytes, control_timeout(bytes)));
    if (!r.ok) throw_reply("PARAMS", describe_job(), r);
  };
  if (!control_) throw Error("gradswitch: upload_params needs a control connection");
  return enqueue(std::move(op));
}

float Group::set_lr(float lr) {
  require_optimizer("set_lr");
  if (!std::isfinite(lr) || lr < 0)
    throw InvalidArgument("gradswitch: set_lr needs a finite lr >= 0, got " + std::to_string(lr));
  if (!control_) throw Error("gradswitch: set_lr needs a control connection");
  auto stored = std::make_shared<float>(lr);
  Op op{nullptr, 0, DType::kFloat32, nullptr, nullptr};
  op.fn = [this, lr, stored] {
    if (fatal_) std::rethrow_exception(fatal_);
    Reply r = parse_reply(control_->request("SETLR lr=" + format_float32(lr), control_timeout(0)));
    if (!r.ok) throw_reply("SETLR", describe_job(), r);
    std::string v = r.get("lr");
    if (!v.empty()) *stored = std::strtof(v.c_str(), nullptr);
  };
  enqueue(std::move(op)).wait();
  return *stored;
}

std::vector<uint8_t> Group::state_get() {
  require_optimizer("state_get");
  if (!control_) throw Error("gradswitch: state_get needs a control connection");
  auto out = std::make_shared<std::vector<uint8_t>>();
  Op op{nullptr, 0, DType::kFloat32, nullptr, nullptr};
  op.fn = [this, out] {
    // Allowed after a failed allreduce or an abort (e.g. to save what the switch holds).
    Reply r = parse_reply(control_->request_read_payload("STATE_GET", "bytes", out.get(),
                                                         control_timeout(join_.state_bytes)));
    if (!r.ok) throw_reply("STATE_GET", describe_job(), r);
    if (out->size() != join_.state_bytes)
      throw Error("gradswitch: STATE_GET of " + describe_job() + " returned " + std::to_string(out->size()) +
                  " bytes, expected state_bytes=" + std::to_string(join_.state_bytes));
  };
  enqueue(std::move(op)).wait();
  return std::move(*out);
}

void Group::state_set(const uint8_t* data, size_t n) {
  require_optimizer("state_set");
  if (opt_.rank != 0)
    throw InvalidArgument("gradswitch: state_set is for rank 0 only (this is rank " + std::to_string(opt_.rank) + ")");
  if (n != join_.state_bytes)
    throw InvalidArgument("gradswitch: state_set got a blob of " + std::to_string(n) + " bytes, but " +
                          describe_job() + " has state_bytes=" + std::to_string(join_.state_bytes) +
                          " (a checkpoint of a job with the same optimizer, params and --mtu is needed)");
  if (n < 8 || std::memcmp(data, "GSOPTST1", 8) != 0)
    throw InvalidArgument("gradswitch: state_set: not a gradswitch optimizer checkpoint (magic GSOPTST1 missing)");
  if (!control_) throw Error("gradswitch: state_set needs a control connection");
  Op op{nullptr, 0, DType::kFloat32, nullptr, nullptr};
  op.fn = [this, data, n] {
    if (fatal_) std::rethrow_exception(fatal_);
    Reply r = parse_reply(
        control_->request_with_payload("STATE_SET bytes=" + std::to_string(n), data, n, control_timeout(n)));
    if (!r.ok) throw_reply("STATE_SET", describe_job(), r);
  };
  enqueue(std::move(op)).wait();
}

void Group::thread_main() {
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lk(qmu_);
      qcv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr err;
    try {
      if (op.fn) op.fn();
      else run_allreduce(op.data, op.count, op.dtype);
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(op.state->mu);
      op.state->error = err;
      op.state->done = true;
    }
    op.state->cv.notify_all();
  }
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
  if (thread_.joinable()) thread_.join();
  if (control_ && control_->is_open()) {
    if (!abort) {
      try {
        control_->request("LEAVE", 5.0);
      } catch (...) {
      }
    }
    control_->close();  // without LEAVE: the switch aborts the job (rank left)
  }
  closed_.store(true);
}

Stats Group::stats() const {
  Stats s;
  auto r = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  s.allreduces = r(stats_.allreduces);
  s.packets_sent = r(stats_.packets_sent);
  s.bytes_sent = r(stats_.bytes_sent);
  s.packets_received = r(stats_.packets_received);
  s.bytes_received = r(stats_.bytes_received);
  s.retransmissions = r(stats_.retransmissions);
  s.injected_drops = r(stats_.injected_drops);
  s.ignored = r(stats_.ignored);
  s.unicast_results = r(stats_.unicast_results);
  s.bootstrap_rounds = r(stats_.bootstrap_rounds);
  return s;
}

std::string Group::describe_job() const {
  return "job '" + opt_.job + "' (job_id " + std::to_string(join_.job_id) + ", rank " + std::to_string(opt_.rank) +
         " of " + std::to_string(opt_.world) + ")";
}

// ---------------------------------------------------------------- the streaming allreduce

struct Group::Run {
  struct Slot {
    bool busy = false;
    bool bootstrap = false;  // fixed32 exponent round (count 0) preceding `chunk`
    uint8_t version = 0;
    int8_t scale = GS_EXP_NONE;  // fixed32: S the chunk in flight was quantised with
    uint16_t count = 0;
    uint32_t offset = 0;
    size_t chunk = 0;
    uint32_t len = 0;
    uint32_t tries = 0;
    int64_t sent_ns = 0, deadline_ns = 0, rto_ns = 0;
    int64_t last_tx_ns = 0;  // latest (re)transmission, for loss detection
    uint8_t* pkt = nullptr;
  };
  uint8_t* base = nullptr;
  size_t count = 0;
  uint8_t elem = 0;
  size_t es = 0;
  uint32_t per = 0;
  size_t nchunks = 0;
  unsigned W = 0;
  uint32_t seq = 0;
  bool fixed = false;
  std::vector<Slot> slots;
  std::vector<OutPacket> out;
  unsigned outstanding = 0;
  int64_t last_progress_ns = 0;
  // Send time of the most recently sent round whose result has arrived (RACK, RFC 8985): a busy
  // slot transmitted before it is probably lost, since results come back in about send order.
  int64_t newest_delivered_tx_ns = 0;
};

void Group::run_allreduce(void* data, size_t count, DType dtype) {
  if (fatal_) std::rethrow_exception(fatal_);
  if (cancel_.load(std::memory_order_relaxed))
    throw Error("gradswitch: allreduce cancelled: the group of " + describe_job() + " was closed");
  const Kernels& K = kernels();
  Run run;
  run.base = static_cast<uint8_t*>(data);
  run.count = count;
  run.elem = dtype == DType::kInt32 ? static_cast<uint8_t>(GS_ELEM_INT32) : wire_;
  if (dtype == DType::kFloat32 && wire_ == GS_ELEM_INT32)
    throw InvalidArgument("gradswitch: " + describe_job() +
                          " uses wire int32, which carries only int32 tensors; connect with wire='float32', "
                          "'fixed32', 'float16' or 'bfloat16' to reduce float32 tensors");
  if (!join_.optimizer.empty() && (dtype != DType::kFloat32 || count != join_.params))
    throw InvalidArgument("gradswitch: " + describe_job() + " is an optimizer job (" + join_.optimizer +
                          "): an allreduce takes the float32 gradient of exactly params=" +
                          std::to_string(join_.params) + " elements, got " + std::to_string(count) +
                          (dtype == DType::kInt32 ? " int32" : " float32") + " elements");
  if (count == 0) return;  // nothing to do; consumes no sequence number (every rank does the same)
  if (count > 0xFFFFFFFFull)
    throw InvalidArgument("gradswitch: an allreduce holds at most 2^32-1 elements (offsets are 32-bit), got " +
                          std::to_string(count));
  run.es = gs_elem_size(run.elem);
  run.per = static_cast<uint32_t>(std::min<size_t>(join_.payload_bytes / run.es, 0xFFFF));
  run.nchunks = (count + run.per - 1) / run.per;
  run.W = static_cast<unsigned>(std::min<size_t>(join_.slots, run.nchunks));
  run.fixed = run.elem == GS_ELEM_FIXED32;

  // fixed32: every chunk's block exponent, and the range check, before anything is sent.
  const float* fsrc = reinterpret_cast<const float*>(data);
  if (run.fixed) {
    exps_.resize(run.nchunks);
    for (size_t c = 0; c < run.nchunks; ++c) {
      size_t off = c * run.per, n = std::min<size_t>(run.per, count - off);
      float m = K.max_abs(fsrc + off, n);
      if (!(m < 0x1p127f)) {
        size_t bad = off;
        for (size_t i = off; i < off + n; ++i)
          if (!(std::fabs(fsrc[i]) < 0x1p127f)) {
            bad = i;
            break;
          }
        throw InvalidArgument("gradswitch: wire fixed32 cannot carry element " + std::to_string(bad) + " = " +
                              std::to_string(fsrc[bad]) +
                              ": values must be finite with magnitude below 2^127. Nothing was sent for this "
                              "allreduce; the other ranks fail the same way only if their tensors hold such values "
                              "too (otherwise they time out). Use wire='float32' to reduce non-finite values.");
      }
      exps_[c] = block_exponent(m);
    }
  }

  run.seq = seq_++;
  bump(stats_.allreduces);
  const uint32_t seq = run.seq;
  const unsigned world = opt_.world;

  run.slots.resize(run.W);
  for (unsigned s = 0; s < run.W; ++s) run.slots[s].pkt = slot_mem_.data() + pkt_cap_ * s;
  run.out.reserve(run.W + 64);

  const int64_t rto_min = static_cast<int64_t>(opt_.rto_initial_s * 1e9);
  const int64_t rto_max = std::max<int64_t>(static_cast<int64_t>(opt_.rto_max_s * 1e9), rto_min);
  const int64_t timeout_ns = static_cast<int64_t>(opt_.timeout_s * 1e9);
  auto initial_rto = [&]() -> int64_t {
    if (srtt_ns_ <= 0) return rto_min;
    int64_t r = static_cast<int64_t>(srtt_ns_ + 4 * rttvar_ns_);
    return std::clamp(r, rto_min, rto_max);
  };

  auto header = [&](Run::Slot& st, unsigned slot, uint8_t elem, uint16_t n, uint32_t offset, int8_t next_exp,
                    int8_t scale_exp) {
    gs_header h{};
    h.magic = GS_MAGIC;
    h.version = GS_VERSION;
    h.type = GS_MSG_DATA;
    h.job_id = join_.job_id;
    h.key = join_.key;
    h.rank = static_cast<uint16_t>(opt_.rank);
    h.slot = static_cast<uint16_t>(slot);
    h.flags = st.version;
    h.elem_type = elem;
    h.count = n;
    h.seq = seq;
    h.offset = offset;
    h.next_exp = next_exp;
    h.scale_exp = scale_exp;
    gs_header_encode(&h, st.pkt);
  };

  // Claims the slot's next version for a new round and queues its packet.
  auto launch = [&](Run::Slot& st, unsigned slot, int64_t now) {
    st.busy = true;
    st.tries = 0;
    st.sent_ns = now;
    st.last_tx_ns = now;
    st.rto_ns = initial_rto();
    st.deadline_ns = now + st.rto_ns;
    if (opt_.drop_rate > 0 &&
        static_cast<double>(splitmix64(rng_state_) >> 11) * 0x1p-53 < opt_.drop_rate) {
      bump(stats_.injected_drops);
      return;
    }
    run.out.push_back(OutPacket{st.pkt, st.len, static_cast<uint16_t>(join_.data_port + slot % join_.threads)});
  };

  auto prepare_bootstrap = [&](Run::Slot& st, unsigned slot) {
    st.bootstrap = true;
    st.chunk = slot;
    st.offset = static_cast<uint32_t>(slot * run.per);
    st.count = 0;
    st.scale = GS_EXP_NONE;
    st.version = version_[slot];
    version_[slot] ^= 1;
    header(st, slot, GS_ELEM_FIXED32, 0, st.offset, exps_[slot], GS_EXP_NONE);
    st.len = GS_HEADER_BYTES;
    bump(stats_.bootstrap_rounds);
  };

  // Builds chunk `c` into the slot's packet; for fixed32, `agreed_exp` is the chunk's agreed block exponent.
  auto prepare_chunk = [&](Run::Slot& st, unsigned slot, size_t c, int8_t agreed_exp) {
    st.bootstrap = false;
    st.chunk = c;
    size_t off = c * run.per;
    size_t n = std::min<size_t>(run.per, count - off);
    st.offset = static_cast<uint32_t>(off);
    st.count = static_cast<uint16_t>(n);
    st.version = version_[slot];
    version_[slot] ^= 1;
    uint8_t* payload = st.pkt + GS_HEADER_BYTES;
    int8_t next_exp = GS_EXP_NONE, scale_exp = GS_EXP_NONE;
    switch (run.elem) {
      case GS_ELEM_INT32:
      case GS_ELEM_FLOAT32:
        std::memcpy(payload, run.base + off * 4, n * 4);
        break;
      case GS_ELEM_FLOAT16:
        K.f32_to_f16(reinterpret_cast<uint16_t*>(payload), fsrc + off, n);
        break;
      case GS_ELEM_BFLOAT16:
        K.f32_to_bf16(reinterpret_cast<uint16_t*>(payload), fsrc + off, n);
        break;
      case GS_ELEM_FIXED32: {
        int s = scale_exponent(agreed_exp, world);
        st.scale = static_cast<int8_t>(s);
        scale_exp = st.scale;
        next_exp = c + run.W < run.nchunks ? exps_[c + run.W] : static_cast<int8_t>(GS_EXP_NONE);
        K.quantize(reinterpret_cast<int32_t*>(payload), fsrc + off, n, std::ldexp(1.0f, s));
        break;
      }
    }
    header(st, slot, run.elem, st.count, st.offset, next_exp, scale_exp);
    st.len = static_cast<uint32_t>(GS_HEADER_BYTES + n * run.es);
  };

  auto flush = [&]() {
    if (run.out.empty()) return;
    size_t n = run.out.size();
    uint64_t bytes = 0;
    for (auto& p : run.out) bytes += p.len;
    transport_->send_batch(run.out.data(), n);
    bump(stats_.packets_sent, n);
    bump(stats_.bytes_sent, bytes);
    run.out.clear();
  };

  try {
    // The first window, optionally in a permuted order (test hook).
    std::vector<unsigned> order(run.W);
    for (unsigned s = 0; s < run.W; ++s) order[s] = s;
    if (opt_.shuffle_seed != 0) {
      std::mt19937_64 g(opt_.shuffle_seed * 0x9E3779B97F4A7C15ull + seq);
      std::shuffle(order.begin(), order.end(), g);
    }
    int64_t now = now_ns();
    for (unsigned s : order) {
      Run::Slot& st = run.slots[s];
      if (run.fixed) prepare_bootstrap(st, s);
      else prepare_chunk(st, s, s, GS_EXP_NONE);
      launch(st, s, now);
    }
    run.outstanding = run.W;
    run.last_progress_ns = now;
    flush();

    std::vector<InPacket> in(1024);

    // Receive first and judge timers only once the socket is drained (or every rto_min while
    // results keep streaming): a worker that was descheduled for a while finds its results
    // queued, not lost, and must not retransmit the whole window.
    int64_t wait_ns = 0;
    int64_t last_timer_check = now;
    while (run.outstanding > 0) {
      if (cancel_.load(std::memory_order_relaxed))
        throw Error("gradswitch: allreduce seq " + std::to_string(seq) + " cancelled: the group of " +
                    describe_job() + " was closed");
      size_t got = transport_->recv_batch(in.data(), in.size(), wait_ns);
      now = now_ns();
      uint64_t rbytes = 0;
      for (size_t i = 0; i < got; ++i) {
        const uint8_t* p = in[i].data;
        uint32_t len = in[i].len;
        rbytes += len;
        if (len < GS_HEADER_BYTES) {
          bump(stats_.ignored);
          continue;
        }
        gs_header h;
        gs_header_decode(p, &h);
        if (h.magic != GS_MAGIC || h.version != GS_VERSION || h.job_id != join_.job_id || h.key != join_.key) {
          bump(stats_.ignored);
          continue;
        }
        if (h.type == GS_MSG_ABORT) {
          uint8_t reason = static_cast<uint8_t>(h.next_exp);
          throw AbortedError("gradswitch: " + describe_job() + " was aborted by the switch during allreduce seq " +
                                 std::to_string(seq) + ": " + abort_reason_text(reason, h.rank),
                             reason, h.rank);
        }
        if (h.type != GS_MSG_RESULT || (h.rank != GS_RANK_ALL && h.rank != opt_.rank) || h.slot >= run.W) {
          bump(stats_.ignored);
          continue;
        }
        Run::Slot& st = run.slots[h.slot];
        if (!st.busy || (h.flags & GS_FLAG_VERSION) != st.version || h.seq != seq || h.offset != st.offset ||
            h.count != st.count || (!st.bootstrap && h.elem_type != run.elem) ||
            len < GS_HEADER_BYTES + static_cast<size_t>(h.count) * run.es ||
            (run.fixed && !st.bootstrap && h.scale_exp != st.scale)) {
          bump(stats_.ignored);
          continue;
        }
        if (h.flags & GS_FLAG_UNICAST) bump(stats_.unicast_results);
        // Progress: RTT sample (Karn: only rounds never retransmitted).
        if (st.tries == 0) {
          double sample = static_cast<double>(now - st.sent_ns);
          if (srtt_ns_ <= 0) {
            srtt_ns_ = sample;
            rttvar_ns_ = sample / 2;
          } else {
            rttvar_ns_ = 0.75 * rttvar_ns_ + 0.25 * std::fabs(srtt_ns_ - sample);
            srtt_ns_ = 0.875 * srtt_ns_ + 0.125 * sample;
          }
        }
        run.last_progress_ns = now;
        run.newest_delivered_tx_ns = std::max(run.newest_delivered_tx_ns, st.last_tx_ns);
        st.busy = false;
        const uint8_t* payload = p + GS_HEADER_BYTES;
        size_t next_chunk;
        if (st.bootstrap) {
          next_chunk = st.chunk;  // the exponent round's result carries the agreed exponent of this chunk
        } else {
          size_t off = st.offset, n = st.count;
          switch (run.elem) {
            case GS_ELEM_INT32:
            case GS_ELEM_FLOAT32:
              std::memcpy(run.base + off * 4, payload, n * 4);
              break;
            case GS_ELEM_FLOAT16:
              K.f16_to_f32(reinterpret_cast<float*>(run.base) + off, reinterpret_cast<const uint16_t*>(payload), n);
              break;
            case GS_ELEM_BFLOAT16:
              K.bf16_to_f32(reinterpret_cast<float*>(run.base) + off, reinterpret_cast<const uint16_t*>(payload),
                            n);
              break;
            case GS_ELEM_FIXED32:
              K.dequantize(reinterpret_cast<float*>(run.base) + off, reinterpret_cast<const int32_t*>(payload), n,
                           std::ldexp(1.0f, -st.scale));
              break;
          }
          next_chunk = st.chunk + run.W;
        }
        if (next_chunk < run.nchunks) {
          prepare_chunk(st, h.slot, next_chunk, h.next_exp);
          launch(st, h.slot, now);
        } else {
          run.outstanding--;
        }
      }
      bump(stats_.packets_received, got);
      bump(stats_.bytes_received, rbytes);
      flush();
      if (run.outstanding == 0) break;
      if (transport_->more_pending() && now - last_timer_check < rto_min) {
        wait_ns = 0;  // more datagrams are probably queued
        continue;
      }
      last_timer_check = now;
      // Loss detection. A round is resent when a round sent after it has completed (it was
      // overtaken: probably lost), or, when its timer expires with nothing sent after it having
      // completed, only if it is the oldest such round: a single probe. Without that rule a rank
      // that is merely slow (descheduled on a busy host) makes every other rank resend its whole
      // window at each backoff step; with it they send one probe per step, and real losses are
      // still repaired within about one round-trip once results flow again.
      const int64_t reorder_ns = std::max<int64_t>(static_cast<int64_t>(srtt_ns_ / 4), 500'000);
      int64_t next_deadline = run.last_progress_ns + timeout_ns;
      int probe = -1;
      auto resend = [&](unsigned s) {
        Run::Slot& st = run.slots[s];
        st.pkt[16] |= GS_FLAG_RETX;
        st.tries++;
        st.last_tx_ns = now;
        st.rto_ns = std::min(st.rto_ns * 2, rto_max);
        st.deadline_ns = now + st.rto_ns;
        bump(stats_.retransmissions);
        if (opt_.drop_rate > 0 && static_cast<double>(splitmix64(rng_state_) >> 11) * 0x1p-53 < opt_.drop_rate) {
          bump(stats_.injected_drops);
        } else {
          run.out.push_back(OutPacket{st.pkt, st.len, static_cast<uint16_t>(join_.data_port + s % join_.threads)});
        }
      };
      for (unsigned s = 0; s < run.W; ++s) {
        Run::Slot& st = run.slots[s];
        if (!st.busy) continue;
        const bool overtaken = st.last_tx_ns + reorder_ns < run.newest_delivered_tx_ns &&
                               now - st.last_tx_ns >= static_cast<int64_t>(srtt_ns_) + reorder_ns;
        if (overtaken || (st.deadline_ns <= now && st.last_tx_ns < run.newest_delivered_tx_ns)) {
          resend(s);
        } else if (st.deadline_ns <= now) {
          if (probe < 0 || st.last_tx_ns < run.slots[probe].last_tx_ns) probe = static_cast<int>(s);
        }
      }
      if (probe >= 0) resend(static_cast<unsigned>(probe));
      for (unsigned s = 0; s < run.W; ++s) {
        Run::Slot& st = run.slots[s];
        if (!st.busy) continue;
        if (st.deadline_ns <= now) {  // due but not the probe: back off without sending
          st.rto_ns = std::min(st.rto_ns * 2, rto_max);
          st.deadline_ns = now + st.rto_ns;
        }
        next_deadline = std::min(next_deadline, st.deadline_ns);
      }
      flush();
      if (now - run.last_progress_ns >= timeout_ns) fail_timeout(run);
      wait_ns = std::max<int64_t>(next_deadline - now, 0);
    }
  } catch (...) {
    fatal_ = std::current_exception();
    throw;
  }
}

void Group::fail_timeout(Run& run) {
  // The stuck round: the outstanding slot with the lowest chunk.
  unsigned slot = 0;
  size_t best = SIZE_MAX;
  for (unsigned s = 0; s < run.W; ++s)
    if (run.slots[s].busy && run.slots[s].chunk < best) {
      best = run.slots[s].chunk;
      slot = s;
    }
  const Run::Slot& st = run.slots[slot];
  std::string where = "slot " + std::to_string(slot) + " version " + std::to_string(st.version) +
                      (st.bootstrap ? " (fixed32 exponent round for elements starting at "
                                    : " (elements starting at ") +
                      std::to_string(st.offset) + ")";
  std::string endpoint = control_ ? control_->endpoint() : std::string("(no control connection)");
  std::string ports = "UDP data ports " + std::to_string(join_.data_port) +
                      (join_.threads > 1 ? "-" + std::to_string(join_.data_port + join_.threads - 1) : "");
  std::string head = "gradswitch: allreduce timed out: " + describe_job() + ", allreduce seq " +
                     std::to_string(run.seq) + " made no progress for " + fmt_s(opt_.timeout_s) + " s; waiting on " +
                     where + ". ";
  std::string check = "Check that the missing ranks' processes are alive and make the same sequence of allreduce "
                      "calls with the same sizes, that every worker reaches the switch at " +
                      endpoint + " (" + ports + "), and that no firewall or MTU limit drops UDP datagrams of up to " +
                      std::to_string(GS_HEADER_BYTES + join_.payload_bytes) + " bytes.";
  if (!control_) throw TimeoutError(head + check);

  Reply r;
  try {
    r = parse_reply(control_->request("STATUS job_id=" + std::to_string(join_.job_id) + " slot=" +
                                          std::to_string(slot) + " version=" + std::to_string(st.version),
                                      5.0));
  } catch (const Error& e) {
    throw TimeoutError(head + "The switch did not answer STATUS either (" + e.what() +
                       "): is gradswitchd still running at " + endpoint + "?");
  }
  if (!r.ok) throw TimeoutError(head + "STATUS failed: " + r.code + " " + r.message + ". " + check);
  if (r.get("state") == "aborted") {
    long long reason = 0, rank = GS_RANK_ALL;
    try {
      reason = r.get_int("abort_reason");
      rank = r.get_int("abort_rank");
    } catch (...) {
    }
    throw AbortedError("gradswitch: " + describe_job() + " was aborted by the switch during allreduce seq " +
                           std::to_string(run.seq) + ": " +
                           abort_reason_text(static_cast<uint8_t>(reason), static_cast<uint16_t>(rank)),
                       static_cast<uint8_t>(reason), static_cast<uint16_t>(rank));
  }
  std::vector<long long> seen = parse_list(r.get("seen"));
  std::vector<long long> rank_seq = parse_list(r.get("rank_seq"));
  bool same_round = r.get("slot_seq") == std::to_string(run.seq) && r.get("slot_offset") == std::to_string(st.offset);
  std::string state = r.get("slot_state");
  std::vector<unsigned> missing, present;
  if (same_round && (state == "open" || state == "complete")) {
    uint64_t mask = 0;
    for (long long s : seen)
      if (s >= 0 && s < 64) mask |= uint64_t{1} << s;
    for (unsigned k = 0; k < opt_.world; ++k) ((mask >> k) & 1 ? present : missing).push_back(k);
    if (missing.empty())
      throw TimeoutError(head + "Every rank contributed to this round at the switch, but its result does not reach "
                                "this worker: check that UDP datagrams from the switch reach port " +
                         std::to_string(transport_->local_port()) +
                         " on this host (firewall, NAT, MTU).");
    throw TimeoutError(head + "Rank(s) " + join_ranks(missing) + " have not contributed (received from " +
                       (present.empty() ? std::string("none") : join_ranks(present)) + "). " + check);
  }
  // The switch holds no part of this round: find the ranks that have not reached this allreduce.
  for (unsigned k = 0; k < opt_.world && k < rank_seq.size(); ++k) {
    long long v = rank_seq[k];
    bool reached = v >= 0 && static_cast<int32_t>(static_cast<uint32_t>(v) - run.seq) >= 0;
    if (!reached) missing.push_back(k);
  }
  bool self_missing = std::find(missing.begin(), missing.end(), opt_.rank) != missing.end();
  if (self_missing)
    throw TimeoutError(head + "The switch has received nothing from this rank for this allreduce: check that UDP "
                              "datagrams from this host reach the switch at " +
                       endpoint.substr(0, endpoint.rfind(':')) + " (" + ports + "; firewall, MTU).");
  if (!missing.empty())
    throw TimeoutError(head + "Rank(s) " + join_ranks(missing) + " have not reached allreduce seq " +
                       std::to_string(run.seq) + ". " + check);
  throw TimeoutError(head + "The switch's slot holds another round (" + r.get("slot_state") + " seq " +
                     r.get("slot_seq") + " offset " + r.get("slot_offset") + "): the ranks disagree on the sequence "
                     "or sizes of their allreduce calls? " + check);
}

}  // namespace gradswitch::worker
