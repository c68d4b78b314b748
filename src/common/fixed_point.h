// fixed32: SwitchML-style block floating point agreed through the switch.
//
// Every worker computes, for each chunk, the block exponent E of its own values
// (|x| < 2^E for every element). The switch keeps the maximum over workers. With the agreed
// E and N workers, every worker quantises with the scale 2^S, S = 30 - E - ceil(log2 N), so
// that each |q| <= 2^(30 - ceil(log2 N)) and the sum of N of them fits in int32 exactly.
// Sums of int32 are exact and independent of arrival order; the result is the integer sum
// times 2^-S. Error per element: at most N * 2^(-S-1) (each worker rounds once).
#pragma once

#include <cmath>
#include <cstdint>

#include "gradswitch/wire.h"

namespace gradswitch {

inline constexpr int kMinBlockExp = -127;
inline constexpr int kMaxBlockExp = 127;

inline int ceil_log2(unsigned n) {
  int l = 0;
  while ((1u << l) < n) ++l;
  return l;
}

// Block exponent of a chunk whose largest magnitude is `max_abs`: the least E with
// max_abs < 2^E, clamped below at kMinBlockExp; GS_EXP_NONE for an all-zero block.
// The caller rejects non-finite values and values >= 2^127 first.
inline int8_t block_exponent(float max_abs) {
  if (max_abs == 0.0f) return GS_EXP_NONE;
  int e = 0;
  std::frexp(max_abs, &e);  // max_abs = m * 2^e, m in [0.5, 1)  =>  max_abs < 2^e
  if (e < kMinBlockExp) e = kMinBlockExp;
  return static_cast<int8_t>(e);
}

// The same for a chunk of doubles (values below 2^-127 clamp as for floats).
inline int8_t block_exponent(double max_abs) {
  if (max_abs == 0.0) return GS_EXP_NONE;
  int e = 0;
  std::frexp(max_abs, &e);
  if (e < kMinBlockExp) e = kMinBlockExp;
  return static_cast<int8_t>(e);
}

// Scale exponent S for an agreed block exponent, clamped so 2^S and 2^-S are normal floats.
inline int scale_exponent(int8_t block_exp, unsigned world) {
  if (block_exp == GS_EXP_NONE) return 0;
  int s = 30 - block_exp - ceil_log2(world);
  if (s > 126) s = 126;
  if (s < -126) s = -126;
  return s;
}

}  // namespace gradswitch
