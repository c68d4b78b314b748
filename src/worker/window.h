// A worker's pool of slots: per slot, the round in flight (its header as fields, its packet
// bytes, its timer) and the version its next round uses. Versions persist across allreduces
// (every rank flips them in the same order: docs/protocol.md section 4). Retransmissions re-encode
// the kept header with RETX set; nothing is patched into or re-read from the packet bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/loss_detector.h"
#include "gradswitch/wire.h"

namespace gradswitch::worker {

// What a slot's outstanding round carries, beyond its header.
struct SlotRound {
  size_t chunk = 0;
  bool bootstrap = false;      // fixed32 exponent round (count 0) preceding `chunk`
  int8_t scale = GS_EXP_NONE;  // fixed32: the S the chunk in flight was quantised with
  gs_header hdr{};             // as last sent
  uint32_t len = 0;            // datagram length (header + payload)
};

class Window {
 public:
  // `slots` slots whose packets hold up to `payload_bytes` after the header.
  Window(unsigned slots, uint32_t payload_bytes);

  unsigned slots() const { return static_cast<unsigned>(rounds_.size()); }
  SlotRound& round(unsigned s) { return rounds_[s]; }
  const SlotRound& round(unsigned s) const { return rounds_[s]; }
  RoundTimer& timer(unsigned s) { return timers_[s]; }
  const RoundTimer& timer(unsigned s) const { return timers_[s]; }
  RoundTimer* timers() { return timers_.data(); }

  // The version a new round in slot `s` uses; flips the slot's next version.
  uint8_t claim_version(unsigned s) {
    uint8_t v = next_version_[s];
    next_version_[s] ^= 1;
    return v;
  }
  // Where a new round's payload goes (after the header).
  uint8_t* payload(unsigned s) { return buffer(s) + GS_HEADER_BYTES; }
  // Sets the round's header and length (header + `payload_len`) and encodes the header.
  void seal(unsigned s, const gs_header& h, size_t payload_len);
  // Marks the round as a retransmission (flag RETX) in its header and packet.
  void mark_retransmission(unsigned s);
  const uint8_t* packet(unsigned s) const { return mem_.data() + cap_ * s; }
  // The slot whose packet() this is.
  unsigned slot_of(const uint8_t* packet) const {
    return static_cast<unsigned>((packet - mem_.data()) / cap_);
  }

 private:
  uint8_t* buffer(unsigned s) { return mem_.data() + cap_ * s; }

  size_t cap_;  // bytes per packet buffer (header + payload, rounded up to a cache line)
  std::vector<uint8_t> mem_;
  std::vector<SlotRound> rounds_;
  std::vector<RoundTimer> timers_;  // contiguous: LossDetector::scan walks them
  std::vector<uint8_t> next_version_;
};

}  // namespace gradswitch::worker
