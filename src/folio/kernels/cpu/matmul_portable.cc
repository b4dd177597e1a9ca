// Portable matmul row kernels (any CPU) and the activation quantizer every level shares.
#include <algorithm>
#include <cmath>
#include <limits>

#include "folio/base/check.h"
#include "folio/kernels/cpu/matmul.h"
#include "folio/kernels/cpu/matmul_kernels.h"
#include "folio/tensor/half.h"
#include "folio/tensor/quantize.h"

namespace folio::kernels::cpu::internal {
namespace {

constexpr int64_t kBlock = kQuantBlockElements;
constexpr int64_t kLanesPerBlock = kBlock / 4;

}  // namespace

void quantize_activation_block(const float* input, int8_t* values, int32_t* corrections,
                               float* lane_scales, int32_t offset) {
  float max_magnitude = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < kBlock; ++i) {
    finite = finite && std::isfinite(input[i]);
    max_magnitude = std::max(max_magnitude, std::fabs(input[i]));
  }
  float scale = max_magnitude / 127.0f;
  float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
  if (!std::isfinite(inverse)) inverse = 0.0f;  // scale so small its reciprocal overflows
  if (!finite) {
    scale = std::numeric_limits<float>::quiet_NaN();
    inverse = 0.0f;
  }
  for (int64_t i = 0; i < kBlock; ++i) {
    // |input * inverse| <= 127 up to the rounding of the reciprocal, which roundf absorbs.
    values[i] = finite ? static_cast<int8_t>(std::roundf(input[i] * inverse)) : 0;
  }
  for (int64_t lane = 0; lane < kLanesPerBlock; ++lane) {
    const int8_t* group = values + 4 * lane;
    corrections[lane] = -offset * (group[0] + group[1] + group[2] + group[3]);
    lane_scales[lane] = scale;
  }
}

void quantize_activation_rows_portable(const MatmulArguments& arguments, std::byte* workspace,
                                       int64_t row_begin, int64_t row_end) {
  quantize_activation_rows(arguments, workspace, row_begin, row_end, quantize_activation_block);
}

// Widens each weight row once into the scratch, then takes plain sequential f32 dot products.
void float_rows_portable(const MatmulArguments& arguments, int64_t row_begin, int64_t row_end,
                         float* group_scratch) {
  const int64_t input_features = arguments.input_features;
  const int64_t weight_row_bytes = row_bytes(arguments.weight_dtype, input_features);
  const auto* weight = static_cast<const std::byte*>(arguments.weight);
  for (int64_t column = row_begin; column < row_end; ++column) {
    const std::byte* weight_row = weight + column * weight_row_bytes;
    const float* widened = reinterpret_cast<const float*>(weight_row);
    if (arguments.weight_dtype != DType::kF32) {
      dequantize_row(arguments.weight_dtype, weight_row, group_scratch, input_features);
      widened = group_scratch;
    }
    const float bias = arguments.bias != nullptr ? arguments.bias[column] : 0.0f;
    for (int64_t row = 0; row < arguments.num_rows; ++row) {
      const float* input = arguments.input + row * input_features;
      float sum = 0.0f;
      for (int64_t k = 0; k < input_features; ++k) sum += widened[k] * input[k];
      arguments.output[row * arguments.output_features + column] = sum + bias;
    }
  }
}

// Exact integer dot product per block, scaled by both scales, summed block by block in f32.
void quantized_rows_portable(const MatmulArguments& arguments,
                             const QuantizedActivations& activations, int64_t row_begin,
                             int64_t row_end) {
  const int64_t input_features = arguments.input_features;
  const int64_t num_blocks = input_features / kBlock;
  const bool is_q8 = arguments.weight_dtype == DType::kQ8_0;
  const int64_t weight_row_bytes = row_bytes(arguments.weight_dtype, input_features);
  const auto* weight = static_cast<const std::byte*>(arguments.weight);
  int32_t widened[kBlock];
  for (int64_t column = row_begin; column < row_end; ++column) {
    const std::byte* weight_row = weight + column * weight_row_bytes;
    const float bias = arguments.bias != nullptr ? arguments.bias[column] : 0.0f;
    for (int64_t row = 0; row < arguments.num_rows; ++row) {
      const int8_t* values = activations.values + row * input_features;
      const float* lane_scales = activations.lane_scales + row * (input_features / 4);
      float sum = 0.0f;
      for (int64_t block = 0; block < num_blocks; ++block) {
        float weight_scale;
        if (is_q8) {
          const auto* quantized = reinterpret_cast<const BlockQ8_0*>(weight_row) + block;
          weight_scale = f16_to_f32(quantized->scale);
          for (int64_t i = 0; i < kBlock; ++i) widened[i] = quantized->values[i];
        } else {
          const auto* quantized = reinterpret_cast<const BlockQ4_0*>(weight_row) + block;
          weight_scale = f16_to_f32(quantized->scale);
          for (int64_t i = 0; i < kBlock / 2; ++i) {
            widened[i] = (quantized->nibbles[i] & 0x0f) - 8;
            widened[kBlock / 2 + i] = (quantized->nibbles[i] >> 4) - 8;
          }
        }
        int32_t dot = 0;
        for (int64_t i = 0; i < kBlock; ++i) dot += widened[i] * values[block * kBlock + i];
        sum += weight_scale * lane_scales[block * kLanesPerBlock] * static_cast<float>(dot);
      }
      arguments.output[row * arguments.output_features + column] = sum + bias;
    }
  }
}

}  // namespace folio::kernels::cpu::internal
