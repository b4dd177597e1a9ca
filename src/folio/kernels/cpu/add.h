// Element-wise addition, used for the residual connections of a transformer block
// (hidden += attention_output, hidden += feed_forward_output). Work items are chunks of
// kAddElementsPerItem elements; elements are independent.
#pragma once

#include <cstdint>

#include "folio/device/host_stream.h"

namespace folio::kernels::cpu {

struct AddArguments {
  const float* a;  // f32 [num_elements]
  const float* b;  // f32 [num_elements]
  float* output;   // f32 [num_elements]; may equal a or b (in-place residual add)
  int64_t num_elements = 0;
};

inline constexpr int64_t kAddElementsPerItem = 4096;

void add_body(const AddArguments& arguments, int64_t begin, int64_t end, int thread_index);

// Requires: num_elements >= 0.
void add(device::HostStream& stream, const AddArguments& arguments);

}  // namespace folio::kernels::cpu
