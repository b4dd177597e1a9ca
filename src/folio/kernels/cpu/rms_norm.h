// RMSNorm (Llama, Mistral, Qwen2): each row of x is divided by its root mean square and scaled
// by a learned weight,
//   y[r, i] = x[r, i] / sqrt(mean_i(x[r, i]^2) + epsilon) * weight[i],
// with epsilon from the model's metadata (e.g. llama.attention.layer_norm_rms_epsilon).
// One work item is one row; the row's sum of squares is one vector reduction, so the result
// does not depend on the thread count.
#pragma once

#include <cstdint>

#include "folio/device/host_stream.h"

namespace folio::kernels::cpu {

struct RmsNormArguments {
  const float* input;    // f32 [num_rows, hidden]
  const float* weight;   // f32 [hidden]
  float* output;         // f32 [num_rows, hidden]; may equal input
  int64_t num_rows = 0;  // the step's padded token count
  int64_t hidden = 0;
  float epsilon = 1e-5f;
};

void rms_norm_body(const RmsNormArguments& arguments, int64_t begin, int64_t end, int thread_index);

// Requires: num_rows >= 0, hidden > 0, epsilon >= 0.
void rms_norm(device::HostStream& stream, const RmsNormArguments& arguments);

}  // namespace folio::kernels::cpu
