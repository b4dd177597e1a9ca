#include "folio/tensor/quantize.h"

#include <algorithm>
#include <cmath>

#include "folio/base/check.h"
#include "folio/tensor/half.h"

namespace folio {
namespace {

// 1/scale, or 0 when scale is 0 or so small that its reciprocal overflows. Such a scale rounds
// to 0 in f16 anyway, so every value of the block decodes to 0 whatever is stored; ggml would
// convert inf or NaN to an integer here, which is undefined.
float inverse_of(float scale) {
  const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
  return std::isfinite(inverse) ? inverse : 0.0f;
}

void check_whole_blocks(int64_t count) {
  FOLIO_DCHECK(count % kQuantBlockElements == 0,
               "row of {} values is not a whole number of {}-value blocks", count,
               kQuantBlockElements);
}

}  // namespace

void quantize_row_q8_0(const float* input, BlockQ8_0* output, int64_t count) {
  check_whole_blocks(count);
  for (int64_t block = 0; block < count / kQuantBlockElements; ++block) {
    const float* values = input + block * kQuantBlockElements;
    float max_magnitude = 0.0f;
    for (int64_t i = 0; i < kQuantBlockElements; ++i) {
      max_magnitude = std::max(max_magnitude, std::fabs(values[i]));
    }
    const float scale = max_magnitude / 127.0f;
    const float inverse_scale = inverse_of(scale);
    output[block].scale = f32_to_f16(scale);
    for (int64_t i = 0; i < kQuantBlockElements; ++i) {
      // |values[i] * inverse_scale| <= 127 (up to rounding of the reciprocal, which roundf
      // absorbs), so the cast cannot overflow.
      output[block].values[i] = static_cast<int8_t>(std::roundf(values[i] * inverse_scale));
    }
  }
}

void dequantize_row_q8_0(const BlockQ8_0* input, float* output, int64_t count) {
  check_whole_blocks(count);
  for (int64_t block = 0; block < count / kQuantBlockElements; ++block) {
    const float scale = f16_to_f32(input[block].scale);
    for (int64_t i = 0; i < kQuantBlockElements; ++i) {
      output[block * kQuantBlockElements + i] = scale * static_cast<float>(input[block].values[i]);
    }
  }
}

void quantize_row_q4_0(const float* input, BlockQ4_0* output, int64_t count) {
  check_whole_blocks(count);
  constexpr int64_t kHalf = kQuantBlockElements / 2;
  for (int64_t block = 0; block < count / kQuantBlockElements; ++block) {
    const float* values = input + block * kQuantBlockElements;
    // The signed value of largest magnitude (the first one on ties), as ggml picks it: mapping
    // it to -8 uses the full 4-bit range on its side.
    float max_magnitude = 0.0f;
    float extreme = 0.0f;
    for (int64_t i = 0; i < kQuantBlockElements; ++i) {
      if (max_magnitude < std::fabs(values[i])) {
        max_magnitude = std::fabs(values[i]);
        extreme = values[i];
      }
    }
    const float scale = extreme / -8.0f;
    const float inverse_scale = inverse_of(scale);
    output[block].scale = f32_to_f16(scale);
    for (int64_t i = 0; i < kHalf; ++i) {
      // x * inverse_scale + 8.5 lies in [0.5, 16.5]: the truncating cast is well defined and
      // only the extreme's opposite end (16) needs the clamp.
      const int low =
          std::min(15, static_cast<int>(static_cast<int8_t>(values[i] * inverse_scale + 8.5f)));
      const int high = std::min(
          15, static_cast<int>(static_cast<int8_t>(values[kHalf + i] * inverse_scale + 8.5f)));
      output[block].nibbles[i] = static_cast<uint8_t>(low | (high << 4));
    }
  }
}

void dequantize_row_q4_0(const BlockQ4_0* input, float* output, int64_t count) {
  check_whole_blocks(count);
  constexpr int64_t kHalf = kQuantBlockElements / 2;
  for (int64_t block = 0; block < count / kQuantBlockElements; ++block) {
    const float scale = f16_to_f32(input[block].scale);
    float* values = output + block * kQuantBlockElements;
    for (int64_t i = 0; i < kHalf; ++i) {
      const uint8_t packed = input[block].nibbles[i];
      values[i] = scale * static_cast<float>((packed & 0x0f) - 8);
      values[kHalf + i] = scale * static_cast<float>((packed >> 4) - 8);
    }
  }
}

void convert_row_f32_to_f16(const float* input, uint16_t* output, int64_t count) {
  for (int64_t i = 0; i < count; ++i) output[i] = f32_to_f16(input[i]);
}

void convert_row_f16_to_f32(const uint16_t* input, float* output, int64_t count) {
  for (int64_t i = 0; i < count; ++i) output[i] = f16_to_f32(input[i]);
}

void convert_row_f32_to_bf16(const float* input, uint16_t* output, int64_t count) {
  for (int64_t i = 0; i < count; ++i) output[i] = f32_to_bf16(input[i]);
}

void convert_row_bf16_to_f32(const uint16_t* input, float* output, int64_t count) {
  for (int64_t i = 0; i < count; ++i) output[i] = bf16_to_f32(input[i]);
}

void quantize_row(DType dtype, const float* input, void* output, int64_t count) {
  switch (dtype) {
    case DType::kF32:
      std::copy(input, input + count, static_cast<float*>(output));
      return;
    case DType::kF16:
      convert_row_f32_to_f16(input, static_cast<uint16_t*>(output), count);
      return;
    case DType::kBF16:
      convert_row_f32_to_bf16(input, static_cast<uint16_t*>(output), count);
      return;
    case DType::kQ8_0:
      quantize_row_q8_0(input, static_cast<BlockQ8_0*>(output), count);
      return;
    case DType::kQ4_0:
      quantize_row_q4_0(input, static_cast<BlockQ4_0*>(output), count);
      return;
    case DType::kQ4_1:
      quantize_row_q4_1(input, static_cast<BlockQ4_1*>(output), count);
      return;
    case DType::kQ5_0:
      quantize_row_q5_0(input, static_cast<BlockQ5_0*>(output), count);
      return;
    case DType::kQ5_1:
      quantize_row_q5_1(input, static_cast<BlockQ5_1*>(output), count);
      return;
    case DType::kQ2_K:
      quantize_row_q2_k(input, static_cast<BlockQ2_K*>(output), count);
      return;
    case DType::kQ3_K:
      quantize_row_q3_k(input, static_cast<BlockQ3_K*>(output), count);
      return;
    case DType::kQ4_K:
      quantize_row_q4_k(input, static_cast<BlockQ4_K*>(output), count);
      return;
    case DType::kQ5_K:
      quantize_row_q5_k(input, static_cast<BlockQ5_K*>(output), count);
      return;
    case DType::kQ6_K:
      quantize_row_q6_k(input, static_cast<BlockQ6_K*>(output), count);
      return;
    case DType::kIQ4_NL:
      quantize_row_iq4_nl(input, static_cast<BlockIQ4_NL*>(output), count);
      return;
    case DType::kIQ4_XS:
      quantize_row_iq4_xs(input, static_cast<BlockIQ4_XS*>(output), count);
      return;
    case DType::kI32:
    case DType::kI8:
    case DType::kQ8_0Panels:
      break;
  }
  FOLIO_UNREACHABLE("quantize_row to {}, which is not a float or block-quantized dtype",
                    dtype_name(dtype));
}

void dequantize_row(DType dtype, const void* input, float* output, int64_t count) {
  switch (dtype) {
    case DType::kF32: {
      const float* values = static_cast<const float*>(input);
      std::copy(values, values + count, output);
      return;
    }
    case DType::kF16:
      convert_row_f16_to_f32(static_cast<const uint16_t*>(input), output, count);
      return;
    case DType::kBF16:
      convert_row_bf16_to_f32(static_cast<const uint16_t*>(input), output, count);
      return;
    case DType::kQ8_0:
      dequantize_row_q8_0(static_cast<const BlockQ8_0*>(input), output, count);
      return;
    case DType::kQ4_0:
      dequantize_row_q4_0(static_cast<const BlockQ4_0*>(input), output, count);
      return;
    case DType::kQ4_1:
      dequantize_row_q4_1(static_cast<const BlockQ4_1*>(input), output, count);
      return;
    case DType::kQ5_0:
      dequantize_row_q5_0(static_cast<const BlockQ5_0*>(input), output, count);
      return;
    case DType::kQ5_1:
      dequantize_row_q5_1(static_cast<const BlockQ5_1*>(input), output, count);
      return;
    case DType::kQ2_K:
      dequantize_row_q2_k(static_cast<const BlockQ2_K*>(input), output, count);
      return;
    case DType::kQ3_K:
      dequantize_row_q3_k(static_cast<const BlockQ3_K*>(input), output, count);
      return;
    case DType::kQ4_K:
      dequantize_row_q4_k(static_cast<const BlockQ4_K*>(input), output, count);
      return;
    case DType::kQ5_K:
      dequantize_row_q5_k(static_cast<const BlockQ5_K*>(input), output, count);
      return;
    case DType::kQ6_K:
      dequantize_row_q6_k(static_cast<const BlockQ6_K*>(input), output, count);
      return;
    case DType::kIQ4_NL:
      dequantize_row_iq4_nl(static_cast<const BlockIQ4_NL*>(input), output, count);
      return;
    case DType::kIQ4_XS:
      dequantize_row_iq4_xs(static_cast<const BlockIQ4_XS*>(input), output, count);
      return;
    case DType::kI32:
    case DType::kI8:
    case DType::kQ8_0Panels:
      break;
  }
  FOLIO_UNREACHABLE("dequantize_row from {}, which is not a float or block-quantized dtype",
                    dtype_name(dtype));
}

}  // namespace folio
