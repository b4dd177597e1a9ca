// Softmax with per-row temperatures on every SIMD path against a double reference; greedy rows
// for temperature <= 0 (and NaN); temperatures read at replay time.
#include "folio/kernels/cpu/softmax.h"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "folio/base/thread_pool.h"
#include "folio/device/host_stream.h"
#include "kernel_test_util.h"

namespace folio::kernels::testing {
namespace {

// Logits in [-20, 20] and temperatures down to 0.5: the f32 exponent argument
// (x - max) / T, up to 80, carries a rounding error of ~80 * 2^-24, i.e. ~5e-6 relative in a
// probability; the sum and final scaling add ~1e-6.
constexpr double kRelativeTolerance = 2e-5;
constexpr double kAbsoluteTolerance = 1e-12;

std::vector<double> reference_softmax(const std::vector<float>& logits, int64_t columns,
                                      const std::vector<float>& temperatures) {
  std::vector<double> expected(logits.size());
  for (size_t row = 0; row * columns < logits.size(); ++row) {
    const float* x = logits.data() + row * columns;
    double* p = expected.data() + row * columns;
    const double temperature = temperatures.empty() ? 1.0 : temperatures[row];
    double best = -1e300;
    for (int64_t i = 0; i < columns; ++i) best = std::max(best, double{x[i]});
    if (!(temperature > 0)) {  // greedy: one-hot at the first maximum
      bool found = false;
      for (int64_t i = 0; i < columns; ++i) {
        p[i] = (!found && x[i] == best) ? 1.0 : 0.0;
        found = found || x[i] == best;
      }
      continue;
    }
    double total = 0;
    for (int64_t i = 0; i < columns; ++i) total += p[i] = std::exp((x[i] - best) / temperature);
    for (int64_t i = 0; i < columns; ++i) p[i] /= total;
  }
  return expected;
}

class SoftmaxTest : public ::testing::TestWithParam<SimdPath> {};

TEST_P(SoftmaxTest, MatchesReferenceWithPerRowTemperatures) {
  ScopedSimdPath scoped(GetParam());
  ThreadPool pool(2);
  device::HostStream stream(pool);
  std::mt19937 rng(77);
  for (int64_t columns : {1, 7, 33, 32000}) {
    const std::vector<float> temperatures = {1.0f, 0.5f,  2.0f,
                                             0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN()};
    const int64_t rows = static_cast<int64_t>(temperatures.size());
    std::vector<float> logits = random_floats(rng, rows * columns, -20.0f, 20.0f);
    logits[3 * columns + columns / 2] = 25.0f;  // a tie for the greedy row: first one wins
    logits[3 * columns + columns - 1] = 25.0f;
    const std::vector<double> expected = reference_softmax(logits, columns, temperatures);
    std::vector<float> output(logits.size());
    cpu::softmax(stream, {.input = logits.data(),
                          .output = output.data(),
                          .temperatures = temperatures.data(),
                          .num_rows = rows,
                          .num_columns = columns});
    expect_near_all(output, expected, kAbsoluteTolerance, kRelativeTolerance,
                    "columns " + std::to_string(columns));

    // No temperatures: 1 everywhere; in place.
    const std::vector<double> plain = reference_softmax(logits, columns, {});
    cpu::softmax(stream, {.input = logits.data(),
                          .output = logits.data(),
                          .temperatures = nullptr,
                          .num_rows = rows,
                          .num_columns = columns});
    expect_near_all(logits, plain, kAbsoluteTolerance, kRelativeTolerance, "in place");
  }
}

TEST_P(SoftmaxTest, ReplayReadsTheCurrentTemperatures) {
  ScopedSimdPath scoped(GetParam());
  ThreadPool pool(2);
  device::HostStream stream(pool);
  std::mt19937 rng(1);
  const std::vector<float> logits = random_floats(rng, 2 * 100, -5.0f, 5.0f);
  std::vector<float> temperatures = {1.0f, 1.0f};
  std::vector<float> output(logits.size());
  stream.begin_capture();
  cpu::softmax(stream, {.input = logits.data(),
                        .output = output.data(),
                        .temperatures = temperatures.data(),
                        .num_rows = 2,
                        .num_columns = 100});
  const device::HostGraph graph = stream.end_capture();
  temperatures = {0.7f, 0.0f};  // same buffer (same size), new values
  stream.replay(graph);
  expect_near_all(output, reference_softmax(logits, 100, temperatures), kAbsoluteTolerance,
                  kRelativeTolerance, "replay");
}

INSTANTIATE_TEST_SUITE_P(AllPaths, SoftmaxTest, ::testing::ValuesIn(supported_simd_paths()),
                         simd_path_test_name);

}  // namespace
}  // namespace folio::kernels::testing
