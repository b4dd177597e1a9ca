#include "folio/kernels/cpu/matmul.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "folio/base/thread_pool.h"
#include "folio/kernels/cpu/matmul_kernels.h"
#include "folio/kernels/cpu/simd_level.h"
#include "folio/tensor/quantize.h"
#include "tests/kernels/matmul_test_util.h"

namespace folio::kernels::cpu {
namespace {

using namespace ::folio::kernels::cpu::matmul_testing;  // NOLINT

struct Shape {
  int64_t rows;
  int64_t output_features;
  int64_t input_features;
};

// Odd row counts (1, 3, 17: partial x tiles; 17 >= kConvertedGroupMinRows), column counts that
// are not a multiple of the 4-row group, K with an odd number of 32-blocks (288 = 9 blocks);
// {kSgemmMinRows, kSgemmMinInputFeatures} takes the sgemm path for f32; 200 x 1024 (f32) and
// 300 x 1024 (8-bit x) are more than one pass of x rows (rows_per_pass).
const Shape kShapes[] = {{1, 37, 64},
                         {3, 9, 288},
                         {17, 70, 96},
                         {2, 6, 1024},
                         {kSgemmMinRows, 23, kSgemmMinInputFeatures},
                         {200, 9, 1024},
                         {300, 6, 1024}};

class MatmulTest : public ::testing::Test {
 protected:
  ThreadPool single_thread_{1};
  ThreadPool two_threads_{2};
};

TEST_F(MatmulTest, MatchesDoubleReferenceForEveryDtypeAndSimdLevel) {
  device::HostStream stream(single_thread_);
  uint32_t seed = 1;
  for (SimdLevel level : supported_simd_levels()) {
    ScopedSimdLevel scoped(level);
    for (DType dtype : kWeightDtypes) {
      for (const Shape& shape : kShapes) {
        for (bool with_bias : {false, true}) {
          SCOPED_TRACE(std::string(simd_level_name(level)) + " " + std::string(dtype_name(dtype)) +
                       " M=" + std::to_string(shape.rows) +
                       " N=" + std::to_string(shape.output_features) +
                       " K=" + std::to_string(shape.input_features) + (with_bias ? " bias" : ""));
          const Problem problem(shape.rows, shape.output_features, shape.input_features, dtype,
                                with_bias, ++seed);
          expect_matches_reference(problem, problem.run(stream));
        }
      }
    }
  }
}

// A row's result depends only on that row of x: the same whether it is alone in the step or
// batched with others (apart from f32 steps that go to sgemm), across passes of x rows too.
TEST_F(MatmulTest, RowResultsDoNotDependOnTheOtherRowsOfTheBatch) {
  device::HostStream stream(two_threads_);
  for (SimdLevel level : supported_simd_levels()) {
    ScopedSimdLevel scoped(level);
    for (DType dtype : kWeightDtypes) {
      SCOPED_TRACE(std::string(simd_level_name(level)) + " " + std::string(dtype_name(dtype)));
      // 300 rows of 1024 values are two passes (rows_per_pass) whatever the dtype.
      const int64_t batch_rows = 300;
      Problem batch(batch_rows, 45, 1024, dtype, true, 9);
      const std::vector<float> batched = batch.run(stream);
      for (int64_t row : {int64_t{0}, int64_t{6}, int64_t{200}, batch_rows - 1}) {
        Problem single = batch;
        single.rows = 1;
        single.input.assign(batch.input.begin() + row * 1024,
                            batch.input.begin() + (row + 1) * 1024);
        const std::vector<float> alone = single.run(stream);
        ASSERT_EQ(std::memcmp(alone.data(), batched.data() + row * 45, 45 * sizeof(float)), 0)
            << "row " << row;
      }
    }
  }
}

// A column's result depends only on its weight row: the same whatever rows of W surround it
// (AVX-512's q8_0 kernel takes W in panels of 16 rows, the last one partial, and transposes
// them in registers for one tile of x or into the scratch for more).
TEST_F(MatmulTest, ColumnResultsDoNotDependOnTheOtherRowsOfTheWeight) {
  device::HostStream stream(two_threads_);
  constexpr int64_t kInputFeatures = 256;
  constexpr int64_t kColumns = 45;
  constexpr int64_t kFirst = 20;  // columns 20-44: a whole panel then a partial one
  for (SimdLevel level : supported_simd_levels()) {
    ScopedSimdLevel scoped(level);
    for (DType dtype : kWeightDtypes) {
      for (int64_t rows : {int64_t{1}, int64_t{5}, int64_t{19}}) {
        SCOPED_TRACE(std::string(simd_level_name(level)) + " " + std::string(dtype_name(dtype)) +
                     " M=" + std::to_string(rows));
        const Problem whole(rows, kColumns, kInputFeatures, dtype, true, 11);
        const std::vector<float> all = whole.run(stream);
        Problem part = whole;
        const int64_t weight_row_bytes = row_bytes(dtype, kInputFeatures);
        part.output_features = kColumns - kFirst;
        part.weight.assign(whole.weight.begin() + kFirst * weight_row_bytes, whole.weight.end());
        part.bias.assign(whole.bias.begin() + kFirst, whole.bias.end());
        part.widen();
        const std::vector<float> some = part.run(stream);
        for (int64_t row = 0; row < rows; ++row) {
          ASSERT_EQ(std::memcmp(some.data() + row * part.output_features,
                                all.data() + row * kColumns + kFirst,
                                part.output_features * sizeof(float)),
                    0)
              << "row " << row;
        }
      }
    }
  }
}

// AMX tiles (16 rows of x at a time) give the VNNI tiles' results bit for bit: they only add
// up the same exact integer block products faster.
TEST_F(MatmulTest, AmxTilesGiveTheVnniResults) {
  if (!cpu_has_amx_int8()) GTEST_SKIP() << "no AMX int8 on this CPU (or not granted by Linux)";
  device::HostStream stream(two_threads_);
  ScopedSimdLevel scoped(SimdLevel::kAvx512);
  // 16 and 32 rows: whole AMX tiles; 17, 45: a VNNI tail; 300 x 1024: two passes.
  const Shape shapes[] = {
      {16, 37, 256}, {17, 70, 96}, {32, 16, 2048}, {45, 9, 288}, {300, 40, 1024}};
  for (const Shape& shape : shapes) {
    SCOPED_TRACE("M=" + std::to_string(shape.rows) + " N=" + std::to_string(shape.output_features) +
                 " K=" + std::to_string(shape.input_features));
    const Problem problem(shape.rows, shape.output_features, shape.input_features, DType::kQ8_0,
                          true, 21);
    std::vector<float> with_amx;
    std::vector<float> without_amx;
    {
      ScopedAmxEnabled amx(true);
      with_amx = problem.run(stream);
    }
    {
      ScopedAmxEnabled amx(false);
      without_amx = problem.run(stream);
    }
    ASSERT_EQ(with_amx.size(), without_amx.size());
    EXPECT_EQ(std::memcmp(with_amx.data(), without_amx.data(), with_amx.size() * sizeof(float)), 0);
    expect_matches_reference(problem, with_amx);
  }
}

TEST_F(MatmulTest, Q8WeightsOfMinus128AreMultipliedExactly) {
  // ggml's quantizer never writes -128, but a q8_0 file may hold it: the AVX-512 (+128 offset)
  // and AVX2 (|w| with x's sign) tricks must both stay exact for it.
  device::HostStream stream(single_thread_);
  Problem problem(3, 8, 64, DType::kQ8_0, false, 4);
  auto* blocks = reinterpret_cast<BlockQ8_0*>(problem.weight.data());
  for (int64_t block = 0; block < 8 * 2; ++block) {
    for (int i = 0; i < 32; ++i) blocks[block].values[i] = (i + block) % 3 == 0 ? -128 : 127;
  }
  problem.widen();
  for (SimdLevel level : supported_simd_levels()) {
    ScopedSimdLevel scoped(level);
    SCOPED_TRACE(std::string(simd_level_name(level)));
    expect_matches_reference(problem, problem.run(stream));
  }
}

TEST_F(MatmulTest, NonFiniteInputsPoisonOnlyTheirOwnRow) {
  device::HostStream stream(single_thread_);
  for (SimdLevel level : supported_simd_levels()) {
    ScopedSimdLevel scoped(level);
    for (DType dtype : kWeightDtypes) {
      SCOPED_TRACE(std::string(simd_level_name(level)) + " " + std::string(dtype_name(dtype)));
      Problem problem(3, 10, 64, dtype, false, 8);
      problem.input[64 + 5] = std::numeric_limits<float>::quiet_NaN();
      const std::vector<float> output = problem.run(stream);
      for (int64_t column = 0; column < 10; ++column) {
        EXPECT_TRUE(std::isnan(output[10 + column])) << column;
        EXPECT_TRUE(std::isfinite(output[column])) << column;
        EXPECT_TRUE(std::isfinite(output[20 + column])) << column;
      }
    }
  }
}

// The AVX-512 quantizer of x must write the portable quantizer's bytes, ties and tiny and
// non-finite blocks included, so both levels' int8 products see the same x.
TEST_F(MatmulTest, SimdActivationQuantizerWritesThePortableBytes) {
  if (detected_simd_level() != SimdLevel::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  constexpr int64_t kRows = 3;
  constexpr int64_t kFeatures = 32 * 6;
  std::vector<float> input(kRows * kFeatures);
  std::mt19937 generator(17);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& value : input) value = normal(generator);
  // Block 0: amax 127 makes d = 1, so these are exact ties and near-ties of roundf.
  const float ties[] = {127.0f, 2.5f, -2.5f, 0.5f, -0.5f, 0.49999997f, -126.5f, 3.4999998f};
  std::copy(std::begin(ties), std::end(ties), input.begin());
  std::fill(input.begin() + 32, input.begin() + 64, 0.0f);  // all zero
  input[70] = 1e-39f;                                       // 1/d overflows
  std::fill(input.begin() + 64, input.begin() + 70, 0.0f);
  input[kFeatures + 40] = std::numeric_limits<float>::infinity();  // non-finite
  input[2 * kFeatures + 100] = std::numeric_limits<float>::quiet_NaN();
  for (DType dtype : {DType::kQ8_0, DType::kQ4_0}) {
    MatmulArguments arguments;
    arguments.input = input.data();
    arguments.num_rows = kRows;
    arguments.input_features = kFeatures;
    arguments.weight_dtype = dtype;
    const int64_t bytes = internal::quantized_activations_layout(kRows, kFeatures).total_bytes;
    AlignedBuffer portable(bytes);
    AlignedBuffer simd(bytes);
    std::memset(portable.data(), 0x5a, bytes);
    std::memset(simd.data(), 0x5a, bytes);
    internal::quantize_activation_rows_portable(arguments, portable.data(), 0, kRows);
    internal::quantize_activation_rows_avx512(arguments, simd.data(), 0, kRows);
    EXPECT_EQ(std::memcmp(portable.data(), simd.data(), bytes), 0) << dtype_name(dtype);
    const auto* values = reinterpret_cast<const int8_t*>(portable.data());
    EXPECT_EQ(values[1], 3);  // 2.5 rounds away from zero
    EXPECT_EQ(values[2], -3);
    EXPECT_EQ(values[5], 0);  // 0.49999997 is below the tie
    EXPECT_EQ(values[6], -127);
  }
}

TEST_F(MatmulTest, EmptyShapesLaunchNothing) {
  device::HostStream stream(single_thread_);
  const Problem problem(0, 16, 64, DType::kQ8_0, true, 2);
  std::vector<float> output;
  matmul(stream, problem.arguments(output.data(), nullptr, 0));
  EXPECT_EQ(stream.num_eager_launches(), 0u);
}

TEST_F(MatmulTest, WorkspaceSizeFollowsTheShapeAndThreadCount) {
  EXPECT_EQ(matmul_workspace_bytes(DType::kF32, 7, 256, 4), 0);
  // One widened group of 4 weight rows per thread.
  EXPECT_EQ(matmul_workspace_bytes(DType::kF16, 7, 256, 2), 2 * 4 * 256 * 4);
  // x as int8 values, int32 lane corrections and f32 lane scales: 3 bytes per value.
  EXPECT_EQ(matmul_workspace_bytes(DType::kQ4_0, 4, 256, 8), 3 * 4 * 256);
  // q8_0 adds a transposed panel per thread: per 32-value block 16 rows x 32 bytes and 16 f32
  // scales; nothing for no rows.
  EXPECT_EQ(matmul_workspace_bytes(DType::kQ8_0, 4, 256, 2), 3 * 4 * 256 + 2 * 8 * (512 + 64));
  EXPECT_EQ(matmul_workspace_bytes(DType::kQ8_0, 0, 256, 2), 0);
}

TEST(MatmulDeathTest, RejectsAnUndersizedWorkspace) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenBLAS has started its threads
  ThreadPool pool(1);
  device::HostStream stream(pool);
  const Problem problem(2, 8, 64, DType::kQ8_0, false, 3);
  std::vector<float> output(16);
  AlignedBuffer workspace(64);
  EXPECT_DEATH(matmul(stream, problem.arguments(output.data(), workspace.data(), 64)),
               "workspace of 64 bytes");
}

TEST(MatmulDeathTest, RejectsInputFeaturesThatAreNotWholeBlocks) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ThreadPool pool(1);
  device::HostStream stream(pool);
  Problem problem(2, 8, 64, DType::kF32, false, 3);
  problem.input_features = 48;
  std::vector<float> output(16);
  EXPECT_DEATH(matmul(stream, problem.arguments(output.data(), nullptr, 0)), "multiple of 32");
}

}  // namespace
}  // namespace folio::kernels::cpu
