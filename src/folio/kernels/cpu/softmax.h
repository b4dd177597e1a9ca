// Row-wise softmax with an optional per-row temperature, for turning logits into sampling
// probabilities:
//   p[r, i] = exp((x[r, i] - max_r) / T_r) / sum_j exp((x[r, j] - max_r) / T_r).
// Subtracting the row maximum keeps every exponent <= 0, so no overflow for any input range.
// A temperature <= 0 means greedy: the row becomes one-hot at its first maximum.
// Temperatures are read through a pointer at run time, so a captured launch follows the values
// the sampler writes before each replay. One work item is one row.
#pragma once

#include <cstdint>

#include "folio/device/host_stream.h"

namespace folio::kernels::cpu {

struct SoftmaxArguments {
  const float* input;         // f32 [num_rows, num_columns]
  float* output;              // f32 [num_rows, num_columns]; may equal input
  const float* temperatures;  // f32 [num_rows], or nullptr for temperature 1 everywhere
  int64_t num_rows = 0;
  int64_t num_columns = 0;
};

void softmax_body(const SoftmaxArguments& arguments, int64_t begin, int64_t end, int thread_index);

// Requires: num_rows >= 0, num_columns > 0.
void softmax(device::HostStream& stream, const SoftmaxArguments& arguments);

}  // namespace folio::kernels::cpu
