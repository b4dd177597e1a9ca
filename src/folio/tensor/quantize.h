// Row conversions between f32 and Folio's storage dtypes: the 16-bit floats (f16, bf16) and
// ggml's block-quantized types (q8_0, q4_0), with ggml's exact layouts and rounding so GGUF
// weights are read in place and weights Folio quantizes itself match what llama.cpp writes.
//
// Terms: a *block* is 32 consecutive values of a row sharing one f16 scale `d`.
//   q8_0: q = round(x / d) in [-127, 127] with d = amax / 127         (value = d * q)
//   q4_0: d = m / -8 where m is the value of largest magnitude (sign kept), nibble =
//         min(15, trunc(x / d + 8.5)) in [0, 15]                      (value = d * (nibble - 8))
// Like ggml's reference quantizers, values are multiplied by the f32 reciprocal 1/d (not
// divided), and d is rounded to f16 only when stored. A row holds a whole number of blocks.
//
// These are the portable reference implementations: model loading, embedding lookup and tests
// use them; the matmul kernels have their own SIMD paths that read the same layouts.
#pragma once

#include <cstddef>
#include <cstdint>

#include "folio/tensor/dtype.h"

namespace folio {

inline constexpr int64_t kQuantBlockElements = 32;

// ggml's block_q8_0: 34 bytes, no padding, 2-byte aligned.
struct BlockQ8_0 {
  uint16_t scale;                      // f16 d
  int8_t values[kQuantBlockElements];  // q, value = d * q
};
static_assert(sizeof(BlockQ8_0) == 34);

// ggml's block_q4_0: 18 bytes. Element i < 16 is the low nibble of nibbles[i], element i + 16
// its high nibble.
struct BlockQ4_0 {
  uint16_t scale;                            // f16 d
  uint8_t nibbles[kQuantBlockElements / 2];  // value = d * (nibble - 8)
};
static_assert(sizeof(BlockQ4_0) == 18);

// All row functions: `count` values; for the quantized types Requires: count % 32 == 0.
// Inputs must be finite for the quantizers (as in ggml, NaN has no defined encoding).

void quantize_row_q8_0(const float* input, BlockQ8_0* output, int64_t count);
void dequantize_row_q8_0(const BlockQ8_0* input, float* output, int64_t count);

void quantize_row_q4_0(const float* input, BlockQ4_0* output, int64_t count);
void dequantize_row_q4_0(const BlockQ4_0* input, float* output, int64_t count);

void convert_row_f32_to_f16(const float* input, uint16_t* output, int64_t count);
void convert_row_f16_to_f32(const uint16_t* input, float* output, int64_t count);
void convert_row_f32_to_bf16(const float* input, uint16_t* output, int64_t count);
void convert_row_bf16_to_f32(const uint16_t* input, float* output, int64_t count);

// Converts `count` f32 values to a row of `dtype` (row_bytes(dtype, count) bytes), or back.
// Requires: dtype is f32, f16, bf16, q8_0 or q4_0.
void quantize_row(DType dtype, const float* input, void* output, int64_t count);
void dequantize_row(DType dtype, const void* input, float* output, int64_t count);

// Whether `dtype` is a weight dtype the row functions (and the matmul kernels) handle.
constexpr bool is_weight_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
    case DType::kQ4_0:
      return true;
    case DType::kI32:
    case DType::kI8:
      return false;
  }
  return false;
}

}  // namespace folio
