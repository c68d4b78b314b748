// Control-plane text protocol (docs/protocol.md section 1): framing and request parsing.
//
// Pure functions and a small byte-to-line framer, with no sockets, so that they can be unit
// tested and fuzzed. Every failure carries the `ERR` code and a message for the client.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradswitch/control.h"
#include "switch/engine/optimizer.h"

namespace gradswitch::control {

inline constexpr size_t kMaxLineBytes = GS_CONTROL_MAX_LINE;  // including the '\n'

// Error codes of `ERR <code> <message>` (include/gradswitch/control.h).
inline constexpr const char* kErrBadRequest = GS_ERR_BAD_REQUEST;
inline constexpr const char* kErrTooLong = GS_ERR_TOO_LONG;
inline constexpr const char* kErrConflict = GS_ERR_CONFLICT;
inline constexpr const char* kErrState = GS_ERR_STATE;
inline constexpr const char* kErrTimeout = GS_ERR_TIMEOUT;
inline constexpr const char* kErrNoResources = GS_ERR_NO_RESOURCES;
inline constexpr const char* kErrNotFound = GS_ERR_NOT_FOUND;

struct Error {
  const char* code = kErrBadRequest;
  std::string message;
};

// "ERR <code> <message>\n" (the message is cut to one line).
std::string format_error(const Error& e);

// A reply or event line `HEAD key=value ...\n`, keys from include/gradswitch/control.h.
class Line {
 public:
  explicit Line(std::string head) : text_(std::move(head)) {}
  Line& add(const char* key, std::string_view value) {
    (((text_ += ' ') += key) += '=') += value;
    return *this;
  }
  Line& add(const char* key, const char* value) { return add(key, std::string_view(value)); }
  Line& add(const char* key, const std::string& value) { return add(key, std::string_view(value)); }
  template <typename Int, typename = std::enable_if_t<std::is_integral_v<Int>>>
  Line& add(const char* key, Int value) {
    return add(key, std::string_view(std::to_string(value)));
  }
  Line& raw(std::string_view more) {  // " key=value ..." already formatted
    text_ += more;
    return *this;
  }
  std::string str() const { return text_ + "\n"; }

 private:
  std::string text_;
};

// Splits a byte stream into lines of at most kMaxLineBytes (terminator included).
class LineFramer {
 public:
  enum class Next { kNone, kLine, kTooLong };
  void append(const char* data, size_t len) { buf_.append(data, len); }
  // The next complete line without its "\n" / "\r\n"; kTooLong once a line (complete or not)
  // exceeds the limit, after which the framer is unusable (the connection is closed).
  Next next(std::string* line);
  size_t buffered() const { return buf_.size() - pos_; }
  // Removes up to `n` raw bytes (binary payloads) from the buffer, copying them to `dst` unless
  // it is null; returns how many.
  size_t take(char* dst, size_t n);

 private:
  std::string buf_;
  size_t pos_ = 0;
};

// A request line: VERB key=value ...
struct Request {
  std::string verb;
  std::vector<std::pair<std::string, std::string>> args;
  const std::string* find(std::string_view key) const;
};

std::optional<Request> parse_request(std::string_view line, Error* err);

struct JoinRequest {
  std::string job;
  uint16_t world = 0;
  uint16_t rank = 0;
  uint8_t wire = 0;  // gs_elem_type
  std::string token;
  uint16_t port = 0;
  // leaf=1: a leaf switch forwards this rank's JOIN (docs/protocol.md §8); the ranks it forwards from
  // one address and port are one contributor. peer=: the worker's own UDP address (for peers=).
  bool leaf = false;
  uint32_t peer_ipv4_be = 0;
  uint16_t peer_port = 0;
  uint32_t types = 0;  // types=: bit t for each extra gs_elem_type DATA may carry (besides wire, int32)
  // deadline_us= (0: none, every round waits for every rank) and quorum= (resolved: its default is
  // world - 1, at least 1): bounded-time rounds, docs/protocol.md §3.1.
  uint32_t deadline_us = 0;
  uint16_t quorum = 0;
  // Set when the JOIN carries optimizer= (the switch then optimizes: docs/protocol.md §1.3).
  std::optional<OptimizerSpec> optimizer;
};

// STATUS and STATS arguments.
struct QueryRequest {
  std::optional<uint32_t> job_id;
  std::optional<uint16_t> slot;
  uint8_t version = 0;
};

// deadline_us= is at most a minute: a round waiting longer is a stalled job, not a straggler.
inline constexpr uint64_t kMaxDeadlineUs = 60'000'000;

// Each checks the verb's keys: all required ones present, no unknown ones, valid values.
std::optional<JoinRequest> parse_join(const Request& r, Error* err);
std::optional<QueryRequest> parse_status(const Request& r, Error* err);
std::optional<QueryRequest> parse_stats(const Request& r, Error* err);
bool parse_no_args(const Request& r, Error* err);  // JOBS, PING, STATE_GET, CHALLENGE

// LEAVE [lost=<host:port>]: `lost` names the switch of a sharded job whose loss made the rank leave
// (empty when it left of its own accord).
struct LeaveRequest {
  std::string lost;
};
std::optional<LeaveRequest> parse_leave(const Request& r, Error* err);

// AUTH tenant=<name> cnonce=<hex> proof=<hex> (docs/protocol.md section 1.5).
struct AuthRequest {
  std::string tenant, cnonce, proof;
};
std::optional<AuthRequest> parse_auth(const Request& r, Error* err);
// ABORT job_id=<id>: the job to abort.
std::optional<uint32_t> parse_abort(const Request& r, Error* err);

// ---- Optimizer jobs (docs/protocol.md §1.3) ----

// PARAMS offset=<o> count=<n>, followed by n * 4 bytes.
struct ParamsRequest {
  uint64_t offset = 0;
  uint64_t count = 0;
};
// The announced payload length of a binary request (PARAMS: count * 4, STATE_SET: bytes), or
// nullopt when it cannot be known (missing or malformed): the connection must then be closed,
// since the bytes that follow cannot be told apart from request lines.
std::optional<uint64_t> binary_length(const Request& r);
inline constexpr uint64_t kMaxStateBytes = uint64_t{1} << 40;  // STATE_SET bytes= limit

std::optional<ParamsRequest> parse_params(const Request& r, Error* err);
std::optional<float> parse_setlr(const Request& r, Error* err);
std::optional<uint64_t> parse_state_set(const Request& r, Error* err);  // bytes=

// A float32 value: [-]digits[.digits][(e|E)[+|-]digits] (also ".5", "5."), rounded to nearest;
// inf, nan and out-of-range values are rejected.
std::optional<float> parse_float(std::string_view s);
// Shortest decimal text that parses back to the same float32.
std::string format_float(float v);
// Equal hyperparameters (the JOINs of one job must agree; floats compared bit for bit).
bool same_optimizer(const OptimizerSpec& a, const OptimizerSpec& b);
// "optimizer=adam params=1000 lr=0.001 beta1=0.9 ..." with every key that applies to the algorithm.
std::string describe_optimizer(const OptimizerSpec& s);

// The checkpoint blob of STATE_GET / STATE_SET (its layout: gs_state_header in
// include/gradswitch/control.h).
inline constexpr size_t kStateHeaderBytes = GS_STATE_HEADER_BYTES;
using StateHeader = gs_state_header;
StateHeader state_header_for(const OptimizerSpec& spec, uint32_t chunk, float lr);
uint64_t state_blob_bytes(const StateHeader& h);
void encode_state_header(const StateHeader& h, uint8_t out[kStateHeaderBytes]);
// Decodes and checks the header against `expect` (all but lr must match); the error says what differs.
std::optional<StateHeader> decode_state_header(const uint8_t in[kStateHeaderBytes], const StateHeader& expect,
                                               Error* err);

// Helpers, exposed for tests.
bool is_valid_name(std::string_view s);  // [A-Za-z0-9._:-]{1,64}
bool is_valid_key(std::string_view s);   // [a-z_.0-9]+
// Decimal, or hexadecimal with 0x; at most `max`.
std::optional<uint64_t> parse_number(std::string_view s, uint64_t max);
// "int32" -> GS_ELEM_INT32, ...; 0 when unknown.
uint8_t wire_from_name(std::string_view s);

}  // namespace gradswitch::control
