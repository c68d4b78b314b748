// The records the control plane's files share: a connection, a job waiting for its ranks, and a
// running job. Internal to src/switch/control (the ControlPlane class keeps them private).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "switch/control/control_plane.h"

namespace gradswitch {

// Buffered input of a connection whose JOIN reply is held, or behind a STATE_GET payload going out.
inline constexpr size_t kMaxPausedInput = 64 * 1024;

struct ControlPlane::Conn {
  enum class Role { kNone, kPending, kJoined, kLeft };
  uint64_t id = 0;
  int fd = -1;
  uint32_t peer_ipv4_be = 0;
  std::string peer;  // "a.b.c.d:port", for messages
  control::LineFramer in;
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
    uint64_t param_offset = 0;    // kParams: first element written
    control::StateHeader expect;  // kState: what the header must say
    uint8_t header[control::kStateHeaderBytes] = {};
    control::Error error;  // kDiscard: the reply once the payload is consumed
    std::string ok;        // the reply on success
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

namespace control {
// Texts of replies, events and log lines that several files write (queries.cpp defines them).
// ` mismatch_seq=.. mismatch_offset=.. mismatch_ranks=a,b ...`: the two contributions that could not
// be summed (held, arriving).
std::string mismatch_keys(const Mismatch& m);
std::string ranks_text(uint64_t mask);  // "0,3,5"
}  // namespace control

}  // namespace gradswitch
