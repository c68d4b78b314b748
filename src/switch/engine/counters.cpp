// The engine's counters: drop reasons' names, and reading and formatting a data thread's counters
// for STATS and the metrics port.

#include "switch/engine/counters.h"

namespace gradswitch {

const char* drop_reason_name(DropReason r) {
  switch (r) {
    case DropReason::kNone:
      return "none";
    case DropReason::kShortPacket:
      return "short_packet";
    case DropReason::kBadMagic:
      return "bad_magic";
    case DropReason::kBadVersion:
      return "bad_version";
    case DropReason::kBadType:
      return "bad_type";
    case DropReason::kUnknownJob:
      return "unknown_job";
    case DropReason::kWrongKey:
      return "wrong_key";
    case DropReason::kBadRank:
      return "bad_rank";
    case DropReason::kBadSource:
      return "bad_source";
    case DropReason::kSlotOutOfRange:
      return "slot_out_of_range";
    case DropReason::kWrongThread:
      return "wrong_thread";
    case DropReason::kBadElemType:
      return "bad_elem_type";
    case DropReason::kBadLength:
      return "bad_length";
    case DropReason::kStaleRound:
      return "stale_round";
    case DropReason::kInconsistent:
      return "inconsistent";
    case DropReason::kBadOffset:
      return "bad_offset";
    case DropReason::kJobAborted:
      return "job_aborted";
    case DropReason::kUplinkStale:
      return "uplink_stale";
    case DropReason::kRankLeft:
      return "rank_left";
    case DropReason::kLate:
      return "late";
    case DropReason::kPinned:
      return "pinned";
    case DropReason::kCount_:
      break;
  }
  return "unknown";
}

bool is_secret_check(DropReason r) {
  return r == DropReason::kUnknownJob || r == DropReason::kWrongKey || r == DropReason::kBadRank ||
         r == DropReason::kBadSource;
}

CounterValues& CounterValues::operator+=(const CounterValues& o) {
  pkts_in += o.pkts_in;
  bytes_in += o.bytes_in;
  pkts_out += o.pkts_out;
  bytes_out += o.bytes_out;
  completed += o.completed;
  duplicates += o.duplicates;
  retx_answered += o.retx_answered;
  sent_up += o.sent_up;
  resent_up += o.resent_up;
  held_answered += o.held_answered;
  lacking_told += o.lacking_told;
  partial += o.partial;
  missed += o.missed;
  conceded += o.conceded;
  for (size_t i = 0; i < kDropReasons; ++i) drops[i] += o.drops[i];
  return *this;
}

std::string CounterValues::format(const std::string& prefix, bool per_reason) const {
  std::string s;
  auto add = [&](const char* name, uint64_t v) {
    if (!s.empty()) s += ' ';
    s += prefix;
    s += name;
    s += '=';
    s += std::to_string(v);
  };
  add("pkts_in", pkts_in);
  add("bytes_in", bytes_in);
  add("pkts_out", pkts_out);
  add("bytes_out", bytes_out);
  add("completed", completed);
  add("duplicates", duplicates);
  add("retx_answered", retx_answered);
  add("sent_up", sent_up);
  add("resent_up", resent_up);
  add("held_answered", held_answered);
  add("lacking_told", lacking_told);
  add("partial", partial);
  add("missed", missed);
  add("conceded", conceded);
  add("drops", drops_total());
  uint64_t rejected = 0;
  for (size_t i = 1; i < kDropReasons; ++i)
    if (is_secret_check(static_cast<DropReason>(i))) rejected += drops[i];
  if (!per_reason) add((std::string("drop.") + kRejectedName).c_str(), rejected);
  for (size_t i = 1; i < kDropReasons; ++i) {
    if (!per_reason && is_secret_check(static_cast<DropReason>(i))) continue;
    std::string name = std::string("drop.") + drop_reason_name(static_cast<DropReason>(i));
    add(name.c_str(), drops[i]);
  }
  return s;
}

CounterValues Counters::read() const {
  CounterValues v;
  v.pkts_in = pkts_in.load(std::memory_order_relaxed);
  v.bytes_in = bytes_in.load(std::memory_order_relaxed);
  v.pkts_out = pkts_out.load(std::memory_order_relaxed);
  v.bytes_out = bytes_out.load(std::memory_order_relaxed);
  v.completed = completed.load(std::memory_order_relaxed);
  v.duplicates = duplicates.load(std::memory_order_relaxed);
  v.retx_answered = retx_answered.load(std::memory_order_relaxed);
  v.sent_up = sent_up.load(std::memory_order_relaxed);
  v.resent_up = resent_up.load(std::memory_order_relaxed);
  v.held_answered = held_answered.load(std::memory_order_relaxed);
  v.lacking_told = lacking_told.load(std::memory_order_relaxed);
  v.partial = partial.load(std::memory_order_relaxed);
  v.missed = missed.load(std::memory_order_relaxed);
  v.conceded = conceded.load(std::memory_order_relaxed);
  for (size_t i = 0; i < kDropReasons; ++i) v.drops[i] = drops[i].load(std::memory_order_relaxed);
  return v;
}

}  // namespace gradswitch
