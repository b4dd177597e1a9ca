// SwiGLU's silu(gate) * up on every SIMD path against a double reference, reading gate and up
// from one fused [gate | up] matmul output and writing in place.
#include "folio/kernels/cpu/activation.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "folio/base/thread_pool.h"
#include "folio/device/host_stream.h"
#include "kernel_test_util.h"

namespace folio::kernels::testing {
namespace {

class SiluGateTest : public ::testing::TestWithParam<SimdPath> {};

TEST_P(SiluGateTest, MatchesDoubleReferenceOnFusedGateUpRows) {
  ScopedSimdPath scoped(GetParam());
  ThreadPool pool(2);
  device::HostStream stream(pool);
  std::mt19937 rng(5);
  // 5000 columns: one full item of 4096 and a partial one.
  for (int64_t width : {1, 13, 5000}) {
    constexpr int64_t kRows = 3;
    std::vector<float> fused = random_floats(rng, kRows * 2 * width, -12.0f, 12.0f);
    std::vector<double> expected(kRows * width);
    std::vector<double> expected_fused(fused.begin(), fused.end());
    for (int64_t row = 0; row < kRows; ++row) {
      for (int64_t i = 0; i < width; ++i) {
        const double gate = fused[row * 2 * width + i];
        const double up = fused[row * 2 * width + width + i];
        expected[row * width + i] = gate / (1.0 + std::exp(-gate)) * up;
        expected_fused[row * 2 * width + i] = expected[row * width + i];
      }
    }
    std::vector<float> output(kRows * width);
    cpu::SiluGateArguments arguments{.gate = fused.data(),
                                     .up = fused.data() + width,
                                     .output = output.data(),
                                     .gate_row_stride = 2 * width,
                                     .up_row_stride = 2 * width,
                                     .output_row_stride = width,
                                     .num_rows = kRows,
                                     .width = width};
    cpu::silu_gate(stream, arguments);
    // exp is a few ulp on every path; the divide and multiply round once each.
    expect_near_all(output, expected, 1e-6, 1e-6, "silu_gate width " + std::to_string(width));

    arguments.output = fused.data();  // in place over the gate half
    arguments.output_row_stride = 2 * width;
    cpu::silu_gate(stream, arguments);
    expect_near_all(fused, expected_fused, 1e-6, 1e-6, "in place");
  }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, SiluGateTest, ::testing::ValuesIn(supported_simd_paths()),
                         simd_path_test_name);

// GeGLU, scale and soft-cap are portable code on every SIMD level: checked once against double.
TEST(GeluGateTest, MatchesDoubleTanhApproximationAcrossItems) {
  ThreadPool pool(2);
  device::HostStream stream(pool);
  std::mt19937 rng(6);
  for (int64_t count : {1, 4096, 9000}) {  // one item, exactly one, and a partial third
    std::vector<float> gate = random_floats(rng, count, -8.0f, 8.0f);
    std::vector<float> up = random_floats(rng, count, -3.0f, 3.0f);
    std::vector<double> expected(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      const double g = gate[i];
      const double inner = std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g);
      expected[i] = 0.5 * g * (1.0 + std::tanh(inner)) * up[i];
    }
    std::vector<float> output(static_cast<size_t>(count));
    cpu::gelu_gate(
        stream,
        {.gate = gate.data(), .up = up.data(), .output = output.data(), .num_elements = count});
    expect_near_all(output, expected, 2e-6, 2e-6, "gelu_gate " + std::to_string(count));
  }
  // The tanh form, not the exact erf GELU: at g = 1 they differ by ~1.6e-4.
  EXPECT_NEAR(cpu::gelu_tanh(1.0f), 0.8411920f, 1e-6f);
  EXPECT_NEAR(cpu::gelu_tanh(-3.0f), -0.0036373f, 1e-6f);
}

TEST(ScaleTest, MultipliesEveryElementInPlace) {
  ThreadPool pool(2);
  device::HostStream stream(pool);
  std::mt19937 rng(7);
  std::vector<float> x = random_floats(rng, 5000, -4.0f, 4.0f);
  std::vector<double> expected(x.begin(), x.end());
  for (double& value : expected) value *= 8.0;
  cpu::scale(stream, {.input = x.data(), .output = x.data(), .num_elements = 5000, .factor = 8.0f});
  expect_near_all(x, expected, 0.0, 0.0, "scale by 8 is exact");
}

TEST(SoftCapTest, BoundsValuesByTheCapAndKeepsSmallOnesNearlyUnchanged) {
  ThreadPool pool(2);
  device::HostStream stream(pool);
  std::mt19937 rng(8);
  std::vector<float> x = random_floats(rng, 5000, -200.0f, 200.0f);
  x[0] = 0.01f;
  std::vector<double> expected(x.size());
  for (size_t i = 0; i < x.size(); ++i) expected[i] = 30.0 * std::tanh(x[i] / 30.0);
  std::vector<float> output(x.size());
  cpu::soft_cap(stream,
                {.input = x.data(), .output = output.data(), .num_elements = 5000, .cap = 30.0f});
  expect_near_all(output, expected, 2e-6, 2e-6, "soft_cap 30");
  for (float value : output) EXPECT_LE(std::abs(value), 30.0f);
  EXPECT_NEAR(output[0], 0.01f, 1e-7f);
}

}  // namespace
}  // namespace folio::kernels::testing
