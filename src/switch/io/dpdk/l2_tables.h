// The DPDK switch's two tables, shared by every lcore without locks: the MAC table (which port a
// MAC address was last seen on) and the neighbour table (which MAC an IPv4 address has, to address
// results). Both are open-addressed arrays of atomic words; entries age after `age_s` seconds.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "switch/io/dpdk/frames.h"

namespace gradswitch::dpdk {

// MAC -> port. One 64-bit word per entry: MAC in the low 48 bits, port + 1 in the high 16, so an
// entry is read and written atomically; `seen_s` ages it. Entries are never removed: an aged one
// reads as missing and is reused by the next new address that probes it.
class MacTable {
 public:
  static constexpr unsigned kSize = 4096, kProbe = 16;
  // The port `mac` was last seen on, or -1 (unknown or aged out).
  int lookup(const MacAddr& mac, uint32_t now_s, uint32_t age_s) const;
  // Returns true when the address was new or moved. A full probe region leaves it unknown (flooded).
  bool learn(const MacAddr& mac, unsigned port, uint32_t now_s, uint32_t age_s);
  unsigned live(uint32_t now_s, uint32_t age_s) const;
  // Appends "mac.<MAC>=<port>\n" per live entry.
  void dump(std::string* out, uint32_t now_s, uint32_t age_s) const;

 private:
  struct Entry {
    std::atomic<uint64_t> word{0};
    std::atomic<uint32_t> seen_s{0};
  };
  Entry entries_[kSize];
};

// IPv4 -> MAC. An entry's key is claimed once (compare-and-swap from 0) and keeps its address; the
// MAC word carries a valid bit.
class NeighbourTable {
 public:
  static constexpr unsigned kSize = 4096, kProbe = 16;
  bool lookup(uint32_t ip_be, MacAddr* mac, uint32_t now_s, uint32_t age_s) const;
  // Ignores addresses that cannot be a neighbour (0.0.0.0, broadcast, multicast or zero MAC).
  void learn(uint32_t ip_be, const MacAddr& mac, uint32_t now_s);
  unsigned live(uint32_t now_s, uint32_t age_s) const;
  // Appends "neigh.<IP>=<MAC>\n" per live entry.
  void dump(std::string* out, uint32_t now_s, uint32_t age_s) const;

 private:
  struct Entry {
    std::atomic<uint32_t> ip{0};
    std::atomic<uint32_t> seen_s{0};
    std::atomic<uint64_t> mac{0};
  };
  Entry entries_[kSize];
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
