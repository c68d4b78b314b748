// Counters: one writer (the data thread that owns them), any number of readers.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "common/counter.h"

namespace gradswitch {

enum class DropReason : uint8_t {
  kNone = 0,
  kShortPacket,  // shorter than the 32-byte header
  kBadMagic,
  kBadVersion,
  kBadType,     // not a DATA message
  kUnknownJob,  // no live job with this id
  kWrongKey,
  kBadRank,    // rank >= world size
  kBadSource,  // DATA not from the address its rank joined from; at a leaf, a RESULT or ABORT not from the
               // spine's data ports
  kSlotOutOfRange,
  kWrongThread,  // slot owned by another thread: sent to the wrong data port
  kBadElemType,
  kBadLength,     // count disagrees with the datagram length, or exceeds the payload size
  kStaleRound,    // a round other than the one the slot version holds
  kInconsistent,  // count, type, scale or LAST differ from the round's first one: the job is aborted
  kBadOffset,     // optimizer job: chunk outside the parameters or not on a chunk boundary
  kJobAborted,    // answered with an ABORT message
  kUplinkStale,   // leaf: a spine RESULT for no round that waits for one (a second answer, or old)
  kRankLeft,      // from a rank that left the job with LEAVE
  kLate,          // a contribution to a round its deadline closed without it: answered with the result
  kPinned,        // a new round for a slot version whose round a rank may still lack (§3.1: its pins)
  kCount_
};
inline constexpr size_t kDropReasons = static_cast<size_t>(DropReason::kCount_);

const char* drop_reason_name(DropReason r);
// The checks of what makes a packet its job's (id, key, rank, source address), which a guess fails:
// which of them dropped it would tell a guesser how much it got right, so everyone but operators
// sees them as one reason, kRejectedName (docs/security.md "How the side channels were closed").
bool is_secret_check(DropReason r);
inline constexpr const char* kRejectedName = "rejected";

struct CounterValues {
  uint64_t pkts_in = 0, bytes_in = 0, pkts_out = 0, bytes_out = 0;
  uint64_t completed = 0;      // slot rounds completed (results multicast)
  uint64_t duplicates = 0;     // contributions already counted, ignored
  uint64_t retx_answered = 0;  // retransmissions answered from the shadow copy
  uint64_t sent_up = 0;        // leaf: rounds complete in the rack, sent up to the spine
  uint64_t resent_up = 0;      // leaf: of those, sent again after their loss timer
  uint64_t held_answered = 0;  // retransmitted duplicates of an open round answered with HELD
  uint64_t lacking_told = 0;   // HELDs to ranks an open round lacked, sent when another rank resent
  uint64_t partial = 0;        // rounds closed without every contribution (deadline, concessions: §3.1)
  uint64_t missed = 0;         // contributions those rounds lacked (from ranks that did not concede)
  uint64_t conceded = 0;       // members' arrivals at a round without a contribution (GS_FLAG_CONCEDE)
  std::array<uint64_t, kDropReasons> drops{};
  uint64_t drops_total() const {
    uint64_t s = 0;
    for (size_t i = 1; i < kDropReasons; ++i) s += drops[i];
    return s;
  }
  CounterValues& operator+=(const CounterValues& o);
  // "pkts_in=1 bytes_in=2 ... drop.wrong_key=0 ..." with an optional key prefix. Without
  // `per_reason` the secret checks' drops are one key, drop.rejected= (is_secret_check).
  std::string format(const std::string& prefix, bool per_reason = true) const;
};

class Counters {
 public:
  void drop(DropReason r) { counter_add(drops[static_cast<size_t>(r)]); }
  CounterValues read() const;

  std::atomic<uint64_t> pkts_in{0}, bytes_in{0}, pkts_out{0}, bytes_out{0};
  std::atomic<uint64_t> completed{0}, duplicates{0}, retx_answered{0}, held_answered{0}, lacking_told{0};
  std::atomic<uint64_t> partial{0}, missed{0}, conceded{0};
  std::atomic<uint64_t> sent_up{0}, resent_up{0};
  std::array<std::atomic<uint64_t>, kDropReasons> drops{};
};

}  // namespace gradswitch
