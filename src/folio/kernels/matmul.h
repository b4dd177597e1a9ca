// Matmul: y[M, N] = x[M, K] · W[N, K]^T (+ bias[N]), the projection every linear layer of a
// model runs. x and y are f32 row-major; W is a weight in GGUF / ggml layout: N rows of K
// values each, in any weight dtype (is_weight_dtype: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0,
// q5_1, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs; a quantized row is K / block_elements
// blocks, see folio/tensor/dtype.h), used in place from the mmapped model file. K is a
// multiple of 32 and of the dtype's block_elements: 256 for the k-quants and iq4_xs.
//
// Terms: M is the step's padded token count (`num_rows`), K the input features, N the output
// features. These arguments are backend-independent; kernels/cpu/matmul.h launches them on the
// CPU. Every value here is fixed for a captured graph (a padded step has a fixed M), so it is
// passed by value; the data behind the pointers may change between replays.
#pragma once

#include <cstddef>
#include <cstdint>

#include "folio/tensor/dtype.h"

namespace folio::kernels {

struct MatmulArguments {
  const float* input = nullptr;    // f32 [num_rows, input_features] (x)
  const void* weight = nullptr;    // weight_dtype [output_features, input_features] (W)
  const float* bias = nullptr;     // f32 [output_features], or nullptr for no bias
  float* output = nullptr;         // f32 [num_rows, output_features] (y); must not alias input
  std::byte* workspace = nullptr;  // scratch, sized by the backend (cpu::matmul_workspace_bytes)
  int64_t workspace_bytes = 0;     // bytes at workspace
  int64_t num_rows = 0;            // M
  int64_t input_features = 0;      // K; a multiple of 32 and of weight_dtype's block_elements
  int64_t output_features = 0;     // N
  DType weight_dtype = DType::kF32;
};

}  // namespace folio::kernels
