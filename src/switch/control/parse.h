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
#include <utility>
#include <vector>

namespace gradswitch::control {

inline constexpr size_t kMaxLineBytes = 4096;  // including the '\n'

// Error codes of `ERR <code> <message>`.
inline constexpr const char* kErrBadRequest = "bad_request";
inline constexpr const char* kErrTooLong = "too_long";
inline constexpr const char* kErrConflict = "conflict";
inline constexpr const char* kErrState = "state";
inline constexpr const char* kErrTimeout = "timeout";
inline constexpr const char* kErrNoResources = "no_resources";
inline constexpr const char* kErrNotFound = "not_found";

struct Error {
  const char* code = kErrBadRequest;
  std::string message;
};

// "ERR <code> <message>\n" (the message is cut to one line).
std::string format_error(const Error& e);

// Splits a byte stream into lines of at most kMaxLineBytes (terminator included).
class LineFramer {
 public:
  enum class Next { kNone, kLine, kTooLong };
  void append(const char* data, size_t len) { buf_.append(data, len); }
  // The next complete line without its "\n" / "\r\n"; kTooLong once a line (complete or not)
  // exceeds the limit, after which the framer is unusable (the connection is closed).
  Next next(std::string* line);
  size_t buffered() const { return buf_.size() - pos_; }

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
};

// STATUS and STATS arguments.
struct QueryRequest {
  std::optional<uint32_t> job_id;
  std::optional<uint16_t> slot;
  uint8_t version = 0;
};

// Each checks the verb's keys: all required ones present, no unknown ones, valid values.
std::optional<JoinRequest> parse_join(const Request& r, Error* err);
std::optional<QueryRequest> parse_status(const Request& r, Error* err);
std::optional<QueryRequest> parse_stats(const Request& r, Error* err);
bool parse_no_args(const Request& r, Error* err);  // LEAVE, JOBS, PING

// Helpers, exposed for tests.
bool is_valid_name(std::string_view s);  // [A-Za-z0-9._:-]{1,64}
bool is_valid_key(std::string_view s);   // [a-z_.0-9]+
// Decimal, or hexadecimal with 0x; at most `max`.
std::optional<uint64_t> parse_number(std::string_view s, uint64_t max);
// "int32" -> GS_ELEM_INT32, ...; 0 when unknown.
uint8_t wire_from_name(std::string_view s);

}  // namespace gradswitch::control
