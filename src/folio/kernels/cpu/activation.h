// Element-wise activations of the feed-forward and the logits:
//   silu_gate  SwiGLU's gated activation (Llama, Mistral, Qwen2 feed-forward): out = silu(gate)
//              * up, where silu(g) = g / (1 + exp(-g)) and gate, up are the two halves of the
//              feed-forward up-projection. Rows carry strides so gate and up can be column ranges
//              of one fused [gate | up] matmul output. Work items are (row, chunk of
//              kSiluGateColumnsPerItem columns).
//   gelu_gate  GeGLU (Gemma's feed-forward): out = gelu(gate) * up with GELU's tanh
//              approximation, gelu(g) = g / 2 * (1 + tanh(sqrt(2 / pi) * (g + 0.044715 g^3))),
//              computed in f32 by the portable code on every SIMD level.
//   scale      out = factor * x (Gemma's embedding scaling by sqrt(hidden)).
//   soft_cap   out = cap * tanh(x / cap) (Gemma 2's final logit soft-capping).
// Elements are independent, so results do not depend on the partition; gelu_gate, scale and
// soft_cap work on contiguous arrays in items of kElementsPerItem values.
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

struct GeluGateArguments {
  const float* gate;  // f32 [num_elements]
  const float* up;    // f32 [num_elements]
  float* output;      // f32 [num_elements]; may alias gate or up element-wise
  int64_t num_elements = 0;
};

struct ScaleArguments {
  const float* input;  // f32 [num_elements]
  float* output;       // f32 [num_elements]; may alias input
  int64_t num_elements = 0;
  float factor = 1.0f;
};

struct SoftCapArguments {
  const float* input;  // f32 [num_elements]
  float* output;       // f32 [num_elements]; may alias input
  int64_t num_elements = 0;
  float cap = 0.0f;  // > 0
};

inline constexpr int64_t kElementsPerItem = 4096;

// GELU, tanh approximation, of one value (what gelu_gate applies to the gate).
float gelu_tanh(float x);

// Requires: num_elements >= 0.
void gelu_gate(device::HostStream& stream, const GeluGateArguments& arguments);
// Requires: num_elements >= 0.
void scale(device::HostStream& stream, const ScaleArguments& arguments);
// Requires: num_elements >= 0, cap > 0 and finite.
void soft_cap(device::HostStream& stream, const SoftCapArguments& arguments);

}  // namespace folio::kernels::cpu
