// Control-plane request parsing (docs/protocol.md section 1): the line framer, key=value requests,
// and each request's typed arguments with the ERR code and message a client gets for bad ones.

#include "switch/control/parse.h"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <initializer_list>

#include "common/challenge.h"
#include "gradswitch/wire.h"

namespace gradswitch::control {

std::string format_error(const Error& e) {
  std::string msg = e.message;
  for (char& c : msg)
    if (c == '\n' || c == '\r') c = ' ';
  if (msg.size() > 1000) msg.resize(1000);
  return std::string("ERR ") + e.code + " " + msg + "\n";
}

LineFramer::Next LineFramer::next(std::string* line) {
  size_t nl = buf_.find('\n', pos_);
  if (nl == std::string::npos) {
    if (buf_.size() - pos_ >= kMaxLineBytes) return Next::kTooLong;  // no '\n' within the limit
    if (pos_ > 0 && pos_ == buf_.size()) {
      buf_.clear();
      pos_ = 0;
    } else if (pos_ > 65536) {
      buf_.erase(0, pos_);
      pos_ = 0;
    }
    return Next::kNone;
  }
  if (nl + 1 - pos_ > kMaxLineBytes) return Next::kTooLong;
  size_t end = nl;
  if (end > pos_ && buf_[end - 1] == '\r') --end;
  line->assign(buf_, pos_, end - pos_);
  pos_ = nl + 1;
  return Next::kLine;
}

size_t LineFramer::take(char* dst, size_t n) {
  n = std::min(n, buf_.size() - pos_);
  if (dst) std::memcpy(dst, buf_.data() + pos_, n);
  pos_ += n;
  if (pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  } else if (pos_ > 65536) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  return n;
}

const std::string* Request::find(std::string_view key) const {
  for (const auto& [k, v] : args)
    if (k == key) return &v;
  return nullptr;
}

bool is_valid_key(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
  });
}

bool is_valid_name(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '-';
  });
}

std::optional<uint64_t> parse_number(std::string_view s, uint64_t max) {
  unsigned base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    base = 16;
    s.remove_prefix(2);
  }
  if (s.empty() || s.size() > 20) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    unsigned d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (base == 16 && c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (base == 16 && c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      return std::nullopt;
    if (v > (max - d) / base) return std::nullopt;  // v * base + d > max
    v = v * base + d;
  }
  return v;
}

uint8_t wire_from_name(std::string_view s) {
  for (uint8_t t : {GS_ELEM_INT32, GS_ELEM_FLOAT32, GS_ELEM_FIXED32, GS_ELEM_FLOAT16, GS_ELEM_BFLOAT16,
                    GS_ELEM_FLOAT64, GS_ELEM_MX8})
    if (s == gs_elem_name(t)) return t;
  return 0;
}

// The token shown in a message: printable and short, so a hostile line cannot shape the reply.
static std::string shown(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 40)) out += (c > ' ' && c < 0x7f) ? c : '?';
  if (s.size() > 40) out += "...";
  return out;
}

std::optional<Request> parse_request(std::string_view line, Error* err) {
  Request r;
  size_t i = 0;
  auto next_token = [&](std::string_view* tok) {
    while (i < line.size() && line[i] == ' ') ++i;
    size_t start = i;
    while (i < line.size() && line[i] != ' ') ++i;
    *tok = line.substr(start, i - start);
    return !tok->empty();
  };
  std::string_view tok;
  if (!next_token(&tok)) {
    *err = {kErrBadRequest, "empty request (expected VERB key=value ...)"};
    return std::nullopt;
  }
  for (char c : line)
    if (c != ' ' && !(c > ' ' && c < 0x7f)) {  // tabs, control characters, non-ASCII bytes
      *err = {kErrBadRequest,
              "request contains a non-printable or non-ASCII byte (tokens are separated by spaces)"};
      return std::nullopt;
    }
  if (tok[0] < 'A' || tok[0] > 'Z' ||
      !std::all_of(tok.begin(), tok.end(), [](char c) { return (c >= 'A' && c <= 'Z') || c == '_'; })) {
    *err = {kErrBadRequest,
            "bad verb '" + shown(tok) +
                "' (verbs are upper case: JOIN LEAVE STATUS STATS JOBS PING PARAMS SETLR ...)"};
    return std::nullopt;
  }
  r.verb = tok;
  while (next_token(&tok)) {
    size_t eq = tok.find('=');
    if (eq == std::string_view::npos) {
      *err = {kErrBadRequest, "expected key=value, got '" + shown(tok) + "'"};
      return std::nullopt;
    }
    std::string_view key = tok.substr(0, eq), value = tok.substr(eq + 1);
    if (!is_valid_key(key)) {
      *err = {kErrBadRequest, "bad key '" + shown(key) + "' (keys are [a-z_.0-9]+)"};
      return std::nullopt;
    }
    if (value.empty()) {
      *err = {kErrBadRequest, "empty value for key '" + std::string(key) + "'"};
      return std::nullopt;
    }
    if (r.find(key)) {
      *err = {kErrBadRequest, "key '" + std::string(key) + "' given twice"};
      return std::nullopt;
    }
    r.args.emplace_back(std::string(key), std::string(value));
  }
  return r;
}

static bool check_keys(const Request& r, std::initializer_list<const char*> allowed, Error* err) {
  for (const auto& [k, v] : r.args) {
    bool ok = false;
    for (const char* a : allowed) ok = ok || k == a;
    if (!ok) {
      std::string list;
      for (const char* a : allowed) list += std::string(list.empty() ? "" : " ") + a;
      *err = {kErrBadRequest,
              "unknown key '" + k + "' for " + r.verb +
                  (list.empty() ? std::string(" (it takes no arguments)") : " (keys: " + list + ")")};
      return false;
    }
  }
  return true;
}

static bool required(const Request& r, const char* key, const std::string** v, Error* err) {
  *v = r.find(key);
  if (!*v) *err = {kErrBadRequest, r.verb + " needs " + key + "="};
  return *v != nullptr;
}

static bool number_arg(const Request& r, const char* key, uint64_t lo, uint64_t hi, uint64_t* out,
                       Error* err) {
  const std::string* v;
  if (!required(r, key, &v, err)) return false;
  auto n = parse_number(*v, UINT64_MAX);
  if (!n || *n < lo || *n > hi) {
    *err = {kErrBadRequest, std::string(key) + "=" + shown(*v) + " is not a number in " + std::to_string(lo) +
                                ".." + std::to_string(hi)};
    return false;
  }
  *out = *n;
  return true;
}

// Optimizer keys of JOIN: the ones every algorithm takes, then the algorithm's own.
static constexpr const char* kJoinKeys[] = {GS_KEY_JOB,   GS_KEY_WORLD,       GS_KEY_RANK,  GS_KEY_WIRE,
                                            GS_KEY_TOKEN, GS_KEY_PORT,        GS_KEY_LEAF,  GS_KEY_PEER,
                                            GS_KEY_TYPES, GS_KEY_DEADLINE_US, GS_KEY_QUORUM};
static constexpr const char* kOptCommonKeys[] = {GS_KEY_OPTIMIZER, GS_KEY_PARAMS, GS_KEY_LR,
                                                 GS_KEY_WEIGHT_DECAY, GS_KEY_AVERAGE};
static std::vector<const char*> algo_keys(OptimizerAlgo a) {
  switch (a) {
    case OptimizerAlgo::kSgd:
      return {GS_KEY_MOMENTUM, GS_KEY_DAMPENING, GS_KEY_NESTEROV};
    case OptimizerAlgo::kAdagrad:
      return {GS_KEY_EPS, GS_KEY_EPS_MODE, GS_KEY_LR_DECAY, GS_KEY_INITIAL_ACCUMULATOR};
    case OptimizerAlgo::kAdam:
    case OptimizerAlgo::kAdamW:
      return {GS_KEY_BETA1, GS_KEY_BETA2, GS_KEY_EPS, GS_KEY_EPS_MODE};
    case OptimizerAlgo::kSmorms3:
      return {GS_KEY_EPS};
  }
  return {};
}
static bool is_optimizer_key(std::string_view k) {
  for (const char* c : kOptCommonKeys)
    if (k == c) return true;
  for (auto a : {OptimizerAlgo::kSgd, OptimizerAlgo::kAdagrad, OptimizerAlgo::kAdam, OptimizerAlgo::kSmorms3})
    for (const char* c : algo_keys(a))
      if (k == c) return true;
  return false;
}

static bool float_arg(const Request& r, const char* key, float lo, float hi, bool hi_open, float* out,
                      Error* err) {
  const std::string* v = r.find(key);
  if (!v) return true;  // keeps the default
  auto f = parse_float(*v);
  if (!f || *f < lo || *f > hi || (hi_open && *f == hi)) {
    *err = {kErrBadRequest, std::string(key) + "=" + shown(*v) + " is not a number in [" + format_float(lo) +
                                ", " + (std::isinf(hi) ? std::string("inf") : format_float(hi)) +
                                (hi_open ? ")" : "]")};
    return false;
  }
  *out = *f;
  return true;
}

static bool bool_arg(const Request& r, const char* key, bool* out, Error* err) {
  const std::string* v = r.find(key);
  if (!v) return true;
  if (*v != "0" && *v != "1") {
    *err = {kErrBadRequest, std::string(key) + "=" + shown(*v) + " must be 0 or 1"};
    return false;
  }
  *out = *v == "1";
  return true;
}

// Every optimizer key present must be a common one or one of the chosen algorithm's own.
static bool check_optimizer_keys_apply(const Request& r, OptimizerAlgo algo, Error* err) {
  const auto own = algo_keys(algo);
  for (const auto& arg : r.args) {
    const std::string& k = arg.first;  // not a structured binding: lambdas below capture it
    if (!is_optimizer_key(k)) continue;
    auto is_k = [&](const char* c) { return k == c; };
    bool ok = std::find_if(std::begin(kOptCommonKeys), std::end(kOptCommonKeys), is_k) !=
                  std::end(kOptCommonKeys) ||
              std::find_if(own.begin(), own.end(), is_k) != own.end();
    if (!ok) {
      std::string list;
      for (const char* c : kOptCommonKeys) list += std::string(list.empty() ? "" : " ") + c;
      for (const char* c : own) list += std::string(" ") + c;
      *err = {kErrBadRequest, "key '" + k + "' does not apply to optimizer=" + optimizer_algo_name(algo) +
                                  " (its keys: " + list + ")"};
      return false;
    }
  }
  return true;
}

// params=, lr= and the hyperparameters, each within its range; eps_mode= by name.
static bool parse_optimizer_values(const Request& r, OptimizerSpec* o, Error* err) {
  uint64_t n;
  if (!number_arg(r, GS_KEY_PARAMS, 1, 0xFFFFFFFFull, &n, err)) return false;
  o->params = n;
  if (!r.find(GS_KEY_LR)) {
    *err = {kErrBadRequest, "JOIN with optimizer= needs lr="};
    return false;
  }
  const float inf = INFINITY;
  if (!float_arg(r, GS_KEY_LR, 0, inf, false, &o->lr, err) ||
      !float_arg(r, GS_KEY_WEIGHT_DECAY, 0, inf, false, &o->weight_decay, err) ||
      !float_arg(r, GS_KEY_MOMENTUM, 0, inf, false, &o->momentum, err) ||
      !float_arg(r, GS_KEY_DAMPENING, -inf, inf, false, &o->dampening, err) ||
      !float_arg(r, GS_KEY_BETA1, 0, 1, true, &o->beta1, err) ||
      !float_arg(r, GS_KEY_BETA2, 0, 1, true, &o->beta2, err) ||
      !float_arg(r, GS_KEY_EPS, 0, inf, false, &o->eps, err) ||
      !float_arg(r, GS_KEY_LR_DECAY, 0, inf, false, &o->lr_decay, err) ||
      !float_arg(r, GS_KEY_INITIAL_ACCUMULATOR, 0, inf, false, &o->initial_accumulator, err) ||
      !bool_arg(r, GS_KEY_NESTEROV, &o->nesterov, err) || !bool_arg(r, GS_KEY_AVERAGE, &o->average, err))
    return false;
  if (const std::string* m = r.find(GS_KEY_EPS_MODE)) {
    if (*m == "paper")
      o->eps_placement = EpsPlacement::kInsideSqrt;
    else if (*m == "torch")
      o->eps_placement = EpsPlacement::kOutsideSqrt;
    else {
      *err = {kErrBadRequest, "eps_mode=" + shown(*m) + " is unknown (paper|torch)"};
      return false;
    }
  }
  return true;
}

static std::optional<OptimizerSpec> parse_optimizer_keys(const Request& r, uint8_t wire, Error* err) {
  OptimizerSpec o;
  const std::string* v = r.find(GS_KEY_OPTIMIZER);
  if (!parse_optimizer_algo(*v, &o.algo)) {
    *err = {kErrBadRequest, "optimizer=" + shown(*v) + " is unknown (sgd|adagrad|adam|adamw|smorms3)"};
    return std::nullopt;
  }
  if (!check_optimizer_keys_apply(r, o.algo, err)) return std::nullopt;
  if (wire != GS_ELEM_FLOAT32) {
    *err = {kErrBadRequest,
            std::string("optimizer= needs wire=float32 (the switch holds fp32 parameters), not wire=") +
                gs_elem_name(wire)};
    return std::nullopt;
  }
  if (!parse_optimizer_values(r, &o, err)) return std::nullopt;
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0)) {
    *err = {kErrBadRequest, "nesterov=1 needs momentum > 0 and dampening=0 (as torch.optim.SGD)"};
    return std::nullopt;
  }
  if (o.algo == OptimizerAlgo::kSmorms3 && !(o.eps > 0)) {
    *err = {kErrBadRequest, "optimizer=smorms3 needs eps > 0 (it divides by v + eps with v = 0 at first)"};
    return std::nullopt;
  }
  return o;
}

// Every key is a JOIN key or an optimizer key, and optimizer keys come with optimizer=.
static bool check_join_keys(const Request& r, Error* err) {
  for (const auto& [k, v] : r.args) {
    bool ok = is_optimizer_key(k);
    for (const char* c : kJoinKeys) ok = ok || k == c;
    if (!ok) {
      *err = {kErrBadRequest,
              "unknown key '" + k +
                  "' for JOIN (keys: job world rank wire token port, types, deadline_us quorum, leaf peer "
                  "from a leaf switch, and for optimization in the switch optimizer params lr ...)"};
      return false;
    }
  }
  if (!r.find(GS_KEY_OPTIMIZER))
    for (const auto& [k, v] : r.args)
      if (is_optimizer_key(k)) {
        *err = {kErrBadRequest, "key '" + k + "' needs optimizer=<sgd|adagrad|adam|adamw|smorms3>"};
        return false;
      }
  return true;
}

// The keys every JOIN carries: job, world, rank, wire, token, port.
static bool parse_join_member(const Request& r, JoinRequest* j, Error* err) {
  const std::string* v;
  if (!required(r, GS_KEY_JOB, &v, err)) return false;
  if (!is_valid_name(*v)) {
    *err = {kErrBadRequest, "job=" + shown(*v) + " is not a valid name ([A-Za-z0-9._:-]{1,64})"};
    return false;
  }
  j->job = *v;
  uint64_t n;
  if (!number_arg(r, GS_KEY_WORLD, 1, GS_MAX_WORLD, &n, err)) return false;
  j->world = static_cast<uint16_t>(n);
  if (!number_arg(r, GS_KEY_RANK, 0, UINT16_MAX, &n, err)) return false;
  if (n >= j->world) {
    *err = {kErrBadRequest, "rank=" + std::to_string(n) +
                                " is out of range for world=" + std::to_string(j->world) + " (ranks are 0.." +
                                std::to_string(j->world - 1) + ")"};
    return false;
  }
  j->rank = static_cast<uint16_t>(n);
  if (!required(r, GS_KEY_WIRE, &v, err)) return false;
  j->wire = wire_from_name(*v);
  if (!j->wire) {
    *err = {kErrBadRequest,
            "wire=" + shown(*v) + " is unknown (int32|float32|fixed32|float16|bfloat16|float64|mx8)"};
    return false;
  }
  if (!required(r, GS_KEY_TOKEN, &v, err)) return false;
  if (!is_valid_name(*v)) {
    *err = {kErrBadRequest, "token is not valid ([A-Za-z0-9._:-]{1,64})"};
    return false;
  }
  j->token = *v;
  if (!number_arg(r, GS_KEY_PORT, 1, 65535, &n, err)) return false;
  j->port = static_cast<uint16_t>(n);
  return true;
}

// leaf=1 and peer=IPv4:PORT: a JOIN that a leaf switch forwards for its rack.
static bool parse_join_leaf(const Request& r, JoinRequest* j, Error* err) {
  uint64_t n;
  if (r.find(GS_KEY_LEAF)) {
    if (!number_arg(r, GS_KEY_LEAF, 0, 1, &n, err)) return false;
    j->leaf = n == 1;
  }
  const std::string* peer = r.find(GS_KEY_PEER);
  if (!peer) return true;
  in_addr a{};
  const size_t colon = peer->rfind(':');
  uint64_t port = 0;
  if (!j->leaf || colon == std::string::npos || inet_pton(AF_INET, peer->substr(0, colon).c_str(), &a) != 1 ||
      !(port = parse_number(std::string_view(*peer).substr(colon + 1), 65535).value_or(0))) {
    *err = {kErrBadRequest,
            j->leaf ? "peer=" + shown(*peer) + " is not an IPv4:PORT address"
                    : std::string("peer= is only for a JOIN forwarded by a leaf switch (leaf=1)")};
    return false;
  }
  j->peer_ipv4_be = a.s_addr;
  j->peer_port = static_cast<uint16_t>(port);
  return true;
}

// types=: the comma-separated element types a job's allreduces may use besides wire=.
static bool parse_join_types(const Request& r, JoinRequest* j, Error* err) {
  const std::string* t = r.find(GS_KEY_TYPES);
  if (!t) return true;
  if (r.find(GS_KEY_OPTIMIZER)) {
    *err = {kErrBadRequest, "types= does not go with optimizer= (an optimizer job takes float32 only)"};
    return false;
  }
  for (size_t start = 0;;) {  // comma separated; an empty item is an unknown type
    const size_t comma = t->find(',', start);
    const uint8_t type = wire_from_name(std::string_view(*t).substr(start, comma - start));
    if (!type || (j->types >> type & 1)) {
      *err = {kErrBadRequest, "types=" + shown(*t) +
                                  " is not a list of distinct element types "
                                  "(int32,float32,fixed32,float16,bfloat16,float64,mx8)"};
      return false;
    }
    j->types |= 1u << type;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return true;
}

// deadline_us= and quorum=: rounds close at a deadline with the contributions present (§3.1).
static bool parse_join_deadline(const Request& r, JoinRequest* j, Error* err) {
  const bool quorum = r.find(GS_KEY_QUORUM) != nullptr;
  if (!r.find(GS_KEY_DEADLINE_US)) {
    if (quorum)
      *err = {kErrBadRequest, "quorum= needs deadline_us= (a round without a deadline waits for every rank)"};
    return !quorum;
  }
  const char* clash = r.find(GS_KEY_OPTIMIZER) ? "optimizer= (a step needs every rank's gradient)"
                      : j->leaf ? "leaf=1 (a leaf's rack sum is one contribution of the spine's round)"
                                : nullptr;
  if (clash) {
    *err = {kErrBadRequest, std::string("deadline_us= does not go with ") + clash};
    return false;
  }
  uint64_t n;
  if (!number_arg(r, GS_KEY_DEADLINE_US, 1, kMaxDeadlineUs, &n, err)) return false;
  j->deadline_us = static_cast<uint32_t>(n);
  j->quorum = static_cast<uint16_t>(j->world > 1 ? j->world - 1 : 1);
  if (quorum) {
    if (!number_arg(r, GS_KEY_QUORUM, 1, j->world, &n, err)) return false;
    j->quorum = static_cast<uint16_t>(n);
  }
  return true;
}

std::optional<JoinRequest> parse_join(const Request& r, Error* err) {
  JoinRequest j;
  if (!check_join_keys(r, err) || !parse_join_member(r, &j, err) || !parse_join_leaf(r, &j, err) ||
      !parse_join_types(r, &j, err) || !parse_join_deadline(r, &j, err))
    return std::nullopt;
  if (r.find(GS_KEY_OPTIMIZER)) {
    j.optimizer = parse_optimizer_keys(r, j.wire, err);
    if (!j.optimizer) return std::nullopt;
  }
  return j;
}

static std::optional<QueryRequest> parse_query(const Request& r, bool with_slot, Error* err) {
  if (with_slot ? !check_keys(r, {GS_KEY_JOB_ID, GS_KEY_SLOT, GS_KEY_VERSION}, err)
                : !check_keys(r, {GS_KEY_JOB_ID}, err))
    return std::nullopt;
  QueryRequest q;
  uint64_t n;
  if (r.find(GS_KEY_JOB_ID)) {
    if (!number_arg(r, GS_KEY_JOB_ID, 0, UINT32_MAX, &n, err)) return std::nullopt;
    q.job_id = static_cast<uint32_t>(n);
  }
  if (with_slot && (r.find(GS_KEY_SLOT) || r.find(GS_KEY_VERSION))) {
    if (!r.find(GS_KEY_SLOT) || !r.find(GS_KEY_VERSION)) {
      *err = {kErrBadRequest, "slot= and version= go together"};
      return std::nullopt;
    }
    if (!number_arg(r, GS_KEY_SLOT, 0, UINT16_MAX, &n, err)) return std::nullopt;
    q.slot = static_cast<uint16_t>(n);
    if (!number_arg(r, GS_KEY_VERSION, 0, 1, &n, err)) return std::nullopt;
    q.version = static_cast<uint8_t>(n);
  }
  return q;
}

std::optional<QueryRequest> parse_status(const Request& r, Error* err) {
  return parse_query(r, true, err);
}
std::optional<QueryRequest> parse_stats(const Request& r, Error* err) {
  return parse_query(r, false, err);
}
bool parse_no_args(const Request& r, Error* err) {
  return check_keys(r, {}, err);
}

// host:port as a worker writes a switch's address (a name, IPv4 or [IPv6], then a port): it is sent
// back verbatim in STATUS and EVENT lines, so nothing else may pass.
static bool is_switch_address(std::string_view s) {
  const size_t colon = s.rfind(':');
  if (s.size() > 128 || colon == std::string_view::npos || colon == 0 || colon + 1 == s.size()) return false;
  for (char c : s.substr(colon + 1))
    if (c < '0' || c > '9') return false;
  return std::all_of(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(colon), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-' || c == '_' || c == ':' || c == '[' || c == ']';
  });
}

std::optional<LeaveRequest> parse_leave(const Request& r, Error* err) {
  if (!check_keys(r, {GS_KEY_LOST}, err)) return std::nullopt;
  LeaveRequest l;
  if (const std::string* v = r.find(GS_KEY_LOST)) {
    if (!is_switch_address(*v)) {
      *err = {kErrBadRequest, std::string(GS_KEY_LOST) + "=" + shown(*v) +
                                  " is not a switch address (host:port, at most 128 characters)"};
      return std::nullopt;
    }
    l.lost = *v;
  }
  return l;
}

static bool is_proof(std::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::optional<AuthRequest> parse_auth(const Request& r, Error* err) {
  if (!check_keys(r, {GS_KEY_TENANT, GS_KEY_CNONCE, GS_KEY_PROOF}, err)) return std::nullopt;
  AuthRequest a;
  const std::string* v;
  if (!required(r, GS_KEY_TENANT, &v, err)) return std::nullopt;
  a.tenant = *v;
  if (!required(r, GS_KEY_CNONCE, &v, err)) return std::nullopt;
  a.cnonce = *v;
  if (!required(r, GS_KEY_PROOF, &v, err)) return std::nullopt;
  a.proof = *v;
  if (!is_valid_name(a.tenant) || a.tenant.find(':') != std::string::npos) {
    *err = {kErrBadRequest, "tenant=" + shown(a.tenant) + " is not a tenant name ([A-Za-z0-9._-]{1,64})"};
    return std::nullopt;
  }
  if (!is_nonce(a.cnonce)) {
    *err = {kErrBadRequest, "cnonce must be 32..128 lower-case hex digits (the client's random challenge)"};
    return std::nullopt;
  }
  if (!is_proof(a.proof)) {
    *err = {kErrBadRequest,
            "proof must be 64 lower-case hex digits (HMAC-SHA-256, docs/protocol.md section 1.5)"};
    return std::nullopt;
  }
  return a;
}

std::optional<uint32_t> parse_abort(const Request& r, Error* err) {
  if (!check_keys(r, {GS_KEY_JOB_ID}, err)) return std::nullopt;
  uint64_t n;
  if (!number_arg(r, GS_KEY_JOB_ID, 1, UINT32_MAX, &n, err)) return std::nullopt;
  return static_cast<uint32_t>(n);
}

std::optional<float> parse_float(std::string_view s) {
  // The grammar first (from_chars would also take inf, nan and hexadecimal forms).
  size_t i = 0, digits = 0;
  if (i < s.size() && s[i] == '-') ++i;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i, ++digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i, ++digits;
  }
  if (digits == 0) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    size_t exp_digits = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i, ++exp_digits;
    if (exp_digits == 0) return std::nullopt;
  }
  if (i != s.size() || s.size() > 64) return std::nullopt;
  float v = 0;
  auto res = std::from_chars(s.data(), s.data() + s.size(), v, std::chars_format::general);
  if (res.ec != std::errc() || res.ptr != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::string format_float(float v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

static bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

bool same_optimizer(const OptimizerSpec& a, const OptimizerSpec& b) {
  return a.algo == b.algo && a.params == b.params && same_bits(a.lr, b.lr) &&
         same_bits(a.momentum, b.momentum) && same_bits(a.dampening, b.dampening) &&
         a.nesterov == b.nesterov && same_bits(a.weight_decay, b.weight_decay) &&
         same_bits(a.beta1, b.beta1) && same_bits(a.beta2, b.beta2) && same_bits(a.eps, b.eps) &&
         same_bits(a.lr_decay, b.lr_decay) && same_bits(a.initial_accumulator, b.initial_accumulator) &&
         a.eps_placement == b.eps_placement && a.average == b.average;
}

std::string describe_optimizer(const OptimizerSpec& s) {
  std::string out = std::string("optimizer=") + optimizer_algo_name(s.algo) +
                    " params=" + std::to_string(s.params) + " lr=" + format_float(s.lr) +
                    " weight_decay=" + format_float(s.weight_decay) + " average=" + (s.average ? "1" : "0");
  const std::string eps_mode = s.eps_placement == EpsPlacement::kInsideSqrt ? "paper" : "torch";
  switch (s.algo) {
    case OptimizerAlgo::kSgd:
      out += " momentum=" + format_float(s.momentum) + " dampening=" + format_float(s.dampening) +
             " nesterov=" + (s.nesterov ? "1" : "0");
      break;
    case OptimizerAlgo::kAdagrad:
      out += " eps=" + format_float(s.eps) + " eps_mode=" + eps_mode +
             " lr_decay=" + format_float(s.lr_decay) +
             " initial_accumulator=" + format_float(s.initial_accumulator);
      break;
    case OptimizerAlgo::kAdam:
    case OptimizerAlgo::kAdamW:
      out += " beta1=" + format_float(s.beta1) + " beta2=" + format_float(s.beta2) +
             " eps=" + format_float(s.eps) + " eps_mode=" + eps_mode;
      break;
    case OptimizerAlgo::kSmorms3:
      out += " eps=" + format_float(s.eps);
      break;
  }
  return out;
}

std::optional<uint64_t> binary_length(const Request& r) {
  if (r.verb == GS_VERB_PARAMS) {
    const std::string* c = r.find(GS_KEY_COUNT);
    if (!c) return std::nullopt;
    auto n = parse_number(*c, 0xFFFFFFFFull);
    if (!n) return std::nullopt;
    return *n * 4;
  }
  if (r.verb == GS_VERB_STATE_SET) {
    const std::string* b = r.find(GS_KEY_BYTES);
    if (!b) return std::nullopt;
    return parse_number(*b, kMaxStateBytes);
  }
  return std::nullopt;
}

std::optional<ParamsRequest> parse_params(const Request& r, Error* err) {
  if (!check_keys(r, {GS_KEY_OFFSET, GS_KEY_COUNT}, err)) return std::nullopt;
  ParamsRequest p;
  if (!number_arg(r, GS_KEY_OFFSET, 0, 0xFFFFFFFFull, &p.offset, err)) return std::nullopt;
  if (!number_arg(r, GS_KEY_COUNT, 0, 0xFFFFFFFFull, &p.count, err)) return std::nullopt;
  return p;
}

std::optional<float> parse_setlr(const Request& r, Error* err) {
  if (!check_keys(r, {GS_KEY_LR}, err)) return std::nullopt;
  const std::string* v;
  if (!required(r, GS_KEY_LR, &v, err)) return std::nullopt;
  auto f = parse_float(*v);
  if (!f || *f < 0) {
    *err = {kErrBadRequest, "lr=" + shown(*v) + " is not a finite number >= 0"};
    return std::nullopt;
  }
  return *f;
}

std::optional<uint64_t> parse_state_set(const Request& r, Error* err) {
  if (!check_keys(r, {GS_KEY_BYTES}, err)) return std::nullopt;
  uint64_t n;
  if (!number_arg(r, GS_KEY_BYTES, 0, kMaxStateBytes, &n, err)) return std::nullopt;
  return n;
}

StateHeader state_header_for(const OptimizerSpec& spec, uint32_t chunk, float lr) {
  StateHeader h{};
  std::memcpy(h.magic, GS_STATE_MAGIC, sizeof h.magic);
  h.algo = static_cast<uint8_t>(spec.algo);
  h.arrays = static_cast<uint8_t>(1 + optimizer_state_arrays(spec.algo));
  h.chunk = chunk;
  h.params = spec.params;
  h.chunks = chunk ? static_cast<uint32_t>((spec.params + chunk - 1) / chunk) : 0;
  h.lr = lr;
  return h;
}

uint64_t state_blob_bytes(const StateHeader& h) {
  return gs_state_blob_bytes(&h);
}

// The blob's header is little-endian, as the host (wire.h refuses big-endian hosts): a plain copy.
void encode_state_header(const StateHeader& h, uint8_t out[kStateHeaderBytes]) {
  std::memcpy(out, &h, kStateHeaderBytes);
}

std::optional<StateHeader> decode_state_header(const uint8_t in[kStateHeaderBytes], const StateHeader& expect,
                                               Error* err) {
  if (std::memcmp(in, GS_STATE_MAGIC, 8) != 0) {
    *err = {kErrBadRequest,
            "STATE_SET data does not start with the magic GSOPTST1 (not a gradswitch checkpoint)"};
    return std::nullopt;
  }
  StateHeader h;
  std::memcpy(&h, in, kStateHeaderBytes);
  auto algo_name = [](uint8_t a) {
    return a <= static_cast<uint8_t>(OptimizerAlgo::kSmorms3)
               ? std::string(optimizer_algo_name(OptimizerAlgo(a)))
               : "#" + std::to_string(a);
  };
  std::string diff;
  if (h.algo != expect.algo)
    diff = "algorithm " + algo_name(h.algo) + " (job: " + algo_name(expect.algo) + ")";
  else if (h.arrays != expect.arrays)
    diff = std::to_string(h.arrays) + " arrays (job: " + std::to_string(expect.arrays) + ")";
  else if (h.params != expect.params)
    diff = std::to_string(h.params) + " parameters (job: " + std::to_string(expect.params) + ")";
  else if (h.chunk != expect.chunk || h.chunks != expect.chunks)
    diff = "chunks of " + std::to_string(h.chunk) + " elements (job: " + std::to_string(expect.chunk) +
           "; restore on a switch with the same --mtu)";
  else if (h.reserved != 0)
    diff = "non-zero reserved bytes 10-11";
  else if (!std::isfinite(h.lr) || h.lr < 0)
    diff = "an lr that is not a finite number >= 0";
  if (!diff.empty()) {
    *err = {kErrConflict, "the checkpoint does not fit this job: it has " + diff};
    return std::nullopt;
  }
  return h;
}

}  // namespace gradswitch::control
