#include "folio/kernels/cpu/activation.h"

#include <algorithm>

#include "folio/base/check.h"
#include "folio/kernels/cpu/vector_launch.h"
#include "folio/kernels/cpu/vector_ops.h"
#include "folio/kernels/cpu/work_partition.h"

namespace folio::kernels::cpu {
namespace {

int64_t chunks_per_row(int64_t width) {
  return (width + kSiluGateColumnsPerItem - 1) / kSiluGateColumnsPerItem;
}

void silu_gate_items(const SiluGateArguments& arguments, const VectorOps& ops, int64_t begin,
                     int64_t end, int /*thread_index*/) {
  const int64_t chunks = chunks_per_row(arguments.width);
  for (int64_t item = begin; item < end; ++item) {
    const int64_t row = item / chunks;
    const int64_t first_column = (item % chunks) * kSiluGateColumnsPerItem;
    const int64_t count = std::min(kSiluGateColumnsPerItem, arguments.width - first_column);
    ops.silu_multiply(arguments.output + row * arguments.output_row_stride + first_column,
                      arguments.gate + row * arguments.gate_row_stride + first_column,
                      arguments.up + row * arguments.up_row_stride + first_column, count);
  }
}

}  // namespace

void silu_gate_body(const SiluGateArguments& arguments, int64_t begin, int64_t end,
                    int thread_index) {
  silu_gate_items(arguments, vector_ops(), begin, end, thread_index);
}

void silu_gate(device::HostStream& stream, const SiluGateArguments& arguments) {
  FOLIO_CHECK(arguments.num_rows >= 0 && arguments.width > 0, "silu_gate shape [{}, {}]",
              arguments.num_rows, arguments.width);
  FOLIO_CHECK(
      arguments.gate_row_stride >= arguments.width && arguments.up_row_stride >= arguments.width &&
          arguments.output_row_stride >= arguments.width,
      "silu_gate row strides ({}, {}, {}) shorter than the width {}", arguments.gate_row_stride,
      arguments.up_row_stride, arguments.output_row_stride, arguments.width);
  const int64_t chunks = chunks_per_row(arguments.width);
  const int64_t columns_per_item = std::min(arguments.width, kSiluGateColumnsPerItem);
  stream.launch(make_vector_kernel<SiluGateArguments, &silu_gate_items>(
      "silu_gate", arguments, arguments.num_rows * chunks, grain_for(columns_per_item)));
}

}  // namespace folio::kernels::cpu
