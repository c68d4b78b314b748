// The one list of a variant's kernels in the order of `Kernels` (kernels.h), shared by the scalar,
// AVX2 and AVX-512 files so that a new field is added to each variant in one place.
//
// A macro, not a template: each variant's kernels are function templates with internal linkage in
// a file compiled for its own ISA, which no shared template could name (and an inline function
// shared between files of different ISAs could be linked into the wrong one). Each file defines,
// over its lane types F32 and F64 and its 16-bit formats F16 and BF16: add, quantize, dequantize,
// max_abs; widen, add_widened, narrow; and add_i32, f32_to_f64, f64_to_f32; and a type MX8 whose
// static encode, decode and add are its mx8 kernels.
#pragma once

#include "common/kernels.h"

// Designated initializers: each kernel is named by its field, and a field out of order does not compile.
#define GRADSWITCH_KERNELS_TABLE(label, F32, F64, F16, BF16, MX8)                                          \
  Kernels {                                                                                                \
    .name = label, .add_f32 = add<F32>, .add_i32 = add_i32, .f16_to_f32 = widen<F16>,                      \
    .add_f16_to_f32 = add_widened<F16>, .f32_to_f16 = narrow<F16>, .bf16_to_f32 = widen<BF16>,             \
    .add_bf16_to_f32 = add_widened<BF16>, .f32_to_bf16 = narrow<BF16>, .quantize = quantize<F32>,          \
    .dequantize = dequantize<F32>, .max_abs = max_abs<F32>, .add_f64 = add<F64>, .f32_to_f64 = f32_to_f64, \
    .f64_to_f32 = f64_to_f32, .quantize_f64 = quantize<F64>, .dequantize_f64 = dequantize<F64>,            \
    .max_abs_f64 = max_abs<F64>, .f32_to_mx8 = MX8::encode, .mx8_to_f32 = MX8::decode,                     \
    .add_mx8_to_f32 = MX8::add,                                                                            \
  }
