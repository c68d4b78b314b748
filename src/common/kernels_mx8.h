// The mx8 wire type's kernels (docs/protocol.md 2.2): blocks of 32 FP8 E4M3 elements behind one
// E8M0 scale byte. Scalar only; every function is exact up to the one rounding the spec defines.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradswitch {

// The nearest E4M3 byte to `v` (an exact, already scaled value), ties to even, |v| > 448
// saturating to +-448 (0x7E/0xFE), infinities too; NaN gives 0x7F with v's sign.
uint8_t e4m3_from_f32(float v);
// The value of an E4M3 byte (0x7F and 0xFF are NaN).
float e4m3_to_f32(uint8_t b);
// 2^(s - 127) for a scale byte s < 0xFF.
float mx8_scale_value(uint8_t s);

// `count` fp32 values as an mx8 payload of gs_payload_bytes(GS_ELEM_MX8, count) bytes.
void f32_to_mx8(uint8_t* payload, const float* src, size_t count);
// An mx8 payload of `count` elements widened to fp32: written (to_) or added (add_) into dst.
void mx8_to_f32(float* dst, const uint8_t* payload, size_t count);
void add_mx8_to_f32(float* dst, const uint8_t* payload, size_t count);

}  // namespace gradswitch
