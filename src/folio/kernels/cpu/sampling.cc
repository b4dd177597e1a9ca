#include "folio/kernels/cpu/sampling.h"

#include <algorithm>
#include <limits>

#include "folio/base/check.h"
#include "folio/kernels/cpu/vector_launch.h"
#include "folio/kernels/cpu/work_partition.h"

namespace folio::kernels::cpu {

int64_t first_maximum_index(const VectorOps& ops, const float* x, int64_t n) {
  // The vectorized maximum of each chunk, keeping the first chunk whose maximum is strictly
  // greater than every earlier one's; then the first index of that chunk holding it. The
  // maximum is exact (no rounding in max), so that is the lowest index of the row's maximum,
  // and the scalar scan covers one chunk, not the row (a 32,000-entry logits row: a few us).
  constexpr int64_t kChunk = 256;
  float best = ops.maximum(x, std::min(kChunk, n));
  int64_t best_chunk = 0;
  for (int64_t begin = kChunk; begin < n; begin += kChunk) {
    const float chunk_maximum = ops.maximum(x + begin, std::min(kChunk, n - begin));
    if (chunk_maximum > best) {
      best = chunk_maximum;
      best_chunk = begin;
    }
  }
  for (int64_t i = best_chunk; i < std::min(best_chunk + kChunk, n); ++i) {
    if (x[i] == best) return i;
  }
  // Only when best is -infinity and the first chunk holds only NaN: the first -infinity lies
  // in a later chunk.
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
