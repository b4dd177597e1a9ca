#include "folio/kernels/cpu/softmax.h"

#include <algorithm>

#include "folio/base/check.h"
#include "folio/kernels/cpu/sampling.h"
#include "folio/kernels/cpu/vector_launch.h"
#include "folio/kernels/cpu/vector_ops.h"
#include "folio/kernels/cpu/work_partition.h"

namespace folio::kernels::cpu {
namespace {

void softmax_rows(const SoftmaxArguments& arguments, const VectorOps& ops, int64_t begin,
                  int64_t end, int /*thread_index*/) {
  const int64_t columns = arguments.num_columns;
  for (int64_t row = begin; row < end; ++row) {
    const float* input = arguments.input + row * columns;
    float* output = arguments.output + row * columns;
    const float temperature = arguments.temperatures ? arguments.temperatures[row] : 1.0f;
    if (!(temperature > 0.0f)) {  // also catches NaN
      const int64_t best = first_maximum_index(ops, input, columns);
      std::fill(output, output + columns, 0.0f);
      output[best] = 1.0f;
      continue;
    }
    const float inverse_temperature = 1.0f / temperature;
    const float row_max = ops.maximum(input, columns);
    const float sum = ops.exp_shifted_sum(output, input, inverse_temperature,
                                          row_max * inverse_temperature, columns);
    ops.scale(output, 1.0f / sum, columns);
  }
}

}  // namespace

void softmax_body(const SoftmaxArguments& arguments, int64_t begin, int64_t end, int thread_index) {
  softmax_rows(arguments, vector_ops(), begin, end, thread_index);
}

void softmax(device::HostStream& stream, const SoftmaxArguments& arguments) {
  FOLIO_CHECK(arguments.num_rows >= 0 && arguments.num_columns > 0, "softmax shape [{}, {}]",
              arguments.num_rows, arguments.num_columns);
  stream.launch(make_vector_kernel<SoftmaxArguments, &softmax_rows>(
      "softmax", arguments, arguments.num_rows, grain_for(arguments.num_columns)));
}

}  // namespace folio::kernels::cpu
