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

Chunking make_chunking(size_t count, uint8_t elem, uint32_t payload_bytes, DType dtype) {
  Chunking ch;
  ch.elem = elem;
  ch.dtype = elem == GS_ELEM_INT32 ? DType::kInt32 : dtype;  // the int32 wire carries int32 tensors only
  ch.per = static_cast<uint32_t>(std::min<size_t>(gs_max_count(elem, payload_bytes), 0xFFFF));
  if (ch.per == 0)
    throw InvalidArgument("gradswitch: a payload of " + std::to_string(payload_bytes) +
                          " bytes cannot carry one " + gs_elem_name(elem) + " chunk (mx8 needs " +
                          std::to_string(GS_MX8_BLOCK_BYTES) + " bytes for a block)");
  ch.count = count;
  ch.chunks = (count + ch.per - 1) / ch.per;
  return ch;
}

Chunking shard_chunking(const Chunking& whole, unsigned i, unsigned shards) {
  Chunking ch = whole;
  ch.first = whole.tensor_chunk(i);
  ch.stride = whole.stride * shards;
  const size_t total = whole.chunks;
  ch.chunks = i < total ? (total - i + shards - 1) / shards : 0;
  return ch;
}

namespace {

// A float tensor's chunk <-> the wire, for tensors of floats.
void encode_floats(const Kernels& K, uint8_t elem, const float* f, size_t n, int scale, uint8_t* payload) {
  switch (elem) {
    case GS_ELEM_FLOAT32:
      std::memcpy(payload, f, n * 4);
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
    case GS_ELEM_FLOAT64:
      K.f32_to_f64(reinterpret_cast<double*>(payload), f, n);
      break;
    case GS_ELEM_MX8:
      K.f32_to_mx8(payload, f, n);
      break;
  }
}

void decode_floats(const Kernels& K, uint8_t elem, const uint8_t* payload, size_t n, int scale, float* f) {
  switch (elem) {
    case GS_ELEM_FLOAT32:
      std::memcpy(f, payload, n * 4);
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
    case GS_ELEM_FLOAT64:
      K.f64_to_f32(f, reinterpret_cast<const double*>(payload), n);
      break;
    case GS_ELEM_MX8:
      K.mx8_to_f32(f, payload, n);
      break;
  }
}

// Doubles travel as float64 or fixed32 directly; on a 32-, 16- or 8-bit float wire they are rounded
// to float32 first, through this many elements of stack at a time (whole mx8 blocks).
constexpr size_t kStage = 1024;
static_assert(kStage % GS_MX8_BLOCK == 0, "a stage of doubles is whole mx8 blocks");

void encode_doubles(const Kernels& K, uint8_t elem, const double* d, size_t n, int scale, uint8_t* payload) {
  if (elem == GS_ELEM_FLOAT64) {
    std::memcpy(payload, d, n * 8);
  } else if (elem == GS_ELEM_FIXED32) {
    K.quantize_f64(reinterpret_cast<int32_t*>(payload), d, n, std::ldexp(1.0, scale));
  } else {
    float stage[kStage];
    for (size_t i = 0; i < n; i += kStage) {
      size_t m = std::min(kStage, n - i);
      K.f64_to_f32(stage, d + i, m);
      encode_floats(K, elem, stage, m, scale, payload + gs_payload_bytes(elem, i));
    }
  }
}

void decode_doubles(const Kernels& K, uint8_t elem, const uint8_t* payload, size_t n, int scale, double* d) {
  if (elem == GS_ELEM_FLOAT64) {
    std::memcpy(d, payload, n * 8);
  } else if (elem == GS_ELEM_FIXED32) {
    K.dequantize_f64(d, reinterpret_cast<const int32_t*>(payload), n, std::ldexp(1.0, -scale));
  } else {
    float stage[kStage];
    for (size_t i = 0; i < n; i += kStage) {
      size_t m = std::min(kStage, n - i);
      decode_floats(K, elem, payload + gs_payload_bytes(elem, i), m, scale, stage);
      K.f32_to_f64(d + i, stage, m);
    }
  }
}

}  // namespace

size_t encode_chunk(const Chunking& ch, const void* src, size_t c, int scale, uint8_t* payload) {
  const Kernels& K = kernels();
  const size_t off = ch.offset(c), n = ch.size(c);
  if (ch.dtype == DType::kInt32)
    std::memcpy(payload, static_cast<const int32_t*>(src) + off, n * 4);
  else if (ch.dtype == DType::kFloat64)
    encode_doubles(K, ch.elem, static_cast<const double*>(src) + off, n, scale, payload);
  else
    encode_floats(K, ch.elem, static_cast<const float*>(src) + off, n, scale, payload);
  return gs_payload_bytes(ch.elem, n);
}

void decode_chunk(const Chunking& ch, const uint8_t* payload, size_t c, int scale, void* dst) {
  const Kernels& K = kernels();
  const size_t off = ch.offset(c), n = ch.size(c);
  // Received datagrams may sit at any 4-byte offset (GRO trains of MTU-9000 datagrams): the
  // kernels read doubles only from 8-byte aligned memory.
  alignas(64) uint8_t aligned[GS_MAX_PAYLOAD_BYTES];
  if (ch.elem == GS_ELEM_FLOAT64 && reinterpret_cast<uintptr_t>(payload) % 8 != 0 &&
      n * 8 <= sizeof aligned) {
    std::memcpy(aligned, payload, n * 8);
    payload = aligned;
  }
  if (ch.dtype == DType::kInt32)
    std::memcpy(static_cast<int32_t*>(dst) + off, payload, n * 4);
  else if (ch.dtype == DType::kFloat64)
    decode_doubles(K, ch.elem, payload, n, scale, static_cast<double*>(dst) + off);
  else
    decode_floats(K, ch.elem, payload, n, scale, static_cast<float*>(dst) + off);
}

namespace {

// The ring's per-hop functions work on float32 and int32 tensors, on 32- and 16-bit wires.
void refuse_float64_in_ring(const Chunking& ch) {
  if (ch.dtype == DType::kFloat64 || ch.elem == GS_ELEM_FLOAT64 || ch.elem == GS_ELEM_MX8)
    throw UnsupportedType(
        "gradswitch: the ring allreduce carries float32 and int32 tensors on 32- and 16-bit "
        "wires only; reduce float64 tensors, and the mx8 wire, through the switch");
}

}  // namespace

void accumulate_chunk(const Chunking& ch, const void* base, size_t c, int scale, const uint8_t* in,
                      uint8_t* out) {
  refuse_float64_in_ring(ch);
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
  refuse_float64_in_ring(ch);
  if (ch.elem != GS_ELEM_FIXED32) return encode_chunk(ch, base, c, 0, payload);
  size_t n = ch.size(c);
  std::memcpy(payload, static_cast<const float*>(base) + ch.offset(c), n * 4);
  return n * 4;
}

void decode_sum(const Chunking& ch, const uint8_t* payload, size_t c, void* base) {
  refuse_float64_in_ring(ch);
  if (ch.elem != GS_ELEM_FIXED32) return decode_chunk(ch, payload, c, 0, base);
  std::memcpy(static_cast<float*>(base) + ch.offset(c), payload, ch.size(c) * 4);
}

namespace {

template <typename T>
[[noreturn]] void refuse_for_fixed32(const T* src, size_t off, size_t n) {
  size_t bad = off;
  for (size_t i = off; i < off + n; ++i)
    if (!(std::fabs(src[i]) < 0x1p127)) {
      bad = i;
      break;
    }
  throw InvalidArgument("gradswitch: wire fixed32 cannot carry element " + std::to_string(bad) + " = " +
                        std::to_string(src[bad]) +
                        ": values must be finite with magnitude below 2^127. Nothing was sent for this "
                        "allreduce; the other ranks fail the same way only if their tensors hold such values "
                        "too (otherwise they time out). Use wire='float32' to reduce non-finite values.");
}

}  // namespace

void block_exponents(const Chunking& ch, const void* src, std::vector<int8_t>* exps) {
  const Kernels& K = kernels();
  exps->resize(ch.chunks);
  for (size_t c = 0; c < ch.chunks; ++c) {
    size_t off = ch.offset(c), n = ch.size(c);
    if (ch.dtype == DType::kFloat64) {
      const double* d = static_cast<const double*>(src);
      double m = K.max_abs_f64(d + off, n);
      if (!(m < 0x1p127)) refuse_for_fixed32(d, off, n);
      (*exps)[c] = block_exponent(m);
    } else {
      const float* f = static_cast<const float*>(src);
      float m = K.max_abs(f + off, n);
      if (!(m < 0x1p127f)) refuse_for_fixed32(f, off, n);
      (*exps)[c] = block_exponent(m);
    }
  }
}

}  // namespace gradswitch::worker
