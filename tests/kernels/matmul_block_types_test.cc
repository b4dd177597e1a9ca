// The matmul with the block types of downloaded GGUF files (q4_1, q5_0, q5_1, q2_K..q6_K,
// iq4_nl, iq4_xs), on every SIMD level, against the double reference of matmul_test_util.h:
// weights as tensor's dequantize_row reads them, x quantized as the kernels quantize it.
// Weights are random block bytes (any quant, sub-block scale and high bit; finite f16 scales),
// so every decoder path (bit positions, scale unpacking, the grid) is exercised.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "folio/base/thread_pool.h"
#include "folio/kernels/cpu/matmul.h"
#include "folio/kernels/cpu/matmul_kernels.h"
#include "folio/kernels/cpu/simd_level.h"
#include "folio/tensor/quantize.h"
#include "tests/kernels/matmul_test_util.h"

namespace folio::kernels::cpu {
namespace {

using namespace ::folio::kernels::cpu::matmul_testing;  // NOLINT

bool is_super_block(DType dtype) {
  return dtype_info(dtype).block_elements == kSuperBlockElements;
}

class MatmulBlockTypesTest : public ::testing::Test {
 protected:
  ThreadPool single_thread_{1};
  ThreadPool two_threads_{2};
};

// M = 1, 3, 17, 64 (partial and whole tiles of x), N = 37 (not a multiple of the 4-row group),
// K = 256, 512, 2304 (one, two and nine super-blocks) and, for the 32-value block types, 96
// (an odd number of blocks: the AVX-512 half-vector step).
TEST_F(MatmulBlockTypesTest, MatchesDoubleReferenceForEveryBlockDtypeAndSimdLevel) {
  device::HostStream stream(single_thread_);
  uint32_t seed = 100;
  for (SimdLevel level : supported_simd_levels()) {
    ScopedSimdLevel scoped(level);
    for (DType dtype : kBlockDtypes) {
      std::vector<int64_t> input_features = {256, 512, 2304};
      if (!is_super_block(dtype)) input_features.push_back(96);
      for (int64_t rows : {1, 3, 17, 64}) {
        for (int64_t k : input_features) {
          const bool with_bias = (rows + k) % 3 == 0;
          const int64_t columns = rows == 64 && k == 2304 ? 9 : 37;
          SCOPED_TRACE(fmt::format("{} {} M={} N={} K={}{}", simd_level_name(level),
                                   dtype_name(dtype), rows, columns, k, with_bias ? " bias" : ""));
          const Problem problem(rows, columns, k, dtype, with_bias, ++seed);
          expect_matches_reference(problem, problem.run(stream));
        }
      }
    }
  }
}

// Quant bytes all ones or all zeros (largest and smallest integers, every high bit set or
// clear) against x at +-amax (|q| = 127): the products and pair sums at their extremes, where
// the AVX2 maddubs would saturate if a decoder produced values above its bound.
TEST_F(MatmulBlockTypesTest, ExtremeQuantBytesAreMultipliedExactly) {
  device::HostStream stream(single_thread_);
  for (DType dtype : kBlockDtypes) {
    for (uint8_t fill : {uint8_t{0xff}, uint8_t{0x00}}) {
      Problem problem(2, 6, 256, dtype, false, 7);
      const DTypeInfo info = dtype_info(dtype);
      const BlockHalfFields fields = block_half_fields(dtype);
      for (int64_t block = 0;
           block < static_cast<int64_t>(problem.weight.size()) / info.block_bytes; ++block) {
        std::byte* bytes = problem.weight.data() + block * info.block_bytes;
        for (int64_t i = 0; i < info.block_bytes; ++i) {
          const bool is_half =
              i == fields.scale || i == fields.scale + 1 ||
              (fields.minimum >= 0 && (i == fields.minimum || i == fields.minimum + 1));
          if (!is_half) bytes[i] = static_cast<std::byte>(fill);
        }
      }
      problem.widen();
      for (int64_t k = 0; k < static_cast<int64_t>(problem.input.size()); ++k) {
        problem.input[k] = (k % 3 == 0) ? -2.0f : 2.0f;
      }
      for (SimdLevel level : supported_simd_levels()) {
        ScopedSimdLevel scoped(level);
        SCOPED_TRACE(
            fmt::format("{} {} fill {:#x}", simd_level_name(level), dtype_name(dtype), fill));
        expect_matches_reference(problem, problem.run(stream));
      }
    }
  }
}

// A row's result depends only on that row of x (alone or in a 300-row, two-pass batch), and
// not on the thread count.
TEST_F(MatmulBlockTypesTest, RowResultsDoNotDependOnTheBatchOrTheThreadCount) {
  device::HostStream one(single_thread_);
  device::HostStream two(two_threads_);
  constexpr int64_t kFeatures = 1024;
  constexpr int64_t kColumns = 45;
  for (SimdLevel level : supported_simd_levels()) {
    ScopedSimdLevel scoped(level);
    for (DType dtype : kBlockDtypes) {
      SCOPED_TRACE(fmt::format("{} {}", simd_level_name(level), dtype_name(dtype)));
      const int64_t batch_rows = 300;
      Problem batch(batch_rows, kColumns, kFeatures, dtype, true, 9);
      const std::vector<float> batched = batch.run(two);
      const std::vector<float> batched_one_thread = batch.run(one);
      ASSERT_EQ(
          std::memcmp(batched.data(), batched_one_thread.data(), batched.size() * sizeof(float)),
          0);
      for (int64_t row : {int64_t{0}, int64_t{6}, int64_t{200}, batch_rows - 1}) {
        Problem single = batch;
        single.rows = 1;
        single.input.assign(batch.input.begin() + row * kFeatures,
                            batch.input.begin() + (row + 1) * kFeatures);
        const std::vector<float> alone = single.run(one);
        ASSERT_EQ(
            std::memcmp(alone.data(), batched.data() + row * kColumns, kColumns * sizeof(float)), 0)
            << "row " << row;
      }
    }
  }
}

TEST_F(MatmulBlockTypesTest, NonFiniteInputsPoisonOnlyTheirOwnRow) {
  device::HostStream stream(single_thread_);
  for (SimdLevel level : supported_simd_levels()) {
    ScopedSimdLevel scoped(level);
    for (DType dtype : kBlockDtypes) {
      SCOPED_TRACE(fmt::format("{} {}", simd_level_name(level), dtype_name(dtype)));
      Problem problem(3, 10, 256, dtype, false, 8);
      problem.input[256 + 5] = std::numeric_limits<float>::quiet_NaN();
      const std::vector<float> output = problem.run(stream);
      for (int64_t column = 0; column < 10; ++column) {
        EXPECT_TRUE(std::isnan(output[10 + column])) << column;
        EXPECT_TRUE(std::isfinite(output[column])) << column;
        EXPECT_TRUE(std::isfinite(output[20 + column])) << column;
      }
    }
  }
}

// The scaled lane sums the dtypes with minimums use: the AVX-512 quantizer writes the portable
// one's bytes (the offset corrections are matmul_test.cc's).
TEST_F(MatmulBlockTypesTest, SimdActivationQuantizerWritesThePortableScaledSums) {
  if (detected_simd_level() != SimdLevel::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  constexpr int64_t kRows = 2;
  constexpr int64_t kFeatures = 256;
  Problem problem(kRows, 1, kFeatures, DType::kQ4_K, false, 11);
  problem.input[kFeatures + 3] = std::numeric_limits<float>::infinity();
  for (DType dtype : {DType::kQ4_K, DType::kQ4_1, DType::kQ6_K, DType::kIQ4_XS}) {
    MatmulArguments arguments;
    arguments.input = problem.input.data();
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
  }
}

TEST(MatmulBlockTypesDeathTest, RejectsInputFeaturesThatAreNotWholeSuperBlocks) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ThreadPool pool(1);
  device::HostStream stream(pool);
  for (DType dtype : {DType::kQ4_K, DType::kIQ4_XS}) {
    // 288 is a multiple of 32 (so the shape check of the 32-value types passes) but not of 256.
    Problem problem(2, 8, 256, DType::kQ4_K, false, 3);
    problem.dtype = dtype;
    problem.input_features = 288;
    problem.input.resize(2 * 288);
    std::vector<float> output(16);
    AlignedBuffer workspace(1 << 16);
    EXPECT_DEATH(matmul(stream, problem.arguments(output.data(), workspace.data(), 1 << 16)),
                 "must be a multiple of 256");
  }
}

}  // namespace
}  // namespace folio::kernels::cpu
