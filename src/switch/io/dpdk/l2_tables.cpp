// The lock-free MAC and neighbour tables (l2_tables.h).
#include "switch/io/dpdk/l2_tables.h"

#include <cstring>

namespace gradswitch::dpdk {
namespace {

constexpr uint64_t kMacMask = (uint64_t{1} << 48) - 1;
constexpr uint64_t kNeighbourValid = uint64_t{1} << 63;

uint64_t mac_key(const MacAddr& m) {
  uint64_t k = 0;
  std::memcpy(&k, m.bytes, 6);
  return k;  // 48 bits, never 0 for a learnable address
}

MacAddr mac_of_key(uint64_t w) {
  MacAddr m;
  std::memcpy(m.bytes, &w, 6);
  return m;
}

uint32_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

bool aged(uint32_t now_s, uint32_t seen_s, uint32_t age_s) {
  return now_s - seen_s > age_s;
}

}  // namespace

int MacTable::lookup(const MacAddr& mac, uint32_t now_s, uint32_t age_s) const {
  const uint64_t key = mac_key(mac);
  for (unsigned i = 0, h = mix(key); i < kProbe; ++i, ++h) {
    const MacEntry& e = entries_[h % kSize];
    const uint64_t w = e.word.load(std::memory_order_relaxed);
    if (w == 0) return -1;
    if ((w & kMacMask) != key) continue;
    if (aged(now_s, e.seen_s.load(std::memory_order_relaxed), age_s)) continue;
    return static_cast<int>(w >> 48) - 1;
  }
  return -1;
}

bool MacTable::learn(const MacAddr& mac, unsigned port, uint32_t now_s, uint32_t age_s) {
  const uint64_t key = mac_key(mac);
  const uint64_t word = key | (uint64_t{port + 1} << 48);
  MacEntry* reuse = nullptr;
  for (unsigned i = 0, h = mix(key); i < kProbe; ++i, ++h) {
    MacEntry& e = entries_[h % kSize];
    uint64_t w = e.word.load(std::memory_order_relaxed);
    if ((w & kMacMask) == key) {
      const bool changed = w != word;
      if (changed) e.word.store(word, std::memory_order_relaxed);
      // Stores only when something changed: a hot entry stays shared in every lcore's cache.
      if (changed || e.seen_s.load(std::memory_order_relaxed) != now_s)
        e.seen_s.store(now_s, std::memory_order_relaxed);
      return changed;
    }
    if (w == 0) {
      if (reuse) break;
      e.seen_s.store(now_s, std::memory_order_relaxed);
      if (e.word.compare_exchange_strong(w, word, std::memory_order_release)) return true;
      if ((w & kMacMask) == key) return false;  // another lcore learned it just now
      continue;
    }
    if (!reuse && aged(now_s, e.seen_s.load(std::memory_order_relaxed), age_s)) reuse = &e;
  }
  if (!reuse) return false;
  reuse->seen_s.store(now_s, std::memory_order_relaxed);
  reuse->word.store(word, std::memory_order_relaxed);
  return true;
}

// A dump reads an entry's words again after live(): a live entry stays live with a word that is
// as valid (a MAC entry's word is never 0 again, a neighbour's IP and valid bit never go).
bool MacEntry::live(uint32_t now_s, uint32_t age_s) const {
  return word.load(std::memory_order_relaxed) && !aged(now_s, seen_s.load(std::memory_order_relaxed), age_s);
}

void MacEntry::append(std::string* out) const {
  const uint64_t w = word.load(std::memory_order_relaxed);
  *out += "mac." + mac_to_string(mac_of_key(w)) + "=" + std::to_string((w >> 48) - 1) + "\n";
}

bool NeighbourTable::lookup(uint32_t ip_be, MacAddr* mac, uint32_t now_s, uint32_t age_s) const {
  for (unsigned i = 0, h = mix(ip_be); i < kProbe; ++i, ++h) {
    const NeighbourEntry& e = entries_[h % kSize];
    const uint32_t k = e.ip.load(std::memory_order_acquire);
    if (k == 0) return false;
    if (k != ip_be) continue;
    const uint64_t w = e.mac.load(std::memory_order_relaxed);
    if (!(w & kNeighbourValid) || aged(now_s, e.seen_s.load(std::memory_order_relaxed), age_s)) return false;
    *mac = mac_of_key(w);
    return true;
  }
  return false;
}

void NeighbourTable::learn(uint32_t ip_be, const MacAddr& mac, uint32_t now_s) {
  if (ip_be == 0 || ip_be == 0xFFFFFFFFu || !mac.is_unicast_host()) return;
  const uint64_t word = mac_key(mac) | kNeighbourValid;
  for (unsigned i = 0, h = mix(ip_be); i < kProbe; ++i, ++h) {
    NeighbourEntry& e = entries_[h % kSize];
    uint32_t k = e.ip.load(std::memory_order_acquire);
    if (k == 0) {
      if (!e.ip.compare_exchange_strong(k, ip_be, std::memory_order_acq_rel) && k != ip_be) continue;
    } else if (k != ip_be) {
      continue;
    }
    if (e.mac.load(std::memory_order_relaxed) != word) e.mac.store(word, std::memory_order_relaxed);
    if (e.seen_s.load(std::memory_order_relaxed) != now_s) e.seen_s.store(now_s, std::memory_order_relaxed);
    return;
  }
}

bool NeighbourEntry::live(uint32_t now_s, uint32_t age_s) const {
  return ip.load(std::memory_order_relaxed) && (mac.load(std::memory_order_relaxed) & kNeighbourValid) &&
         !aged(now_s, seen_s.load(std::memory_order_relaxed), age_s);
}

void NeighbourEntry::append(std::string* out) const {
  const uint32_t k = ip.load(std::memory_order_relaxed);
  *out += "neigh." + ipv4_to_string(k) + "=" +
          mac_to_string(mac_of_key(mac.load(std::memory_order_relaxed))) + "\n";
}

L2Destination l2_destination(const MacTable& macs, const MacAddr& dst, unsigned in_port, uint32_t now_s,
                             uint32_t age_s) {
  if (dst.is_multicast()) return {L2Destination::kFlood};
  const int out = macs.lookup(dst, now_s, age_s);
  if (out < 0) return {L2Destination::kFlood};
  if (static_cast<unsigned>(out) == in_port) return {L2Destination::kFilter};
  return {L2Destination::kForward, static_cast<unsigned>(out)};
}

}  // namespace gradswitch::dpdk
