// The DPDK switch's two tables, shared by every lcore without locks: the MAC table (which port a
// MAC address was last seen on) and the neighbour table (which MAC an IPv4 address has, to address
// results). Both are open-addressed arrays of atomic words; entries age after `age_s` seconds.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "switch/io/dpdk/frames.h"

namespace gradswitch::dpdk {

// What both tables are: an open-addressed array of `Entry`, probed `kProbe` entries from a key's
// hash, whose live entries are counted and listed. An `Entry` says whether it is live (not aged
// after `age_s` seconds) and appends its line ("<kind>.<key>=<value>\n").
template <class Entry>
class AgingTable {
 public:
  static constexpr unsigned kSize = 4096, kProbe = 16;
  unsigned live(uint32_t now_s, uint32_t age_s) const {
    unsigned n = 0;
    for (const Entry& e : entries_) n += e.live(now_s, age_s);
    return n;
  }
  // Appends one line per live entry (STATUS).
  void dump(std::string* out, uint32_t now_s, uint32_t age_s) const {
    for (const Entry& e : entries_)
      if (e.live(now_s, age_s)) e.append(out);
  }

 protected:
  Entry entries_[kSize];
};

// MAC -> port. One 64-bit word per entry: MAC in the low 48 bits, port + 1 in the high 16, so an
// entry is read and written atomically; `seen_s` ages it. Entries are never removed: an aged one
// reads as missing and is reused by the next new address that probes it.
struct MacEntry {
  std::atomic<uint64_t> word{0};
  std::atomic<uint32_t> seen_s{0};
  bool live(uint32_t now_s, uint32_t age_s) const;
  void append(std::string* out) const;  // "mac.<MAC>=<port>\n"
};
class MacTable : public AgingTable<MacEntry> {
 public:
  // The port `mac` was last seen on, or -1 (unknown or aged out).
  int lookup(const MacAddr& mac, uint32_t now_s, uint32_t age_s) const;
  // Returns true when the address was new or moved. A full probe region leaves it unknown (flooded).
  bool learn(const MacAddr& mac, unsigned port, uint32_t now_s, uint32_t age_s);
};

// IPv4 -> MAC. An entry's key is claimed once (compare-and-swap from 0) and keeps its address; the
// MAC word carries a valid bit.
struct NeighbourEntry {
  std::atomic<uint32_t> ip{0};
  std::atomic<uint32_t> seen_s{0};
  std::atomic<uint64_t> mac{0};
  bool live(uint32_t now_s, uint32_t age_s) const;
  void append(std::string* out) const;  // "neigh.<IP>=<MAC>\n"
};
class NeighbourTable : public AgingTable<NeighbourEntry> {
 public:
  bool lookup(uint32_t ip_be, MacAddr* mac, uint32_t now_s, uint32_t age_s) const;
  // Ignores addresses that cannot be a neighbour (0.0.0.0, broadcast, multicast or zero MAC).
  void learn(uint32_t ip_be, const MacAddr& mac, uint32_t now_s);
};

// Where ordinary traffic goes: flooded (broadcast, multicast, unknown unicast), filtered (the
// destination is on the input port) or forwarded to one port.
struct L2Destination {
  enum Kind : uint8_t { kFlood, kFilter, kForward } kind;
  unsigned port = 0;  // kForward
};
L2Destination l2_destination(const MacTable& macs, const MacAddr& dst, unsigned in_port, uint32_t now_s,
                             uint32_t age_s);

}  // namespace gradswitch::dpdk
