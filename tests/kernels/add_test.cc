// Residual add: f32 addition rounds exactly once, so every path must give the correctly rounded
// sum bit for bit, across item boundaries and in place.
#include "folio/kernels/cpu/add.h"

#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "folio/base/thread_pool.h"
#include "folio/device/host_stream.h"
#include "kernel_test_util.h"

namespace folio::kernels::testing {
namespace {

class AddTest : public ::testing::TestWithParam<SimdPath> {};

TEST_P(AddTest, InPlaceResidualAddIsCorrectlyRounded) {
  ScopedSimdPath scoped(GetParam());
  ThreadPool pool(2);
  device::HostStream stream(pool);
  std::mt19937 rng(9);
  for (int64_t n : {1, 31, 4096, 4097, 3 * 4096 + 5}) {
    std::vector<float> residual = random_floats(rng, n, -100.0f, 100.0f);
    const std::vector<float> delta = random_floats(rng, n, -1.0f, 1.0f);
    std::vector<float> expected(n);
    for (int64_t i = 0; i < n; ++i) {
      expected[i] = static_cast<float>(double{residual[i]} + double{delta[i]});
    }
    cpu::add(
        stream,
        {.a = residual.data(), .b = delta.data(), .output = residual.data(), .num_elements = n});
    EXPECT_EQ(residual, expected) << n;
  }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, AddTest, ::testing::ValuesIn(supported_simd_paths()),
                         simd_path_test_name);

}  // namespace
}  // namespace folio::kernels::testing
