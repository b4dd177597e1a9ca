#include "folio/kernels/cpu/sampling.h"

#include <limits>

#include "folio/base/check.h"
#include "folio/kernels/cpu/vector_launch.h"
#include "folio/kernels/cpu/work_partition.h"

namespace folio::kernels::cpu {

int64_t first_maximum_index(const VectorOps& ops, const float* x, int64_t n) {
  // The maximum is exact (no rounding in max), so scanning for the first equal value finds the
  // lowest index that holds it.
  const float best = ops.maximum(x, n);
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] == best) return i;
  }
  return 0;  // every value is NaN
}

namespace {

void argmax_rows(const ArgmaxArguments& arguments, const VectorOps& ops, int64_t begin, int64_t end,
                 int /*thread_index*/) {
  for (int64_t row = begin; row < end; ++row) {
    arguments.output[row] = static_cast<int32_t>(first_maximum_index(
        ops, arguments.input + row * arguments.num_columns, arguments.num_columns));
  }
}

}  // namespace

void argmax_body(const ArgmaxArguments& arguments, int64_t begin, int64_t end, int thread_index) {
  argmax_rows(arguments, vector_ops(), begin, end, thread_index);
}

void argmax(device::HostStream& stream, const ArgmaxArguments& arguments) {
  FOLIO_CHECK(arguments.num_rows >= 0 && arguments.num_columns > 0 &&
                  arguments.num_columns <= std::numeric_limits<int32_t>::max(),
              "argmax shape [{}, {}]", arguments.num_rows, arguments.num_columns);
  stream.launch(make_vector_kernel<ArgmaxArguments, &argmax_rows>(
      "argmax", arguments, arguments.num_rows, grain_for(arguments.num_columns)));
}

}  // namespace folio::kernels::cpu
