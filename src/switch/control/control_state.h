// The records the control plane's types share: a connection, a job waiting for its ranks, and a
// running job. Internal to src/switch/control: Connections owns the first, Jobs the other two.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "switch/control/auth.h"
#include "switch/control/parse.h"
#include "switch/engine/engine.h"

namespace gradswitch::control {

// Buffered input behind a JOIN whose reply is held (more withdraws the JOIN: a connection that is
// not read could close unnoticed), or behind a STATE_GET payload going out (reading pauses).
inline constexpr size_t kMaxPausedInput = 64 * 1024;

struct Conn {
  // kUplink: a leaf's own connection to its spine, carrying one member's JOIN (docs/protocol.md §8).
  enum class Role { kNone, kPending, kJoined, kLeft, kUplink };
  uint64_t id = 0;
  int fd = -1;
  uint32_t peer_ipv4_be = 0;
  std::string peer;  // "a.b.c.d:port", for messages
  LineFramer in;
  std::string out;
  bool eof = false;      // the peer closed its side
  int last_errno = 0;    // why the connection failed, when it did (a leaf's spine unreachable)
  bool closing = false;  // input is discarded; once the error is sent: FIN, drain, close
  bool wr_shut = false;
  uint64_t drain_deadline_ns = 0;
  bool dead = false;  // close at the end of this step
  Role role = Role::kNone;
  // Who it is (Authenticator): the tenant after AUTH, and whether it sees every job and may ABORT
  // (an operator, or anyone on a switch without --auth-file).
  int tenant = kAnonymous;
  bool privileged = false;
  std::string nonce;  // the CHALLENGE awaiting its AUTH, "" for none
  // An AUTH whose answer backoff defers (Authenticator): checked on arrival, answered at `at_ns`; the
  // connection's later requests wait for it, as behind a held JOIN.
  struct DeferredAuth {
    uint64_t at_ns = 0;
    int tenant = kAnonymous;  // >= 0: it succeeded, and the connection becomes this tenant's
    std::string reply;        // the OK line, or the ERR auth message
  };
  std::optional<DeferredAuth> auth_wait;
  // With an auth file (Authenticator::check_deadlines): since when it has been outside a job (the handshake
  // deadline of an unauthenticated connection), and since when its input has ended in an incomplete line (0:
  // not).
  uint64_t outside_since_ns = 0;
  uint64_t partial_since_ns = 0;
  std::string job_name;  // kPending, kJoined, kLeft, kUplink: the job's scoped name ("tenant/name")
  uint32_t job_id = 0;   // kJoined, kLeft; kUplink: the leaf's job once it started
  uint16_t rank = 0;

  // kUplink: what the spine's next reply lines answer, in order (the forwarded JOIN, a forwarded
  // LEAVE), and whether the leaf closed it on purpose (else its closing means the spine is gone).
  enum class UplinkReply { kJoin, kLeave };
  std::deque<UplinkReply> uplink_expect;
  bool uplink_closed_by_us = false;
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
  bool input_paused() const { return !stream.empty() && in.buffered() > kMaxPausedInput; }
};

struct PendingJob {
  std::string name, token;  // name: scoped ("tenant/name" for a tenant's job)
  int tenant = kAnonymous;
  uint32_t types = 0;        // JOIN types=: extra element types
  uint32_t deadline_us = 0;  // JOIN deadline_us= (0: none) and quorum= (docs/protocol.md §3.1)
  uint16_t quorum = 0;
  uint16_t world = 0;
  uint8_t wire = 0;
  uint64_t deadline_ns = 0;
  size_t memory = 0;
  std::shared_ptr<const OptimizerSpec> optimizer;  // optimizer jobs only
  std::vector<uint64_t> conn;                      // per rank: connection id, 0 = not joined yet
  std::vector<uint16_t> port;
  unsigned joined = 0;
  // At a spine: the rank's JOIN came from a leaf (leaf=1), and the worker's own address (peer=).
  std::vector<uint8_t> leaf;
  std::vector<Endpoint> peer;
  // At a leaf: per rank, the connection that forwards its JOIN to the spine; how many the spine
  // accepted, and what it answered (the spine's job, slots, payload, ports, peers).
  std::vector<uint64_t> uplink_conn;
  unsigned uplink_ok = 0;
  std::map<std::string, std::string> spine_reply;
};

struct LiveJob {
  uint32_t id = 0;
  int tenant = kAnonymous;
  JobSpec spec;
  std::string token;
  size_t memory = 0;
  std::vector<uint64_t> conn;  // per rank: connection id, 0 = gone (left or closed)
  unsigned present = 0;
  // Per rank: the rank whose DATA stands for it (itself, or at a spine the lowest rank a leaf
  // forwarded with it), and whether it left with LEAVE (a group leaves when all of it has).
  std::vector<uint16_t> leader;
  std::vector<uint8_t> left;
  // Per rank: the switch its LEAVE said it lost (LEAVE lost=, a sharded job), "" for none; STATUS and
  // EVENT aborted carry it for the rank that aborted the job, which explains the abort.
  std::vector<std::string> lost;
  std::string peers;  // STATUS peers=: each rank's own UDP address, "-" for one this switch does not serve
  // At a leaf: per rank, its connection to the spine; the spine's address; the keys the spine's
  // EVENT carried beyond the reason (a mismatch's, for the members' EVENT).
  std::vector<uint64_t> uplink_conn;
  std::string spine;
  std::string spine_event_keys;
  bool aborted = false;
  std::string abort_why;
  uint64_t start_ns = 0, last_request_ns = 0;
};

// Texts of replies, events and log lines that several files write (queries.cpp defines them).
// ` mismatch_seq=.. mismatch_offset=.. mismatch_ranks=a,b ...`: the two contributions that could not
// be summed (held, arriving).
std::string mismatch_keys(const Mismatch& m);
std::string ranks_text(uint64_t mask);         // "0,3,5"
std::string endpoint_text(const Endpoint& e);  // "10.0.0.1:7701"

}  // namespace gradswitch::control
