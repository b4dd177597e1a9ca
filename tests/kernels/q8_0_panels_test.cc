// q8_0 panels (kernels/cpu/q8_0_panels.h): the packed layout holds the file's values bit for
// bit (a row read back equals dequantize_row_q8_0's), and the matmul on panels gives exactly
// the q8_0 matmul's results, for every tile path (direct M <= 8, VNNI tiles from memory, AMX
// tiles) and partial last panels, and matches the double reference of matmul_test_util.h.
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "folio/base/thread_pool.h"
#include "folio/kernels/cpu/matmul.h"
#include "folio/kernels/cpu/q8_0_panels.h"
#include "folio/kernels/cpu/simd_level.h"
#include "folio/tensor/quant_blocks.h"
#include "folio/tensor/quantize.h"
#include "tests/kernels/matmul_test_util.h"

namespace folio::kernels::cpu {
namespace {

using namespace ::folio::kernels::cpu::matmul_testing;  // NOLINT

// The problem's q8_0 weight packed, in an aligned buffer (as the model allocates it).
AlignedBuffer pack(const Problem& problem) {
  AlignedBuffer panels(q8_0_panels_bytes(problem.output_features, problem.input_features));
  pack_q8_0_panels(problem.weight.data(), problem.output_features, problem.input_features, 0,
                   (problem.output_features + kQ8_0PanelRows - 1) / kQ8_0PanelRows, panels.data());
  return panels;
}

std::vector<float> run_on_panels(const Problem& problem, const std::byte* panels,
                                 device::HostStream& stream) {
  std::vector<float> output(problem.rows * problem.output_features,
                            std::numeric_limits<float>::quiet_NaN());
  const int64_t workspace_bytes = matmul_workspace_bytes(
      DType::kQ8_0Panels, problem.rows, problem.input_features, stream.pool().num_threads());
  AlignedBuffer workspace(workspace_bytes);
  MatmulArguments arguments = problem.arguments(output.data(), workspace.data(), workspace_bytes);
  arguments.weight = panels;
  arguments.weight_dtype = DType::kQ8_0Panels;
  matmul(stream, arguments);
  return output;
}

class Q8_0PanelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!q8_0_panels_supported()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  }
  ThreadPool single_thread_{1};
  ThreadPool two_threads_{2};
};

TEST(Q8_0PanelsLayoutTest, BytesArePanelsOfSixteenRowsWithThePartialLastPanelPadded) {
  EXPECT_EQ(q8_0_panels_bytes(16, 64), 16 * 2 * 34);
  EXPECT_EQ(q8_0_panels_bytes(17, 64), 2 * 16 * 2 * 34);
  EXPECT_EQ(q8_0_panels_bytes(1, 32), 16 * 34);
  EXPECT_EQ(q8_0_panels_bytes(0, 32), 0);
}

// Every value and scale survives packing: each row read back from the panels equals the q8_0
// row dequantized, bit for bit (including q = -128, which ggml never writes but a file may hold).
TEST(Q8_0PanelsLayoutTest, RowsReadBackEqualTheDequantizedQ8_0Rows) {
  std::mt19937 generator(7);
  for (int64_t rows : {1, 15, 16, 17, 40}) {
    for (int64_t k : {32, 96, 256}) {
      SCOPED_TRACE(fmt::format("N={} K={}", rows, k));
      std::vector<std::byte> weight(rows * row_bytes(DType::kQ8_0, k));
      for (int64_t row = 0; row < rows; ++row) {
        random_weight_row(DType::kQ8_0, weight.data() + row * row_bytes(DType::kQ8_0, k), k,
                          generator);
      }
      reinterpret_cast<BlockQ8_0*>(weight.data())->values[3] = -128;
      AlignedBuffer panels(q8_0_panels_bytes(rows, k));
      pack_q8_0_panels(weight.data(), rows, k, 0, (rows + 15) / 16, panels.data());
      std::vector<float> expected(k);
      std::vector<float> actual(k);
      for (int64_t row = 0; row < rows; ++row) {
        dequantize_row(DType::kQ8_0, weight.data() + row * row_bytes(DType::kQ8_0, k),
                       expected.data(), k);
        dequantize_q8_0_panels_row(panels.data(), k, row, actual.data());
        ASSERT_EQ(std::memcmp(expected.data(), actual.data(), k * sizeof(float)), 0)
            << "row " << row;
      }
    }
  }
}

// Packing panel ranges separately (as threads would) writes the same bytes as one call.
TEST(Q8_0PanelsLayoutTest, PanelRangesPackIndependently) {
  std::mt19937 generator(8);
  const int64_t rows = 50;
  const int64_t k = 64;
  std::vector<std::byte> weight(rows * row_bytes(DType::kQ8_0, k));
  for (int64_t row = 0; row < rows; ++row) {
    random_weight_row(DType::kQ8_0, weight.data() + row * row_bytes(DType::kQ8_0, k), k, generator);
  }
  AlignedBuffer whole(q8_0_panels_bytes(rows, k));
  AlignedBuffer parts(q8_0_panels_bytes(rows, k));
  pack_q8_0_panels(weight.data(), rows, k, 0, 4, whole.data());
  pack_q8_0_panels(weight.data(), rows, k, 2, 4, parts.data());
  pack_q8_0_panels(weight.data(), rows, k, 0, 2, parts.data());
  EXPECT_EQ(std::memcmp(whole.data(), parts.data(), q8_0_panels_bytes(rows, k)), 0);
}

// The packed matmul's results are the q8_0 matmul's, bit for bit: M = 1..17 (the direct tiles
// and the first tiles from memory), 31..33, 64, 100 and 300 (several tiles, AMX tiles and a
// VNNI remainder, more than one pass for K = 2048), N = 16 (one whole panel), 40 and 7 (a
// partial last panel), K of 1, 5 (odd: AMX's single-block tail) and 64 blocks; AMX on and off.
TEST_F(Q8_0PanelsTest, ResultsAreBitIdenticalToTheQ8_0MatmulForEveryM) {
  std::vector<int64_t> all_rows;
  for (int64_t rows = 1; rows <= 17; ++rows) all_rows.push_back(rows);
  for (int64_t rows : {31, 32, 33, 64, 100, 300}) all_rows.push_back(rows);
  std::vector<bool> amx_settings = {false};
  if (cpu_has_amx_int8()) amx_settings.push_back(true);
  uint32_t seed = 200;
  for (bool amx : amx_settings) {
    ScopedAmxEnabled scoped(amx);
    for (int64_t columns : {16, 40, 7}) {
      for (int64_t k : {32, 160, 2048}) {
        for (int64_t rows : all_rows) {
          if (k == 2048 && rows > 64 && columns != 40) continue;  // time: one N covers it
          const bool with_bias = (rows + columns) % 2 == 0;
          SCOPED_TRACE(fmt::format("amx={} M={} N={} K={}{}", amx, rows, columns, k,
                                   with_bias ? " bias" : ""));
          const Problem problem(rows, columns, k, DType::kQ8_0, with_bias, ++seed);
          AlignedBuffer panels = pack(problem);
          device::HostStream stream(rows % 2 == 0 ? two_threads_ : single_thread_);
          const std::vector<float> expected = problem.run(stream);
          const std::vector<float> actual = run_on_panels(problem, panels.data(), stream);
          ASSERT_EQ(std::memcmp(expected.data(), actual.data(), expected.size() * sizeof(float)),
                    0);
        }
      }
    }
  }
}

// Against the double reference every dtype is checked with (x quantized as the kernels do).
TEST_F(Q8_0PanelsTest, MatchesDoubleReference) {
  device::HostStream stream(single_thread_);
  uint32_t seed = 300;
  for (int64_t rows : {1, 3, 8, 9, 17, 64}) {
    for (int64_t k : {32, 96, 512}) {
      const int64_t columns = 37;
      const bool with_bias = (rows + k) % 3 == 0;
      SCOPED_TRACE(fmt::format("M={} N={} K={}{}", rows, columns, k, with_bias ? " bias" : ""));
      const Problem problem(rows, columns, k, DType::kQ8_0, with_bias, ++seed);
      AlignedBuffer panels = pack(problem);
      expect_matches_reference(problem, run_on_panels(problem, panels.data(), stream));
    }
  }
}

// The panels run the AVX-512 kernel whatever SIMD level is forced: no other kernel reads them.
TEST_F(Q8_0PanelsTest, RunsTheSameUnderEveryForcedSimdLevel) {
  device::HostStream stream(single_thread_);
  const Problem problem(5, 40, 96, DType::kQ8_0, true, 400);
  AlignedBuffer panels = pack(problem);
  const std::vector<float> expected = run_on_panels(problem, panels.data(), stream);
  for (SimdLevel level : supported_simd_levels()) {
    ScopedSimdLevel scoped(level);
    const std::vector<float> actual = run_on_panels(problem, panels.data(), stream);
    EXPECT_EQ(std::memcmp(expected.data(), actual.data(), expected.size() * sizeof(float)), 0)
        << simd_level_name(level);
  }
}

}  // namespace
}  // namespace folio::kernels::cpu
