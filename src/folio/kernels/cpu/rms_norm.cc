#include "folio/kernels/cpu/rms_norm.h"

#include <cmath>

#include "folio/base/check.h"
#include "folio/kernels/cpu/vector_launch.h"
#include "folio/kernels/cpu/vector_ops.h"
#include "folio/kernels/cpu/work_partition.h"

namespace folio::kernels::cpu {
namespace {

void rms_norm_rows(const RmsNormArguments& arguments, const VectorOps& ops, int64_t begin,
                   int64_t end, int /*thread_index*/) {
  const int64_t hidden = arguments.hidden;
  for (int64_t row = begin; row < end; ++row) {
    const float* input = arguments.input + row * hidden;
    const double mean_square =
        static_cast<double>(ops.sum_squares(input, hidden)) / static_cast<double>(hidden);
    const float scale = static_cast<float>(1.0 / std::sqrt(mean_square + arguments.epsilon));
    ops.multiply_scaled(arguments.output + row * hidden, input, arguments.weight, scale, hidden);
  }
}

}  // namespace

void rms_norm_body(const RmsNormArguments& arguments, int64_t begin, int64_t end,
                   int thread_index) {
  rms_norm_rows(arguments, vector_ops(), begin, end, thread_index);
}

void rms_norm(device::HostStream& stream, const RmsNormArguments& arguments) {
  FOLIO_CHECK(arguments.num_rows >= 0 && arguments.hidden > 0, "rms_norm shape [{}, {}]",
              arguments.num_rows, arguments.hidden);
  FOLIO_CHECK(arguments.epsilon >= 0.0f, "rms_norm epsilon {} is negative", arguments.epsilon);
  stream.launch(make_vector_kernel<RmsNormArguments, &rms_norm_rows>(
      "rms_norm", arguments, arguments.num_rows, grain_for(arguments.hidden)));
}

}  // namespace folio::kernels::cpu
