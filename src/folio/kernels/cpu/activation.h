// SwiGLU's gated activation (Llama, Mistral, Qwen2 feed-forward): out = silu(gate) * up, where
// silu(g) = g / (1 + exp(-g)) and gate, up are the two halves of the feed-forward up-projection.
// Rows carry strides so gate and up can be column ranges of one fused [gate | up] matmul output.
// Work items are (row, chunk of kColumnsPerItem columns); elements are independent, so results
// do not depend on the partition.
#pragma once

#include <cstdint>

#include "folio/device/host_stream.h"

namespace folio::kernels::cpu {

struct SiluGateArguments {
  const float* gate;  // f32 [num_rows, gate_row_stride], the first `width` values of a row
  const float* up;    // f32 [num_rows, up_row_stride]
  float* output;      // f32 [num_rows, output_row_stride]; may alias gate or up element-wise
  int64_t gate_row_stride = 0;
  int64_t up_row_stride = 0;
  int64_t output_row_stride = 0;
  int64_t num_rows = 0;  // the step's padded token count
  int64_t width = 0;     // the feed-forward size
};

inline constexpr int64_t kSiluGateColumnsPerItem = 4096;

void silu_gate_body(const SiluGateArguments& arguments, int64_t begin, int64_t end,
                    int thread_index);

// Requires: num_rows >= 0, width > 0, every stride >= width.
void silu_gate(device::HostStream& stream, const SiluGateArguments& arguments);

}  // namespace folio::kernels::cpu
