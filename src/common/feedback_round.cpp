// feedback_round (feedback_round.h): pieces of a few KB, encoded and decoded through the Kernels table's
// run-time-selected variant, so the pass stays in cache and runs at the wire kernels' speed.
#include "common/feedback_round.h"

#include <cmath>
#include <cstring>

#include "common/kernels.h"
#include "gradswitch/wire.h"

namespace gradswitch {

namespace {

constexpr size_t kPiece = 4096;  // a multiple of GS_MX8_BLOCK: blocks stay aligned to grad[0]
static_assert(kPiece % GS_MX8_BLOCK == 0);

// What `wire` turns n (<= kPiece) values into at the switch, as float32.
void round_trip(const Kernels& k, uint8_t wire, const float* x, float* q, size_t n) {
  alignas(64) uint8_t encoded[kPiece * 2 + kPiece / GS_MX8_BLOCK];
  auto* halves = reinterpret_cast<uint16_t*>(encoded);
  switch (wire) {
    case GS_ELEM_MX8:
      k.f32_to_mx8(encoded, x, n);
      k.mx8_to_f32(q, encoded, n);
      break;
    case GS_ELEM_FLOAT16:
      k.f32_to_f16(halves, x, n);
      k.f16_to_f32(q, halves, n);
      break;
    default:  // GS_ELEM_BFLOAT16
      k.f32_to_bf16(halves, x, n);
      k.bf16_to_f32(q, halves, n);
      break;
  }
}

}  // namespace

bool feedback_round(float* grad, float* residual, size_t n, bool add, uint8_t wire) {
  if (wire == GS_ELEM_FLOAT32 || wire == GS_ELEM_FIXED32) {
    if (add)
      for (size_t i = 0; i < n; ++i) grad[i] += residual[i];
    std::memset(residual, 0, n * sizeof(float));
    return true;
  }
  if (wire != GS_ELEM_MX8 && wire != GS_ELEM_FLOAT16 && wire != GS_ELEM_BFLOAT16) return false;
  const Kernels& k = kernels();
  alignas(64) float q[kPiece];
  for (size_t at = 0; at < n; at += kPiece) {
    const size_t m = n - at < kPiece ? n - at : kPiece;
    float* g = grad + at;
    float* r = residual + at;
    if (add)
      for (size_t i = 0; i < m; ++i) g[i] += r[i];
    round_trip(k, wire, g, q, m);
    for (size_t i = 0; i < m; ++i) {
      const float d = g[i] - q[i];
      r[i] = std::isfinite(d) ? d : 0.0f;
    }
  }
  return true;
}

}  // namespace gradswitch
