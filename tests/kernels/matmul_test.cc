#include "folio/kernels/cpu/matmul.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "folio/base/thread_pool.h"
#include "folio/kernels/cpu/simd_level.h"
#include "folio/tensor/quantize.h"

namespace folio::kernels::cpu {
namespace {

constexpr DType kWeightDtypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0,
                                   DType::kQ4_0};
constexpr double kUnitRoundoff = 1.0 / (1 << 24);

bool is_quantized(DType dtype) {
  return dtype == DType::kQ8_0 || dtype == DType::kQ4_0;
}

// Workspace memory with the 64-byte alignment matmul requires.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(int64_t bytes) : storage_(bytes + 64) {}
  std::byte* data() {
    const auto address = reinterpret_cast<uintptr_t>(storage_.data());
    return storage_.data() + (64 - address % 64) % 64;
  }

 private:
  std::vector<std::byte> storage_;
};

// A random problem: x, a weight stored in `dtype`, the weight as the kernel sees it (widened
// to f32 exactly from the stored form), and an optional bias.
struct Problem {
  int64_t rows = 0;
  int64_t output_features = 0;
  int64_t input_features = 0;
  DType dtype = DType::kF32;
  std::vector<float> input;           // f32 [rows, input_features]
  std::vector<std::byte> weight;      // dtype [output_features, input_features]
  std::vector<float> widened_weight;  // f32 [output_features, input_features]
  std::vector<float> bias;            // f32 [output_features] or empty

  Problem(int64_t m, int64_t n, int64_t k, DType weight_dtype, bool with_bias, uint32_t seed)
      : rows(m), output_features(n), input_features(k), dtype(weight_dtype) {
    std::mt19937 generator(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    input.resize(m * k);
    for (float& value : input) value = normal(generator);
    std::vector<float> values(n * k);
    for (float& value : values) value = 0.1f * normal(generator);
    const int64_t stride = row_bytes(dtype, k);
    weight.resize(n * stride);
    widened_weight.resize(n * k);
    for (int64_t row = 0; row < n; ++row) {
      quantize_row(dtype, values.data() + row * k, weight.data() + row * stride, k);
      dequantize_row(dtype, weight.data() + row * stride, widened_weight.data() + row * k, k);
    }
    if (with_bias) {
      bias.resize(n);
      for (float& value : bias) value = normal(generator);
    }
  }

  // Runs the matmul on `stream` into a NaN-filled output (so an element never written shows).
  std::vector<float> run(device::HostStream& stream) const {
    std::vector<float> output(rows * output_features, std::numeric_limits<float>::quiet_NaN());
    const int64_t workspace_bytes =
        matmul_workspace_bytes(dtype, rows, input_features, stream.pool().num_threads());
    AlignedBuffer workspace(workspace_bytes);
    matmul(stream, arguments(output.data(), workspace.data(), workspace_bytes));
    return output;
  }

  MatmulArguments arguments(float* output, std::byte* workspace, int64_t workspace_bytes) const {
    MatmulArguments arguments;
    arguments.input = input.data();
    arguments.weight = weight.data();
    arguments.bias = bias.empty() ? nullptr : bias.data();
    arguments.output = output;
    arguments.workspace = workspace;
    arguments.workspace_bytes = workspace_bytes;
    arguments.num_rows = rows;
    arguments.input_features = input_features;
    arguments.output_features = output_features;
    arguments.weight_dtype = dtype;
    return arguments;
  }
};

// x quantized as the int8 kernels quantize it (32-value blocks, d = amax / 127 in f32,
// q = round(x * (1 / d))), written here independently of the kernel's code.
struct QuantizedRow {
  std::vector<double> scales;  // per block
  std::vector<int> values;
};

QuantizedRow quantize_reference(const float* input, int64_t count) {
  QuantizedRow row;
  for (int64_t block = 0; block < count / 32; ++block) {
    float max_magnitude = 0.0f;
    for (int64_t i = 0; i < 32; ++i)
      max_magnitude = std::max(max_magnitude, std::fabs(input[block * 32 + i]));
    const float scale = max_magnitude / 127.0f;
    const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    row.scales.push_back(scale);
    for (int64_t i = 0; i < 32; ++i)
      row.values.push_back(static_cast<int>(std::roundf(input[block * 32 + i] * inverse)));
  }
  return row;
}

// Checks every output element against a double-precision reference:
// - float weights: sum_k x * w, within the rounding of a K-term f32 sum (K u sum_k |x w|);
// - quantized weights: first against the sum with x quantized as above (the same bound, so
//   the integer part of the kernel must be exact), then against the unquantized x within the
//   quantization error of x (half a step per value: sum_b d_b / 2 * sum_{k in b} |w_k|).
void expect_matches_reference(const Problem& problem, const std::vector<float>& output) {
  const int64_t k_count = problem.input_features;
  const double rounding = static_cast<double>(k_count + 2) * kUnitRoundoff;
  int failures = 0;
  for (int64_t row = 0; row < problem.rows && failures < 5; ++row) {
    const float* x = problem.input.data() + row * k_count;
    const QuantizedRow quantized = quantize_reference(x, k_count);
    for (int64_t column = 0; column < problem.output_features && failures < 5; ++column) {
      const float* w = problem.widened_weight.data() + column * k_count;
      const double bias = problem.bias.empty() ? 0.0 : problem.bias[column];
      double exact = bias;
      double magnitude = std::fabs(bias);
      double with_quantized_x = bias;
      double quantized_magnitude = std::fabs(bias);
      double quantization_error = 0.0;
      for (int64_t k = 0; k < k_count; ++k) {
        exact += static_cast<double>(x[k]) * w[k];
        magnitude += std::fabs(static_cast<double>(x[k]) * w[k]);
        const double xq = quantized.scales[k / 32] * quantized.values[k];
        with_quantized_x += xq * w[k];
        quantized_magnitude += std::fabs(xq * w[k]);
        quantization_error += quantized.scales[k / 32] / 2 * std::fabs(w[k]);
      }
      const double actual = output[row * problem.output_features + column];
      const std::string where = "row " + std::to_string(row) + " column " + std::to_string(column);
      if (!is_quantized(problem.dtype)) {
        if (!(std::fabs(actual - exact) <= rounding * magnitude + 1e-30)) ++failures;
        EXPECT_NEAR(actual, exact, rounding * magnitude + 1e-30) << where;
      } else {
        const double tight = rounding * quantized_magnitude + 1e-30;
        if (!(std::fabs(actual - with_quantized_x) <= tight)) ++failures;
        EXPECT_NEAR(actual, with_quantized_x, tight) << where;
        EXPECT_NEAR(actual, exact, quantization_error + tight) << where;
      }
    }
  }
}

struct Shape {
  int64_t rows;
  int64_t output_features;
  int64_t input_features;
};

// Odd row counts (1, 3, 17: partial x tiles; 17 >= kConvertedGroupMinRows), column counts that
// are not a multiple of the 4-row group, K with an odd number of 32-blocks (288 = 9 blocks);
// 40 and 150 rows take the sgemm path for f32 (150 = two row tiles).
const Shape kShapes[] = {{1, 37, 64},  {3, 9, 288},   {17, 70, 96},
                         {2, 6, 1024}, {40, 23, 160}, {150, 131, 64}};

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

TEST_F(MatmulTest, ResultsAreIdenticalForOneAndTwoThreads) {
  device::HostStream one(single_thread_);
  device::HostStream two(two_threads_);
  for (SimdLevel level : supported_simd_levels()) {
    ScopedSimdLevel scoped(level);
    for (DType dtype : kWeightDtypes) {
      for (const Shape& shape : {Shape{1, 203, 256}, Shape{17, 203, 128}, Shape{150, 300, 64}}) {
        SCOPED_TRACE(std::string(simd_level_name(level)) + " " + std::string(dtype_name(dtype)) +
                     " M=" + std::to_string(shape.rows));
        const Problem problem(shape.rows, shape.output_features, shape.input_features, dtype, true,
                              5);
        const std::vector<float> single = problem.run(one);
        const std::vector<float> parallel = problem.run(two);
        ASSERT_EQ(std::memcmp(single.data(), parallel.data(), single.size() * sizeof(float)), 0);
      }
    }
  }
}

// A row's result depends only on that row of x: the same whether it is alone in the step or
// batched with others (apart from f32 at M >= kSgemmMinRows, which goes to sgemm).
TEST_F(MatmulTest, RowResultsDoNotDependOnTheOtherRowsOfTheBatch) {
  device::HostStream stream(two_threads_);
  for (SimdLevel level : supported_simd_levels()) {
    ScopedSimdLevel scoped(level);
    for (DType dtype : kWeightDtypes) {
      SCOPED_TRACE(std::string(simd_level_name(level)) + " " + std::string(dtype_name(dtype)));
      const int64_t batch_rows = dtype == DType::kF32 ? kSgemmMinRows - 1 : 33;
      Problem batch(batch_rows, 45, 96, dtype, true, 9);
      const std::vector<float> batched = batch.run(stream);
      for (int64_t row : {int64_t{0}, int64_t{6}, batch_rows - 1}) {
        Problem single = batch;
        single.rows = 1;
        single.input.assign(batch.input.begin() + row * 96, batch.input.begin() + (row + 1) * 96);
        const std::vector<float> alone = single.run(stream);
        ASSERT_EQ(std::memcmp(alone.data(), batched.data() + row * 45, 45 * sizeof(float)), 0)
            << "row " << row;
      }
    }
  }
}

TEST_F(MatmulTest, ReplayOfACapturedLaunchMatchesEagerLaunchOnNewInputs) {
  device::HostStream stream(two_threads_);
  for (DType dtype : kWeightDtypes) {
    for (int64_t rows : {int64_t{1}, int64_t{17}, int64_t{64}}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " M=" + std::to_string(rows));
      Problem problem(rows, 77, 128, dtype, true, 21);
      const int64_t workspace_bytes =
          matmul_workspace_bytes(dtype, rows, 128, stream.pool().num_threads());
      AlignedBuffer workspace(workspace_bytes);
      std::vector<float> replayed(rows * 77, std::numeric_limits<float>::quiet_NaN());
      stream.begin_capture();
      matmul(stream, problem.arguments(replayed.data(), workspace.data(), workspace_bytes));
      const device::HostGraph graph = stream.end_capture();
      EXPECT_EQ(graph.num_kernels(), is_quantized(dtype) ? 2u : 1u);

      // New values behind the same pointers, as a replayed step sees them.
      for (float& value : problem.input) value = -0.5f * value + 0.25f;
      stream.replay(graph);
      const std::vector<float> eager = problem.run(stream);
      ASSERT_EQ(std::memcmp(eager.data(), replayed.data(), eager.size() * sizeof(float)), 0);
      expect_matches_reference(problem, replayed);
    }
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
  for (int64_t row = 0; row < 8; ++row) {
    dequantize_row_q8_0(blocks + row * 2, problem.widened_weight.data() + row * 64, 64);
  }
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
}

using MatmulDeathTest = MatmulTest;

TEST_F(MatmulDeathTest, RejectsAnUndersizedWorkspace) {
  device::HostStream stream(single_thread_);
  const Problem problem(2, 8, 64, DType::kQ8_0, false, 3);
  std::vector<float> output(16);
  AlignedBuffer workspace(64);
  EXPECT_DEATH(matmul(stream, problem.arguments(output.data(), workspace.data(), 64)),
               "workspace of 64 bytes");
}

TEST_F(MatmulDeathTest, RejectsInputFeaturesThatAreNotWholeBlocks) {
  device::HostStream stream(single_thread_);
  Problem problem(2, 8, 64, DType::kF32, false, 3);
  problem.input_features = 48;
  std::vector<float> output(16);
  EXPECT_DEATH(matmul(stream, problem.arguments(output.data(), nullptr, 0)), "multiple of 32");
}

}  // namespace
}  // namespace folio::kernels::cpu
