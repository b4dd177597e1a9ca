// Greedy argmax: lowest index on ties, NaN never chosen, on every SIMD path, against a scalar
// reference on random rows as wide as a vocabulary.
#include "folio/kernels/cpu/sampling.h"

#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "folio/base/thread_pool.h"
#include "folio/device/host_stream.h"
#include "kernel_test_util.h"

namespace folio::kernels::testing {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInfinity = std::numeric_limits<float>::infinity();

int32_t reference_argmax(const float* row, int64_t columns) {
  int32_t best = -1;
  for (int64_t i = 0; i < columns; ++i) {
    if (std::isnan(row[i])) continue;
    if (best < 0 || row[i] > row[best]) best = static_cast<int32_t>(i);
  }
  return best < 0 ? 0 : best;
}

class ArgmaxTest : public ::testing::TestWithParam<SimdPath> {};

TEST_P(ArgmaxTest, PicksLowestIndexOfTheMaximumIgnoringNan) {
  ScopedSimdPath scoped(GetParam());
  ThreadPool pool(2);
  device::HostStream stream(pool);
  std::mt19937 rng(31);
  constexpr int64_t kColumns = 32003;
  constexpr int64_t kRows = 8;
  std::vector<float> logits = random_floats(rng, kRows * kColumns, -10.0f, 10.0f);
  float* row = logits.data();
  row[100] = row[20000] = row[32002] = 50.0f;  // row 0: ties
  row = logits.data() + kColumns;
  row[0] = kNan;  // row 1: NaN before and after the maximum
  row[5] = 40.0f;
  row[6] = kNan;
  row = logits.data() + 2 * kColumns;
  std::fill(row, row + kColumns, kNan);  // row 2: all NaN
  row = logits.data() + 3 * kColumns;
  std::fill(row, row + kColumns, -kInfinity);  // row 3: all -inf
  row[kColumns - 1] = -1e30f;
  row = logits.data() + 4 * kColumns;
  row[kColumns - 1] = kInfinity;  // row 4: +inf in the tail
  row = logits.data() + 5 * kColumns;
  // Row 5: no finite value, the leading chunks (the kernel scans 256-value chunks) only NaN.
  std::fill(row, row + 600, kNan);
  std::fill(row + 600, row + kColumns, -kInfinity);
  row[601] = kNan;

  std::vector<int32_t> output(kRows, -1);
  cpu::argmax(stream, {.input = logits.data(),
                       .output = output.data(),
                       .num_rows = kRows,
                       .num_columns = kColumns});
  for (int64_t r = 0; r < kRows; ++r) {
    EXPECT_EQ(output[r], reference_argmax(logits.data() + r * kColumns, kColumns)) << r;
  }
  EXPECT_EQ(output[0], 100);
  EXPECT_EQ(output[1], 5);
  EXPECT_EQ(output[2], 0);
  EXPECT_EQ(output[3], kColumns - 1);
  EXPECT_EQ(output[4], kColumns - 1);
  EXPECT_EQ(output[5], 600);
}

TEST_P(ArgmaxTest, MatchesReferenceOnNarrowRows) {
  ScopedSimdPath scoped(GetParam());
  ThreadPool pool(1);
  device::HostStream stream(pool);
  std::mt19937 rng(4);
  for (int64_t columns = 1; columns <= 40; ++columns) {
    // Few distinct values: many ties.
    std::vector<float> logits(3 * columns);
    for (float& value : logits) value = static_cast<float>(rng() % 4);
    std::vector<int32_t> output(3);
    cpu::argmax(
        stream,
        {.input = logits.data(), .output = output.data(), .num_rows = 3, .num_columns = columns});
    for (int64_t r = 0; r < 3; ++r) {
      EXPECT_EQ(output[r], reference_argmax(logits.data() + r * columns, columns)) << columns;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, ArgmaxTest, ::testing::ValuesIn(supported_simd_paths()),
                         simd_path_test_name);

}  // namespace
}  // namespace folio::kernels::testing
