// Row conversions between f32 and Folio's storage dtypes: the 16-bit floats (f16, bf16) and
// ggml's block-quantized types (q8_0, q4_0, and the q4_1 ... iq4_xs of quant_blocks.h), with ggml's
// exact layouts and rounding so GGUF weights are read in place and weights Folio quantizes itself
// match what llama.cpp writes.
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
#include "folio/tensor/quant_blocks.h"

namespace folio {

// All row functions: `count` values; for the quantized types Requires: count is a multiple of
// the dtype's block_elements (32, or 256 for the super-block types).
// Inputs must be finite for the quantizers (as in ggml, NaN has no defined encoding).

void quantize_row_q8_0(const float* input, BlockQ8_0* output, int64_t count);
void dequantize_row_q8_0(const BlockQ8_0* input, float* output, int64_t count);

void quantize_row_q4_0(const float* input, BlockQ4_0* output, int64_t count);
void dequantize_row_q4_0(const BlockQ4_0* input, float* output, int64_t count);

// Quantizers of the other block types (quantize_blocks.cc), following ggml's reference
// quantizers without an importance matrix (the `quantize_row_*_ref` searches; for iq4_nl and
// iq4_xs the search llama-quantize runs without one), so the bytes match what llama.cpp
// writes. k-quant rows hold whole 256-value super-blocks.
void quantize_row_q4_1(const float* input, BlockQ4_1* output, int64_t count);
void quantize_row_q5_0(const float* input, BlockQ5_0* output, int64_t count);
void quantize_row_q5_1(const float* input, BlockQ5_1* output, int64_t count);
void quantize_row_q2_k(const float* input, BlockQ2_K* output, int64_t count);
void quantize_row_q3_k(const float* input, BlockQ3_K* output, int64_t count);
void quantize_row_q4_k(const float* input, BlockQ4_K* output, int64_t count);
void quantize_row_q5_k(const float* input, BlockQ5_K* output, int64_t count);
void quantize_row_q6_k(const float* input, BlockQ6_K* output, int64_t count);
void quantize_row_iq4_nl(const float* input, BlockIQ4_NL* output, int64_t count);
void quantize_row_iq4_xs(const float* input, BlockIQ4_XS* output, int64_t count);

// Dequantizers of the other block types, following ggml's reference dequantization exactly
// (the same float operations in the same order, so the values are bit-identical to ggml's).
void dequantize_row_q4_1(const BlockQ4_1* input, float* output, int64_t count);
void dequantize_row_q5_0(const BlockQ5_0* input, float* output, int64_t count);
void dequantize_row_q5_1(const BlockQ5_1* input, float* output, int64_t count);
void dequantize_row_q2_k(const BlockQ2_K* input, float* output, int64_t count);
void dequantize_row_q3_k(const BlockQ3_K* input, float* output, int64_t count);
void dequantize_row_q4_k(const BlockQ4_K* input, float* output, int64_t count);
void dequantize_row_q5_k(const BlockQ5_K* input, float* output, int64_t count);
void dequantize_row_q6_k(const BlockQ6_K* input, float* output, int64_t count);
void dequantize_row_iq4_nl(const BlockIQ4_NL* input, float* output, int64_t count);
void dequantize_row_iq4_xs(const BlockIQ4_XS* input, float* output, int64_t count);

void convert_row_f32_to_f16(const float* input, uint16_t* output, int64_t count);
void convert_row_f16_to_f32(const uint16_t* input, float* output, int64_t count);
void convert_row_f32_to_bf16(const float* input, uint16_t* output, int64_t count);
void convert_row_bf16_to_f32(const uint16_t* input, float* output, int64_t count);

// Converts `count` f32 values to a row of `dtype` (row_bytes(dtype, count) bytes), or back.
// Requires: is_weight_dtype(dtype).
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
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kIQ4_NL:
    case DType::kIQ4_XS:
      return true;
    case DType::kI32:
    case DType::kI8:
    case DType::kQ8_0Panels:
      return false;
  }
  return false;
}

}  // namespace folio
