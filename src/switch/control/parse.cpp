#include "switch/control/parse.h"

#include <algorithm>
#include <initializer_list>

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

const std::string* Request::find(std::string_view key) const {
  for (const auto& [k, v] : args)
    if (k == key) return &v;
  return nullptr;
}

bool is_valid_key(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.'; });
}

bool is_valid_name(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == ':' || c == '-';
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
    if (c >= '0' && c <= '9') d = c - '0';
    else if (base == 16 && c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (base == 16 && c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return std::nullopt;
    if (v > (max - d) / base) return std::nullopt;  // v * base + d > max
    v = v * base + d;
  }
  return v;
}

uint8_t wire_from_name(std::string_view s) {
  for (uint8_t t : {GS_ELEM_INT32, GS_ELEM_FLOAT32, GS_ELEM_FIXED32, GS_ELEM_FLOAT16, GS_ELEM_BFLOAT16})
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
      *err = {kErrBadRequest, "request contains a non-printable or non-ASCII byte (tokens are separated by spaces)"};
      return std::nullopt;
    }
  if (!std::all_of(tok.begin(), tok.end(), [](char c) { return c >= 'A' && c <= 'Z'; })) {
    *err = {kErrBadRequest, "bad verb '" + shown(tok) + "' (verbs are upper case: JOIN LEAVE STATUS STATS JOBS PING)"};
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
      *err = {kErrBadRequest, "unknown key '" + k + "' for " + r.verb +
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

static bool number_arg(const Request& r, const char* key, uint64_t lo, uint64_t hi, uint64_t* out, Error* err) {
  const std::string* v;
  if (!required(r, key, &v, err)) return false;
  auto n = parse_number(*v, UINT64_MAX);
  if (!n || *n < lo || *n > hi) {
    *err = {kErrBadRequest, std::string(key) + "=" + shown(*v) + " is not a number in " + std::to_string(lo) + ".." +
                                std::to_string(hi)};
    return false;
  }
  *out = *n;
  return true;
}

std::optional<JoinRequest> parse_join(const Request& r, Error* err) {
  if (!check_keys(r, {"job", "world", "rank", "wire", "token", "port"}, err)) return std::nullopt;
  JoinRequest j;
  const std::string* v;
  if (!required(r, "job", &v, err)) return std::nullopt;
  if (!is_valid_name(*v)) {
    *err = {kErrBadRequest, "job=" + shown(*v) + " is not a valid name ([A-Za-z0-9._:-]{1,64})"};
    return std::nullopt;
  }
  j.job = *v;
  uint64_t n;
  if (!number_arg(r, "world", 1, GS_MAX_WORLD, &n, err)) return std::nullopt;
  j.world = static_cast<uint16_t>(n);
  if (!number_arg(r, "rank", 0, UINT16_MAX, &n, err)) return std::nullopt;
  if (n >= j.world) {
    *err = {kErrBadRequest, "rank=" + std::to_string(n) + " is out of range for world=" + std::to_string(j.world) +
                                " (ranks are 0.." + std::to_string(j.world - 1) + ")"};
    return std::nullopt;
  }
  j.rank = static_cast<uint16_t>(n);
  if (!required(r, "wire", &v, err)) return std::nullopt;
  j.wire = wire_from_name(*v);
  if (!j.wire) {
    *err = {kErrBadRequest, "wire=" + shown(*v) + " is unknown (int32|float32|fixed32|float16|bfloat16)"};
    return std::nullopt;
  }
  if (!required(r, "token", &v, err)) return std::nullopt;
  if (!is_valid_name(*v)) {
    *err = {kErrBadRequest, "token is not valid ([A-Za-z0-9._:-]{1,64})"};
    return std::nullopt;
  }
  j.token = *v;
  if (!number_arg(r, "port", 1, 65535, &n, err)) return std::nullopt;
  j.port = static_cast<uint16_t>(n);
  return j;
}

static std::optional<QueryRequest> parse_query(const Request& r, bool with_slot, Error* err) {
  if (with_slot ? !check_keys(r, {"job_id", "slot", "version"}, err) : !check_keys(r, {"job_id"}, err))
    return std::nullopt;
  QueryRequest q;
  uint64_t n;
  if (r.find("job_id")) {
    if (!number_arg(r, "job_id", 0, UINT32_MAX, &n, err)) return std::nullopt;
    q.job_id = static_cast<uint32_t>(n);
  }
  if (with_slot && (r.find("slot") || r.find("version"))) {
    if (!r.find("slot") || !r.find("version")) {
      *err = {kErrBadRequest, "slot= and version= go together"};
      return std::nullopt;
    }
    if (!number_arg(r, "slot", 0, UINT16_MAX, &n, err)) return std::nullopt;
    q.slot = static_cast<uint16_t>(n);
    if (!number_arg(r, "version", 0, 1, &n, err)) return std::nullopt;
    q.version = static_cast<uint8_t>(n);
  }
  return q;
}

std::optional<QueryRequest> parse_status(const Request& r, Error* err) { return parse_query(r, true, err); }
std::optional<QueryRequest> parse_stats(const Request& r, Error* err) { return parse_query(r, false, err); }
bool parse_no_args(const Request& r, Error* err) { return check_keys(r, {}, err); }

}  // namespace gradswitch::control
