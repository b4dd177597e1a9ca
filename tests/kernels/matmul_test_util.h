// Shared by the matmul tests: random problems in every weight dtype, a 64-byte aligned
// workspace, and the double-precision reference every kernel is checked against.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "aligned_buffer.h"
#include "folio/device/host_stream.h"
#include "folio/kernels/cpu/matmul.h"
#include "folio/tensor/quantize.h"

namespace folio::kernels::cpu::matmul_testing {

inline constexpr DType kWeightDtypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0,
                                          DType::kQ4_0};
inline constexpr double kUnitRoundoff = 1.0 / (1 << 24);

inline bool is_quantized(DType dtype) {
  return dtype == DType::kQ8_0 || dtype == DType::kQ4_0;
}

using testing::AlignedBuffer;

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

inline QuantizedRow quantize_reference(const float* input, int64_t count) {
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
inline void expect_matches_reference(const Problem& problem, const std::vector<float>& output) {
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

}  // namespace folio::kernels::cpu::matmul_testing
