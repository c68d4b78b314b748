// Serial-number order of allreduce sequence numbers (RFC 1982 style), so that `seq` may wrap at
// 2^32: the one definition the switch, the worker and the ring share (docs/protocol.md section 3).
#pragma once

#include <cstdint>

namespace gradswitch {

// a comes after b: the distance from b to a, as a signed 32-bit number, is positive.
inline bool seq_after(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(a - b) > 0;
}
inline bool seq_at_or_after(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(a - b) >= 0;
}

// Is round (seq, offset) newer than round (than_seq, than_offset)? Successive rounds of one slot
// version belong to a later allreduce or to a later chunk of the same one.
inline bool round_is_newer(uint32_t seq, uint32_t offset, uint32_t than_seq, uint32_t than_offset) {
  return seq_after(seq, than_seq) || (seq == than_seq && offset > than_offset);
}

}  // namespace gradswitch
