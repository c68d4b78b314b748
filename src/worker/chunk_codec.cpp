// Chunk encoding and decoding per wire type (see chunk_codec.h).
#include "worker/chunk_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/fixed_point.h"
#include "common/kernels.h"
#include "gradswitch/wire.h"
#include "worker/errors.h"

namespace gradswitch::worker {

Chunking make_chunking(size_t count, uint8_t elem, uint32_t payload_bytes) {
  Chunking ch;
  ch.elem = elem;
  ch.elem_bytes = gs_elem_size(elem);
  ch.per = static_cast<uint32_t>(std::min<size_t>(payload_bytes / ch.elem_bytes, 0xFFFF));
  ch.count = count;
  ch.chunks = (count + ch.per - 1) / ch.per;
  return ch;
}

size_t encode_chunk(const Chunking& ch, const void* base, size_t c, int scale, uint8_t* payload) {
  const Kernels& K = kernels();
  size_t off = ch.offset(c), n = ch.size(c);
  const float* f = static_cast<const float*>(base) + off;
  switch (ch.elem) {
    case GS_ELEM_INT32:
    case GS_ELEM_FLOAT32:
      std::memcpy(payload, static_cast<const uint8_t*>(base) + off * 4, n * 4);
      break;
    case GS_ELEM_FLOAT16:
      K.f32_to_f16(reinterpret_cast<uint16_t*>(payload), f, n);
      break;
    case GS_ELEM_BFLOAT16:
      K.f32_to_bf16(reinterpret_cast<uint16_t*>(payload), f, n);
      break;
    case GS_ELEM_FIXED32:
      K.quantize(reinterpret_cast<int32_t*>(payload), f, n, std::ldexp(1.0f, scale));
      break;
  }
  return n * ch.elem_bytes;
}

void decode_chunk(const Chunking& ch, const uint8_t* payload, size_t c, int scale, void* base) {
  const Kernels& K = kernels();
  size_t off = ch.offset(c), n = ch.size(c);
  float* f = static_cast<float*>(base) + off;
  switch (ch.elem) {
    case GS_ELEM_INT32:
    case GS_ELEM_FLOAT32:
      std::memcpy(static_cast<uint8_t*>(base) + off * 4, payload, n * 4);
      break;
    case GS_ELEM_FLOAT16:
      K.f16_to_f32(f, reinterpret_cast<const uint16_t*>(payload), n);
      break;
    case GS_ELEM_BFLOAT16:
      K.bf16_to_f32(f, reinterpret_cast<const uint16_t*>(payload), n);
      break;
    case GS_ELEM_FIXED32:
      K.dequantize(f, reinterpret_cast<const int32_t*>(payload), n, std::ldexp(1.0f, -scale));
      break;
  }
}

void accumulate_chunk(const Chunking& ch, const void* base, size_t c, int scale, const uint8_t* in,
                      uint8_t* out) {
  const Kernels& K = kernels();
  size_t off = ch.offset(c), n = ch.size(c);
  const float* f = static_cast<const float*>(base) + off;
  switch (ch.elem) {
    case GS_ELEM_INT32:
      std::memcpy(out, in, n * 4);
      K.add_i32(reinterpret_cast<int32_t*>(out), static_cast<const int32_t*>(base) + off, n);
      break;
    case GS_ELEM_FLOAT32:
      std::memcpy(out, in, n * 4);
      K.add_f32(reinterpret_cast<float*>(out), f, n);
      break;
    case GS_ELEM_FIXED32:
      K.quantize(reinterpret_cast<int32_t*>(out), f, n, std::ldexp(1.0f, scale));
      K.add_i32(reinterpret_cast<int32_t*>(out), reinterpret_cast<const int32_t*>(in), n);
      break;
    case GS_ELEM_FLOAT16:
    case GS_ELEM_BFLOAT16: {
      float wide[4096];  // fp32 staging, in pieces (a 9000-byte MTU chunk holds 4470 values)
      size_t done = 0;
      while (done < n) {
        size_t k = std::min(n - done, sizeof wide / sizeof wide[0]);
        const uint16_t* src = reinterpret_cast<const uint16_t*>(in) + done;
        uint16_t* dst = reinterpret_cast<uint16_t*>(out) + done;
        if (ch.elem == GS_ELEM_FLOAT16)
          K.f16_to_f32(wide, src, k);
        else
          K.bf16_to_f32(wide, src, k);
        K.add_f32(wide, f + done, k);
        if (ch.elem == GS_ELEM_FLOAT16)
          K.f32_to_f16(dst, wide, k);
        else
          K.f32_to_bf16(dst, wide, k);
        done += k;
      }
      break;
    }
  }
}

size_t encode_sum(const Chunking& ch, const void* base, size_t c, uint8_t* payload) {
  if (ch.elem != GS_ELEM_FIXED32) return encode_chunk(ch, base, c, 0, payload);
  size_t n = ch.size(c);
  std::memcpy(payload, static_cast<const float*>(base) + ch.offset(c), n * 4);
  return n * 4;
}

void decode_sum(const Chunking& ch, const uint8_t* payload, size_t c, void* base) {
  if (ch.elem != GS_ELEM_FIXED32) return decode_chunk(ch, payload, c, 0, base);
  std::memcpy(static_cast<float*>(base) + ch.offset(c), payload, ch.size(c) * 4);
}

void block_exponents(const Chunking& ch, const float* src, std::vector<int8_t>* exps) {
  const Kernels& K = kernels();
  exps->resize(ch.chunks);
  for (size_t c = 0; c < ch.chunks; ++c) {
    size_t off = ch.offset(c), n = ch.size(c);
    float m = K.max_abs(src + off, n);
    if (!(m < 0x1p127f)) {
      size_t bad = off;
      for (size_t i = off; i < off + n; ++i)
        if (!(std::fabs(src[i]) < 0x1p127f)) {
          bad = i;
          break;
        }
      throw InvalidArgument(
          "gradswitch: wire fixed32 cannot carry element " + std::to_string(bad) + " = " +
          std::to_string(src[bad]) +
          ": values must be finite with magnitude below 2^127. Nothing was sent for this "
          "allreduce; the other ranks fail the same way only if their tensors hold such values "
          "too (otherwise they time out). Use wire='float32' to reduce non-finite values.");
    }
    (*exps)[c] = block_exponent(m);
  }
}

}  // namespace gradswitch::worker
