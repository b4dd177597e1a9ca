#include "folio/kernels/cpu/activation.h"

#include <algorithm>
#include <cmath>

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

int64_t element_items(int64_t num_elements) {
  return (num_elements + kElementsPerItem - 1) / kElementsPerItem;
}

// The element range [first, last) of items [begin, end).
struct ElementRange {
  int64_t first;
  int64_t last;
};
ElementRange element_range(int64_t num_elements, int64_t begin, int64_t end) {
  return {begin * kElementsPerItem, std::min(num_elements, end * kElementsPerItem)};
}

void gelu_gate_body(const GeluGateArguments& arguments, int64_t begin, int64_t end,
                    int /*thread_index*/) {
  const auto [first, last] = element_range(arguments.num_elements, begin, end);
  for (int64_t i = first; i < last; ++i) {
    arguments.output[i] = gelu_tanh(arguments.gate[i]) * arguments.up[i];
  }
}

void scale_body(const ScaleArguments& arguments, int64_t begin, int64_t end, int /*thread_index*/) {
  const auto [first, last] = element_range(arguments.num_elements, begin, end);
  for (int64_t i = first; i < last; ++i)
    arguments.output[i] = arguments.factor * arguments.input[i];
}

void soft_cap_body(const SoftCapArguments& arguments, int64_t begin, int64_t end,
                   int /*thread_index*/) {
  const auto [first, last] = element_range(arguments.num_elements, begin, end);
  const float inverse = 1.0f / arguments.cap;
  for (int64_t i = first; i < last; ++i) {
    arguments.output[i] = arguments.cap * std::tanh(arguments.input[i] * inverse);
  }
}

}  // namespace

float gelu_tanh(float x) {
  constexpr float kSqrtTwoOverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(kSqrtTwoOverPi * (x + 0.044715f * x * x * x)));
}

void gelu_gate(device::HostStream& stream, const GeluGateArguments& arguments) {
  FOLIO_CHECK(arguments.num_elements >= 0, "gelu_gate of {} elements", arguments.num_elements);
  stream.launch(device::HostKernel::make<GeluGateArguments, &gelu_gate_body>(
      "gelu_gate", arguments, element_items(arguments.num_elements), 1));
}

void scale(device::HostStream& stream, const ScaleArguments& arguments) {
  FOLIO_CHECK(arguments.num_elements >= 0, "scale of {} elements", arguments.num_elements);
  stream.launch(device::HostKernel::make<ScaleArguments, &scale_body>(
      "scale", arguments, element_items(arguments.num_elements), 1));
}

void soft_cap(device::HostStream& stream, const SoftCapArguments& arguments) {
  FOLIO_CHECK(arguments.num_elements >= 0, "soft_cap of {} elements", arguments.num_elements);
  FOLIO_CHECK(arguments.cap > 0.0f && std::isfinite(arguments.cap), "soft_cap cap {}",
              arguments.cap);
  stream.launch(device::HostKernel::make<SoftCapArguments, &soft_cap_body>(
      "soft_cap", arguments, element_items(arguments.num_elements), 1));
}

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
