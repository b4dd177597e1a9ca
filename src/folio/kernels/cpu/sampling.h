// Greedy sampling: the index of each row's largest logit. Ties go to the lowest index, so the
// choice is deterministic and independent of how the row is scanned; NaN values are never
// chosen (a row of only NaN gives index 0). One work item is one row.
#pragma once

#include <cstdint>

#include "folio/device/host_stream.h"
#include "folio/kernels/cpu/vector_ops.h"

namespace folio::kernels::cpu {

struct ArgmaxArguments {
  const float* input;  // f32 [num_rows, num_columns]
  int32_t* output;     // i32 [num_rows]
  int64_t num_rows = 0;
  int64_t num_columns = 0;
};

// The first index of the maximum of x[0, n), ignoring NaN; 0 when every value is NaN.
// Requires: n > 0.
int64_t first_maximum_index(const VectorOps& ops, const float* x, int64_t n);

void argmax_body(const ArgmaxArguments& arguments, int64_t begin, int64_t end, int thread_index);

// Requires: num_rows >= 0, 0 < num_columns <= INT32_MAX.
void argmax(device::HostStream& stream, const ArgmaxArguments& arguments);

}  // namespace folio::kernels::cpu
