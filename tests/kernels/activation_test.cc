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

}  // namespace
}  // namespace folio::kernels::testing
