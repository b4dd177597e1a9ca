// Portable matmul row kernels (any CPU) and the activation quantizer every level shares. The
// block types other than q8_0 / q4_0 are decoded a block (or super-block) at a time into
// integers and per-16-value scales and offsets (decode_unit), then multiplied exactly in
// integers per 16 values.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "folio/base/check.h"
#include "folio/kernels/cpu/matmul.h"
#include "folio/kernels/cpu/matmul_kernels.h"
#include "folio/tensor/half.h"
#include "folio/tensor/quantize.h"

namespace folio::kernels::cpu::internal {
namespace {

constexpr int64_t kBlock = kQuantBlockElements;
// The granule of sub-block scales: every dtype's scales are constant over 16 values.
constexpr int64_t kScaleGranule = 16;

// One block (or super-block) of weights decoded for the integer dot product: value k is
// scales[k / 16] * values[k] + offsets[k / 16], values the small integers as stored with any
// fixed offset removed, scales and offsets in f32 (d * sub-block scale rounded to f32 first, as
// ggml's dequantizers do).
struct DecodedUnit {
  int32_t values[kSuperBlockElements] = {};
  float scales[kSuperBlockElements / kScaleGranule] = {};
  float offsets[kSuperBlockElements / kScaleGranule] = {};
};

uint32_t load_u32(const uint8_t* bytes) {
  uint32_t value;
  std::memcpy(&value, bytes, sizeof(value));
  return value;
}

// The 32 values of a 32-value block with 4-bit low parts: element i < 16 in the low nibble of
// byte i, element i + 16 in its high nibble; bit i of `fifth_bits` is element i's bit 4.
void decode_nibbles(const uint8_t* nibbles, uint32_t fifth_bits, int32_t offset, int32_t* values) {
  for (int i = 0; i < 16; ++i) {
    values[i] = ((nibbles[i] & 0x0f) | (((fifth_bits >> i) & 1) << 4)) - offset;
    values[i + 16] = ((nibbles[i] >> 4) | (((fifth_bits >> (i + 16)) & 1) << 4)) - offset;
  }
}

void set_block_scale(DecodedUnit& unit, int first_granule, int granules, float scale,
                     float offset) {
  for (int j = first_granule; j < first_granule + granules; ++j) {
    unit.scales[j] = scale;
    unit.offsets[j] = offset;
  }
}

void decode_iq4_xs(const std::byte* block, DecodedUnit& unit) {
  const auto& quantized = *reinterpret_cast<const BlockIQ4_XS*>(block);
  const float d = f16_to_f32(quantized.scale);
  for (int sub_block = 0; sub_block < 8; ++sub_block) {
    int32_t* values = unit.values + 32 * sub_block;
    decode_nibbles(quantized.nibbles + 16 * sub_block, 0, 0, values);
    for (int i = 0; i < 32; ++i) values[i] = kIq4NonLinearValues[values[i]];
    const int scale = ((quantized.scales_low[sub_block / 2] >> (4 * (sub_block % 2))) & 0x0f) |
                      (((quantized.scales_high >> (2 * sub_block)) & 3) << 4);
    set_block_scale(unit, 2 * sub_block, 2, d * static_cast<float>(scale - 32), 0.0f);
  }
}

void decode_q2_k(const std::byte* block, DecodedUnit& unit) {
  const auto& quantized = *reinterpret_cast<const BlockQ2_K*>(block);
  const float d = f16_to_f32(quantized.scale);
  const float minimum = f16_to_f32(quantized.minimum_scale);
  for (int sub_block = 0; sub_block < 16; ++sub_block) {
    // Sub-block j: half j / 8, shift 2 * ((j % 8) / 2), bytes 16 * (j % 2) of the half.
    const uint8_t* quants = quantized.quants + 32 * (sub_block / 8) + 16 * (sub_block % 2);
    const int shift = 2 * ((sub_block % 8) / 2);
    for (int l = 0; l < 16; ++l) unit.values[16 * sub_block + l] = (quants[l] >> shift) & 3;
    const uint8_t packed = quantized.scales[sub_block];
    unit.scales[sub_block] = d * static_cast<float>(packed & 0x0f);
    unit.offsets[sub_block] = -(minimum * static_cast<float>(packed >> 4));
  }
}

void decode_q3_k(const std::byte* block, DecodedUnit& unit) {
  const auto& quantized = *reinterpret_cast<const BlockQ3_K*>(block);
  const float d = f16_to_f32(quantized.scale);
  int8_t scales[16];
  q3_k_scales(quantized.scales, scales);
  for (int sub_block = 0; sub_block < 16; ++sub_block) {
    const int index = 16 * (sub_block % 2);
    const uint8_t* quants = quantized.quants + 32 * (sub_block / 8) + index;
    const int shift = 2 * ((sub_block % 8) / 2);
    // The high-mask bit of pair (half, shift) is bit 4 * half + shift / 2.
    const int mask_bit = 4 * (sub_block / 8) + shift / 2;
    for (int l = 0; l < 16; ++l) {
      const int high = (quantized.high_mask[index + l] >> mask_bit) & 1;
      unit.values[16 * sub_block + l] = ((quants[l] >> shift) & 3) + 4 * high - 4;
    }
    unit.scales[sub_block] = d * static_cast<float>(scales[sub_block] - 32);
    unit.offsets[sub_block] = 0.0f;
  }
}

void decode_q4_k_or_q5_k(DType dtype, const std::byte* block, DecodedUnit& unit) {
  const bool five_bits = dtype == DType::kQ5_K;
  const auto& q4 = *reinterpret_cast<const BlockQ4_K*>(block);
  const auto& q5 = *reinterpret_cast<const BlockQ5_K*>(block);
  const uint8_t* scale_bytes = five_bits ? q5.scales : q4.scales;
  const uint8_t* quants = five_bits ? q5.quants : q4.quants;
  const float d = f16_to_f32(five_bits ? q5.scale : q4.scale);
  const float minimum = f16_to_f32(five_bits ? q5.minimum_scale : q4.minimum_scale);
  for (int sub_block = 0; sub_block < 8; ++sub_block) {
    const uint8_t* pair = quants + 32 * (sub_block / 2);
    const int shift = 4 * (sub_block % 2);
    for (int l = 0; l < 32; ++l) {
      int value = (pair[l] >> shift) & 0x0f;
      if (five_bits) value |= ((q5.high_bits[l] >> sub_block) & 1) << 4;
      unit.values[32 * sub_block + l] = value;
    }
    const ScaleAndMinimum packed = k_quant_scale_and_minimum(sub_block, scale_bytes);
    set_block_scale(unit, 2 * sub_block, 2, d * static_cast<float>(packed.scale),
                    -(minimum * static_cast<float>(packed.minimum)));
  }
}

void decode_q6_k(const std::byte* block, DecodedUnit& unit) {
  const auto& quantized = *reinterpret_cast<const BlockQ6_K*>(block);
  const float d = f16_to_f32(quantized.scale);
  for (int half = 0; half < 2; ++half) {
    const uint8_t* low = quantized.low + 64 * half;
    const uint8_t* high = quantized.high + 32 * half;
    int32_t* values = unit.values + 128 * half;
    for (int l = 0; l < 32; ++l) {
      values[l] = ((low[l] & 0x0f) | (((high[l] >> 0) & 3) << 4)) - 32;
      values[l + 32] = ((low[l + 32] & 0x0f) | (((high[l] >> 2) & 3) << 4)) - 32;
      values[l + 64] = ((low[l] >> 4) | (((high[l] >> 4) & 3) << 4)) - 32;
      values[l + 96] = ((low[l + 32] >> 4) | (((high[l] >> 6) & 3) << 4)) - 32;
    }
  }
  for (int sub_block = 0; sub_block < 16; ++sub_block) {
    unit.scales[sub_block] = d * static_cast<float>(quantized.scales[sub_block]);
    unit.offsets[sub_block] = 0.0f;
  }
}

// Decodes the unit at `block` (block_elements values of dtype, a multiple of 16).
void decode_unit(DType dtype, const std::byte* block, DecodedUnit& unit) {
  switch (dtype) {
    case DType::kQ4_1: {
      const auto& quantized = *reinterpret_cast<const BlockQ4_1*>(block);
      decode_nibbles(quantized.nibbles, 0, 0, unit.values);
      set_block_scale(unit, 0, 2, f16_to_f32(quantized.scale), f16_to_f32(quantized.minimum));
      return;
    }
    case DType::kQ5_0: {
      const auto& quantized = *reinterpret_cast<const BlockQ5_0*>(block);
      decode_nibbles(quantized.nibbles, load_u32(quantized.high_bits), 16, unit.values);
      set_block_scale(unit, 0, 2, f16_to_f32(quantized.scale), 0.0f);
      return;
    }
    case DType::kQ5_1: {
      const auto& quantized = *reinterpret_cast<const BlockQ5_1*>(block);
      decode_nibbles(quantized.nibbles, load_u32(quantized.high_bits), 0, unit.values);
      set_block_scale(unit, 0, 2, f16_to_f32(quantized.scale), f16_to_f32(quantized.minimum));
      return;
    }
    case DType::kIQ4_NL: {
      const auto& quantized = *reinterpret_cast<const BlockIQ4_NL*>(block);
      decode_nibbles(quantized.nibbles, 0, 0, unit.values);
      for (int i = 0; i < 32; ++i) unit.values[i] = kIq4NonLinearValues[unit.values[i]];
      set_block_scale(unit, 0, 2, f16_to_f32(quantized.scale), 0.0f);
      return;
    }
    case DType::kIQ4_XS:
      return decode_iq4_xs(block, unit);
    case DType::kQ2_K:
      return decode_q2_k(block, unit);
    case DType::kQ3_K:
      return decode_q3_k(block, unit);
    case DType::kQ4_K:
    case DType::kQ5_K:
      return decode_q4_k_or_q5_k(dtype, block, unit);
    case DType::kQ6_K:
      return decode_q6_k(block, unit);
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kI32:
    case DType::kI8:
    case DType::kQ8_0Panels:
      break;
  }
  FOLIO_UNREACHABLE("decode_unit on {}", dtype_name(dtype));
}

// The dtypes decode_unit takes: per 16 values an exact integer dot product and sum of x, then
// scale * dot + offset * sum in f32, and per 32-value block of x, times its scale.
void decoded_rows_portable(const MatmulArguments& arguments,
                           const QuantizedActivations& activations, int64_t row_begin,
                           int64_t row_end) {
  const DType dtype = arguments.weight_dtype;
  const int64_t input_features = arguments.input_features;
  const int64_t unit_elements = dtype_info(dtype).block_elements;
  const int64_t unit_bytes = dtype_info(dtype).block_bytes;
  const int64_t num_units = input_features / unit_elements;
  const int64_t weight_row_bytes = row_bytes(dtype, input_features);
  const auto* weight = static_cast<const std::byte*>(arguments.weight);
  DecodedUnit unit;
  for (int64_t column = row_begin; column < row_end; ++column) {
    const std::byte* weight_row = weight + column * weight_row_bytes;
    const float bias = arguments.bias != nullptr ? arguments.bias[column] : 0.0f;
    for (int64_t row = 0; row < arguments.num_rows; ++row) {
      const int8_t* values = activations.values + row * input_features;
      const float* lane_scales = activations.lane_scales + row * (input_features / 4);
      float sum = 0.0f;
      for (int64_t unit_index = 0; unit_index < num_units; ++unit_index) {
        decode_unit(dtype, weight_row + unit_index * unit_bytes, unit);
        for (int64_t block = 0; block < unit_elements / kBlock; ++block) {
          const int64_t element = unit_index * unit_elements + block * kBlock;
          float block_sum = 0.0f;
          for (int64_t granule = 0; granule < kBlock / kScaleGranule; ++granule) {
            const int64_t first = block * kBlock + granule * kScaleGranule;
            int32_t dot = 0;
            int32_t x_sum = 0;
            for (int64_t i = 0; i < kScaleGranule; ++i) {
              const int32_t x = values[element + granule * kScaleGranule + i];
              dot += unit.values[first + i] * x;
              x_sum += x;
            }
            block_sum += unit.scales[first / kScaleGranule] * static_cast<float>(dot) +
                         unit.offsets[first / kScaleGranule] * static_cast<float>(x_sum);
          }
          sum += lane_scales[element / 4] * block_sum;
        }
      }
      arguments.output[row * arguments.output_features + column] = sum + bias;
    }
  }
}

}  // namespace

void quantize_activation_block(const float* input, int8_t* values, int32_t* corrections,
                               float* lane_scales, LaneTerm term) {
  float max_magnitude = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < kBlock; ++i) {
    finite = finite && std::isfinite(input[i]);
    max_magnitude = std::max(max_magnitude, std::fabs(input[i]));
  }
  if (term.super_block_scale) max_magnitude = term.max_magnitude;
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
  if (term.block_sums) {
    int32_t block_sum = 0;
    for (int64_t i = 0; i < kBlock; ++i) block_sum += values[i];
    corrections[0] = -term.offset * block_sum;
  }
  for (int64_t lane = 0; lane < kLanesPerActivationBlock; ++lane) {
    const int8_t* group = values + 4 * lane;
    const int32_t lane_sum = group[0] + group[1] + group[2] + group[3];
    if (term.granule_sums) {
      if (lane % 4 == 0) {
        const int8_t* granule = values + 4 * lane;
        int32_t granule_sum = 0;
        for (int i = 0; i < 16; ++i) granule_sum += granule[i];
        const float scaled_sum = scale * static_cast<float>(granule_sum);
        std::memcpy(&corrections[lane / 4], &scaled_sum, sizeof(scaled_sum));
      }
    } else if (term.scaled_sums) {
      const float scaled_sum = scale * static_cast<float>(lane_sum);
      std::memcpy(&corrections[lane], &scaled_sum, sizeof(scaled_sum));
    } else if (!term.block_sums) {
      corrections[lane] = -term.offset * lane_sum;
    }
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
  if (arguments.weight_dtype != DType::kQ8_0 && arguments.weight_dtype != DType::kQ4_0) {
    return decoded_rows_portable(arguments, activations, row_begin, row_end);
  }
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
        sum +=
            weight_scale * lane_scales[block * kLanesPerActivationBlock] * static_cast<float>(dot);
      }
      arguments.output[row * arguments.output_features + column] = sum + bias;
    }
  }
}

}  // namespace folio::kernels::cpu::internal
