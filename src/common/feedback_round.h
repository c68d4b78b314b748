// Error feedback's step on a lossy wire (python/gradswitch/torch/error_feedback.py), in one pass over
// memory: what a rank's own encoding of its gradient loses, kept for the next step. The encodings are
// the worker's own (the Kernels table), so the residual is exactly what the wire dropped.
// Local to the rank: the round trip is a rank's own view of its encoding, and nothing here changes
// what travels (include/gradswitch/wire.h, docs/protocol.md).
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradswitch {

// For n float32 values: grad += residual when `add` (skipped otherwise, so a -0.0 keeps its sign), then
// residual = grad - decode(encode(grad)) on `wire` (GS_ELEM_MX8, _FLOAT16 or _BFLOAT16; mx8 blocks of
// 32 from grad[0], as the worker's chunks start on block boundaries), a non-finite difference kept as 0
// so that one NaN or infinity does not poison every later step. grad keeps the unrounded sum: the
// worker encodes it again as it sends. On GS_ELEM_FLOAT32 (which loses nothing) and GS_ELEM_FIXED32
// (whose scale the ranks agree per chunk, so no rank can reproduce its rounding alone) the residual
// becomes 0: what a deadline job's sums lack of a rank's values fills it (Group::allreduce_async's
// `unsummed`). False, with nothing changed, for any other wire.
bool feedback_round(float* grad, float* residual, size_t n, bool add, uint8_t wire);

}  // namespace gradswitch
