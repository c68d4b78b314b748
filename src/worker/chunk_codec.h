// How a tensor is cut into chunks (one packet each) and how a chunk's elements are encoded on
// the wire per wire type (docs/protocol.md sections 2 and 5). Shared by every algorithm that
// moves chunks: the switch's streaming window and the ring.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/options.h"

namespace gradswitch::worker {

// The chunks of an allreduce of `count` elements of type `dtype` in memory, travelling as `elem`
// (a gs_elem_type).
struct Chunking {
  uint8_t elem = 0;
  DType dtype = DType::kFloat32;
  uint32_t per = 0;   // elements of a full chunk
  size_t count = 0;   // elements of the whole tensor
  size_t chunks = 0;  // chunks described here
  // A shard of a tensor striped over several switches: chunk c here is the tensor's chunk
  // first + c * stride (every chunk of the tensor when 0 and 1).
  size_t first = 0, stride = 1;

  size_t tensor_chunk(size_t c) const { return first + c * stride; }
  uint32_t offset(size_t c) const { return static_cast<uint32_t>(tensor_chunk(c) * per); }
  uint16_t size(size_t c) const {
    size_t left = count - tensor_chunk(c) * per;
    return static_cast<uint16_t>(left < per ? left : per);
  }
};

// `payload_bytes` is the largest payload a packet carries; a chunk holds at most 65535 elements
// (the header's count field; mx8: whole blocks, gs_max_count). count must be >= 1. An int32 tensor
// travels as int32; a float32 or float64 tensor as any float wire type (float64 on a 32-, 16- or
// 8-bit float wire is rounded to float32 first; float32 on the float64 wire is widened and its sum
// rounded once at the end). Throws InvalidArgument when the payload holds no chunk of `elem`.
Chunking make_chunking(size_t count, uint8_t elem, uint32_t payload_bytes, DType dtype = DType::kFloat32);
// Shard `i` of `shards` of a tensor's chunks: its chunks i, i + shards, i + 2 shards, ... (none
// when the tensor has fewer than i + 1 chunks). Striping by chunk number, not by contiguous
// ranges, gives every rank the same shard of every chunk whatever its tensor's length, so ranks
// whose lengths differ still meet in one round that shows it.
Chunking shard_chunking(const Chunking& whole, unsigned i, unsigned shards);

// Encodes chunk `c` of the tensor at `src` into `payload`. fixed32 quantises with the scale
// 2^scale (value = integer * 2^-scale). Returns the payload's length in bytes.
size_t encode_chunk(const Chunking& ch, const void* src, size_t c, int scale, uint8_t* payload);

// Writes a chunk's payload (the summed elements) into the tensor at `dst`, converted from the
// wire type; fixed32 payloads were quantised with 2^scale.
void decode_chunk(const Chunking& ch, const uint8_t* payload, size_t c, int scale, void* dst);

// Adds this rank's chunk `c` to a partial sum arriving on the wire: out = in + own, in the wire
// type (the ring's per-hop aggregation). int32/fixed32 add exactly (wrapping); float32 adds in
// fp32; float16/bfloat16 widen, add in fp32 and round once per hop. `in` and `out` may not overlap.
// float32 and int32 tensors only (UnsupportedType for float64, here and in encode_sum/decode_sum).
void accumulate_chunk(const Chunking& ch, const void* base, size_t c, int scale, const uint8_t* in,
                      uint8_t* out);

// A chunk's finished sum, already in the tensor, as a payload that decode_sum writes back
// bit-exactly: fixed32 carries the float32 values (their integer sum is gone), the other types
// their own encoding (exact, as the values came from it). Returns the payload's length.
size_t encode_sum(const Chunking& ch, const void* base, size_t c, uint8_t* payload);
void decode_sum(const Chunking& ch, const uint8_t* payload, size_t c, void* base);

// fixed32: the block exponent of every chunk of `src` (docs/protocol.md section 5) into `*exps`.
// Throws InvalidArgument naming the first element that fixed32 cannot carry (non-finite or
// >= 2^127 in magnitude), before anything is sent.
void block_exponents(const Chunking& ch, const void* src, std::vector<int8_t>* exps);

}  // namespace gradswitch::worker
