// RMSNorm on every SIMD path against a double-precision reference, out of place and in place.
#include "folio/kernels/cpu/rms_norm.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "folio/base/thread_pool.h"
#include "folio/device/host_stream.h"
#include "kernel_test_util.h"

namespace folio::kernels::testing {
namespace {

// An f32 sum of squares in 8 or 16 lanes (relative error well below 1e-6 over 5120 terms),
// then two rounded multiplications.
constexpr double kAbsoluteTolerance = 1e-6;
constexpr double kRelativeTolerance = 2e-6;

class RmsNormTest : public ::testing::TestWithParam<SimdPath> {};

TEST_P(RmsNormTest, MatchesDoubleReferenceInAndOutOfPlace) {
  ScopedSimdPath scoped(GetParam());
  ThreadPool pool(2);
  device::HostStream stream(pool);
  std::mt19937 rng(42);
  for (int64_t hidden : {1, 17, 64, 4096, 5120}) {
    for (float epsilon : {1e-5f, 1e-6f}) {
      constexpr int64_t kRows = 7;
      std::vector<float> input = random_floats(rng, kRows * hidden, -3.0f, 3.0f);
      const std::vector<float> weight = random_floats(rng, hidden, 0.5f, 1.5f);
      std::vector<double> expected(input.size());
      for (int64_t row = 0; row < kRows; ++row) {
        double squares = 0;
        for (int64_t i = 0; i < hidden; ++i)
          squares += double{input[row * hidden + i]} * input[row * hidden + i];
        const double inverse_rms = 1.0 / std::sqrt(squares / hidden + epsilon);
        for (int64_t i = 0; i < hidden; ++i) {
          expected[row * hidden + i] = input[row * hidden + i] * inverse_rms * weight[i];
        }
      }
      const std::string what = "hidden " + std::to_string(hidden);
      std::vector<float> output(input.size());
      cpu::rms_norm(stream, {.input = input.data(),
                             .weight = weight.data(),
                             .output = output.data(),
                             .num_rows = kRows,
                             .hidden = hidden,
                             .epsilon = epsilon});
      expect_near_all(output, expected, kAbsoluteTolerance, kRelativeTolerance, what);
      cpu::rms_norm(stream, {.input = input.data(),
                             .weight = weight.data(),
                             .output = input.data(),
                             .num_rows = kRows,
                             .hidden = hidden,
                             .epsilon = epsilon});
      EXPECT_EQ(input, output) << what << ": in place differs from out of place";
    }
  }
}

TEST_P(RmsNormTest, EpsilonKeepsZeroRowsFinite) {
  ScopedSimdPath scoped(GetParam());
  ThreadPool pool(1);
  device::HostStream stream(pool);
  std::vector<float> input(32, 0.0f), weight(32, 1.0f), output(32, 1.0f);
  cpu::rms_norm(stream, {.input = input.data(),
                         .weight = weight.data(),
                         .output = output.data(),
                         .num_rows = 1,
                         .hidden = 32,
                         .epsilon = 1e-6f});
  for (float value : output) EXPECT_EQ(value, 0.0f);
}

INSTANTIATE_TEST_SUITE_P(AllPaths, RmsNormTest, ::testing::ValuesIn(supported_simd_paths()),
                         simd_path_test_name);

}  // namespace
}  // namespace folio::kernels::testing
