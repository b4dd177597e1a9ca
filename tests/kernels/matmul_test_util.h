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
#include "folio/tensor/half.h"
#include "folio/tensor/quantize.h"

namespace folio::kernels::cpu::matmul_testing {

// The dtypes Folio quantizes itself (quantize_row), taken with any K multiple of 32.
inline constexpr DType kWeightDtypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0,
                                          DType::kQ4_0};
// The other block types of GGUF files: weights are random block bytes (random_weight_row).
inline constexpr DType kBlockDtypes[] = {DType::kQ4_1,   DType::kQ5_0,  DType::kQ5_1, DType::kQ2_K,
                                         DType::kQ3_K,   DType::kQ4_K,  DType::kQ5_K, DType::kQ6_K,
                                         DType::kIQ4_NL, DType::kIQ4_XS};
inline constexpr double kUnitRoundoff = 1.0 / (1 << 24);

inline bool is_quantized(DType dtype) {
  return dtype_info(dtype).quantized;
}

inline bool has_quantizer(DType dtype) {
  for (DType listed : kWeightDtypes) {
    if (listed == dtype) return true;
  }
  return false;
}

inline void store_half(std::byte* pointer, float value) {
  const uint16_t bits = f32_to_f16(value);
  std::memcpy(pointer, &bits, sizeof(bits));
}

// A row of `count` values of a block type as random bytes: every quant, sub-block scale and
// high bit random, and the f16 fields finite: d and dmin of random sign and magnitude 2^-12 to
// 2^-7, q4_1 / q5_1's m in [-0.1, 0.1]: the kernels must take any bytes a file may hold, not only
// what Folio's quantizers write.
inline void random_weight_row(DType dtype, std::byte* row, int64_t count, std::mt19937& generator) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> exponent(-12.0f, -7.0f);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const DTypeInfo info = dtype_info(dtype);
  const BlockHalfFields fields = block_half_fields(dtype);
  for (int64_t block = 0; block < count / info.block_elements; ++block) {
    std::byte* bytes = row + block * info.block_bytes;
    for (int64_t i = 0; i < info.block_bytes; ++i)
      bytes[i] = static_cast<std::byte>(byte(generator));
    const auto scale = [&] {
      return (unit(generator) < 0 ? -1.0f : 1.0f) * std::exp2(exponent(generator));
    };
    store_half(bytes + fields.scale, scale());
    if (fields.minimum >= 0) {
      const bool is_m = dtype == DType::kQ4_1 || dtype == DType::kQ5_1;
      store_half(bytes + fields.minimum, is_m ? 0.1f * unit(generator) : scale());
    }
  }
}

// Per element, |s q| + |o| for value = s q + o (dequantize_row of a copy with o's f16 zeroed,
// and of one with d zeroed); |value| for the dtypes without a minimum. The rounding of the
// kernel and of the dequantizer scale with it, not with |value| (which may cancel).
inline void weight_magnitudes(DType dtype, const std::byte* row, int64_t count, float* output) {
  std::vector<float> part(count);
  dequantize_row(dtype, row, output, count);
  const BlockHalfFields fields = block_half_fields(dtype);
  if (!is_quantized(dtype) || fields.minimum < 0) {
    for (int64_t k = 0; k < count; ++k) output[k] = std::fabs(output[k]);
    return;
  }
  const DTypeInfo info = dtype_info(dtype);
  std::vector<std::byte> copy(row, row + row_bytes(dtype, count));
  for (int64_t block = 0; block < count / info.block_elements; ++block) {
    store_half(copy.data() + block * info.block_bytes + fields.minimum, 0.0f);
  }
  dequantize_row(dtype, copy.data(), output, count);
  copy.assign(row, row + row_bytes(dtype, count));
  for (int64_t block = 0; block < count / info.block_elements; ++block) {
    store_half(copy.data() + block * info.block_bytes + fields.scale, 0.0f);
  }
  dequantize_row(dtype, copy.data(), part.data(), count);
  for (int64_t k = 0; k < count; ++k) output[k] = std::fabs(output[k]) + std::fabs(part[k]);
}

using testing::AlignedBuffer;

// A random problem: x, a weight stored in `dtype`, the weight as the kernel sees it (widened
// to f32 exactly from the stored form), and an optional bias.
struct Problem {
  int64_t rows = 0;
  int64_t output_features = 0;
  int64_t input_features = 0;
  DType dtype = DType::kF32;
  std::vector<float> input;             // f32 [rows, input_features]
  std::vector<std::byte> weight;        // dtype [output_features, input_features]
  std::vector<float> widened_weight;    // f32 [output_features, input_features]
  std::vector<float> weight_magnitude;  // f32 [output_features, input_features]: weight_magnitudes
  std::vector<float> bias;              // f32 [output_features] or empty

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
    weight_magnitude.resize(n * k);
    for (int64_t row = 0; row < n; ++row) {
      if (has_quantizer(dtype)) {
        quantize_row(dtype, values.data() + row * k, weight.data() + row * stride, k);
      } else {
        random_weight_row(dtype, weight.data() + row * stride, k, generator);
      }
    }
    widen();
    if (with_bias) {
      bias.resize(n);
      for (float& value : bias) value = normal(generator);
    }
  }

  // Recomputes widened_weight and weight_magnitude from weight (after a test edits it).
  void widen() {
    const int64_t stride = row_bytes(dtype, input_features);
    for (int64_t row = 0; row < output_features; ++row) {
      dequantize_row(dtype, weight.data() + row * stride,
                     widened_weight.data() + row * input_features, input_features);
      weight_magnitudes(dtype, weight.data() + row * stride, input_features,
                        weight_magnitude.data() + row * input_features);
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
// q = round(x * (1 / d))), written here independently of the kernel's code. For q4_K, q5_K and
// q6_K weights the amax is that of the block's 256-value super-block (one d per super-block,
// as ggml's q8_K): `scale_elements` is 256 then, else 32.
struct QuantizedRow {
  std::vector<double> scales;  // per 32-value block
  std::vector<int> values;
};

inline int64_t activation_scale_elements(DType weight_dtype) {
  return weight_dtype == DType::kQ4_K || weight_dtype == DType::kQ5_K ||
                 weight_dtype == DType::kQ6_K
             ? 256
             : 32;
}

inline QuantizedRow quantize_reference(const float* input, int64_t count,
                                       int64_t scale_elements = 32) {
  QuantizedRow row;
  for (int64_t block = 0; block < count / 32; ++block) {
    const int64_t first = block * 32 / scale_elements * scale_elements;
    float max_magnitude = 0.0f;
    for (int64_t i = 0; i < scale_elements; ++i)
      max_magnitude = std::max(max_magnitude, std::fabs(input[first + i]));
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
// - quantized weights: first against the sum with x quantized as above (so the integer part of
//   the kernel must be exact), within (K + 32) u sum_k |xq_k| m_k, m_k = |s q_k| + |o_k| the
//   weight magnitude (weight_magnitudes): the kernel's f32 sum over K / 4 lanes and a few
//   products per lane, plus the dequantizer's own rounding of s q + o (2 u m_k), all bounded by
//   it; then against the unquantized x within the quantization error of x (half a step per
//   value: sum_b d_b / 2 * sum_{k in b} |w_k|).
inline void expect_matches_reference(const Problem& problem, const std::vector<float>& output) {
  const int64_t k_count = problem.input_features;
  const double rounding = static_cast<double>(k_count + 2) * kUnitRoundoff;
  const double quantized_rounding = static_cast<double>(k_count + 32) * kUnitRoundoff;
  int failures = 0;
  for (int64_t row = 0; row < problem.rows && failures < 5; ++row) {
    const float* x = problem.input.data() + row * k_count;
    const QuantizedRow quantized =
        quantize_reference(x, k_count, activation_scale_elements(problem.dtype));
    for (int64_t column = 0; column < problem.output_features && failures < 5; ++column) {
      const float* w = problem.widened_weight.data() + column * k_count;
      const float* w_magnitude = problem.weight_magnitude.data() + column * k_count;
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
        quantized_magnitude += std::fabs(xq) * w_magnitude[k];
        quantization_error += quantized.scales[k / 32] / 2 * std::fabs(w[k]);
      }
      const double actual = output[row * problem.output_features + column];
      const std::string where = "row " + std::to_string(row) + " column " + std::to_string(column);
      if (!is_quantized(problem.dtype)) {
        if (!(std::fabs(actual - exact) <= rounding * magnitude + 1e-30)) ++failures;
        EXPECT_NEAR(actual, exact, rounding * magnitude + 1e-30) << where;
      } else {
        const double tight =
            (has_quantizer(problem.dtype) ? rounding : quantized_rounding) * quantized_magnitude +
            1e-30;
        if (!(std::fabs(actual - with_quantized_x) <= tight)) ++failures;
        EXPECT_NEAR(actual, with_quantized_x, tight) << where;
        EXPECT_NEAR(actual, exact, quantization_error + tight) << where;
      }
    }
  }
}

}  // namespace folio::kernels::cpu::matmul_testing
