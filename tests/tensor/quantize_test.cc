#include "folio/tensor/quantize.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "folio/tensor/half.h"

namespace folio {
namespace {

constexpr uint16_t kF16Half = 0x3800;  // 0.5
constexpr uint16_t kF16One = 0x3c00;   // 1.0

std::vector<float> random_values(int64_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(count);
  for (float& value : values) value = normal(generator);
  return values;
}

TEST(QuantizeTest, DequantizesHandBuiltQ8_0Blocks) {
  BlockQ8_0 blocks[2];
  blocks[0].scale = kF16Half;
  blocks[1].scale = 0xc000;  // -2.0
  for (int i = 0; i < 32; ++i) {
    blocks[0].values[i] = static_cast<int8_t>(i * 8 - 127);  // -127 ... 121
    blocks[1].values[i] = static_cast<int8_t>(i % 2 == 0 ? i : -i);
  }
  float output[64];
  dequantize_row_q8_0(blocks, output, 64);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(output[i], 0.5f * static_cast<float>(i * 8 - 127)) << i;
    EXPECT_EQ(output[32 + i], -2.0f * static_cast<float>(i % 2 == 0 ? i : -i)) << i;
  }
}

TEST(QuantizeTest, DequantizesHandBuiltQ4_0BlocksLowNibblesFirst) {
  BlockQ4_0 block;
  block.scale = kF16One;
  for (int i = 0; i < 16; ++i) block.nibbles[i] = static_cast<uint8_t>(i | ((15 - i) << 4));
  float output[32];
  dequantize_row_q4_0(&block, output, 32);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(output[i], static_cast<float>(i - 8)) << i;       // low nibble of byte i
    EXPECT_EQ(output[16 + i], static_cast<float>(7 - i)) << i;  // high nibble of byte i
  }
}

TEST(QuantizeTest, Q8_0ScaleIsMaxMagnitudeOver127AndValuesRoundHalfAwayFromZero) {
  // amax = 127 * 0.25, so d = 0.25 exactly and x / d = 4x: 0.125 -> 0.5 rounds to 1, -0.125 to -1.
  float input[32] = {};
  input[0] = -31.75f;
  input[1] = 0.125f;
  input[2] = -0.125f;
  input[3] = 1.0f;
  input[4] = 0.3f;  // 1.2 -> 1
  BlockQ8_0 block;
  quantize_row_q8_0(input, &block, 32);
  EXPECT_EQ(block.scale, f32_to_f16(0.25f));
  EXPECT_EQ(block.values[0], -127);
  EXPECT_EQ(block.values[1], 1);
  EXPECT_EQ(block.values[2], -1);
  EXPECT_EQ(block.values[3], 4);
  EXPECT_EQ(block.values[4], 1);
  for (int i = 5; i < 32; ++i) EXPECT_EQ(block.values[i], 0) << i;
}

TEST(QuantizeTest, Q4_0MapsTheSignedExtremeToMinus8AndClampsTheOtherEnd) {
  // The extreme is -4 (first of largest magnitude, sign kept): d = -4 / -8 = 0.5, 1/d = 2.
  float input[32] = {};
  input[3] = -4.0f;   // -8 + 8.5 = 0.5 -> nibble 0
  input[5] = 4.0f;    // 8 + 8.5 = 16.5 -> 16, clamped to 15
  input[7] = 1.2f;    // 2.4 + 8.5 = 10.9 -> 10 (truncation, not rounding)
  input[20] = -1.0f;  // -2 + 8.5 = 6.5 -> 6
  BlockQ4_0 block;
  quantize_row_q4_0(input, &block, 32);
  EXPECT_EQ(block.scale, f32_to_f16(0.5f));
  EXPECT_EQ(block.nibbles[3] & 0x0f, 0);
  EXPECT_EQ(block.nibbles[5] & 0x0f, 15);
  EXPECT_EQ(block.nibbles[7] & 0x0f, 10);
  EXPECT_EQ(block.nibbles[4] >> 4, 6);        // element 20 is the high nibble of byte 4
  EXPECT_EQ(block.nibbles[0], 8 | (8 << 4));  // zeros encode as 8

  // A positive extreme gives a negative scale: the extreme still lands on nibble 0.
  float positive[32] = {};
  positive[0] = 8.0f;
  quantize_row_q4_0(positive, &block, 32);
  EXPECT_EQ(block.scale, f32_to_f16(-1.0f));
  EXPECT_EQ(block.nibbles[0] & 0x0f, 0);
}

TEST(QuantizeTest, AllZeroBlocksHaveZeroScale) {
  const float input[32] = {};
  BlockQ8_0 q8;
  BlockQ4_0 q4;
  quantize_row_q8_0(input, &q8, 32);
  quantize_row_q4_0(input, &q4, 32);
  EXPECT_EQ(q8.scale, 0);
  EXPECT_EQ(q4.scale, 0x8000);  // 0 / -8 is -0, as in ggml
  float output[32];
  dequantize_row_q8_0(&q8, output, 32);
  for (float value : output) EXPECT_EQ(value, 0.0f);
  dequantize_row_q4_0(&q4, output, 32);
  for (float value : output) EXPECT_EQ(value, 0.0f);
}

TEST(QuantizeTest, TinyBlocksWhoseReciprocalOverflowsDecodeToZero) {
  float input[32] = {};
  input[0] = 1e-39f;  // d = amax / 127 is subnormal; 1/d overflows
  BlockQ8_0 q8;
  BlockQ4_0 q4;
  quantize_row_q8_0(input, &q8, 32);
  quantize_row_q4_0(input, &q4, 32);
  float output[32];
  dequantize_row_q8_0(&q8, output, 32);
  for (float value : output) EXPECT_EQ(value, 0.0f);
  dequantize_row_q4_0(&q4, output, 32);
  for (float value : output) EXPECT_EQ(value, 0.0f);
}

// Round trip error: q8_0 is off by at most half a step d plus the f16 rounding of d (|q| <= 127
// steps of relative error 2^-11); q4_0 by half a step except where the value opposite the
// extreme is clamped from 16 to 15 steps, a full step.
TEST(QuantizeTest, RoundTripErrorStaysWithinHalfAStep) {
  const int64_t count = 32 * 64;
  std::vector<float> input = random_values(count, 7, 3.0f);
  input[100] = 0.0f;
  std::vector<BlockQ8_0> q8(count / 32);
  std::vector<BlockQ4_0> q4(count / 32);
  std::vector<float> output(count);

  quantize_row_q8_0(input.data(), q8.data(), count);
  dequantize_row_q8_0(q8.data(), output.data(), count);
  for (int64_t i = 0; i < count; ++i) {
    const float step = f16_to_f32(q8[i / 32].scale);
    EXPECT_LE(std::fabs(output[i] - input[i]), step * (0.5f + 128.0f / 2048.0f)) << i;
  }

  quantize_row_q4_0(input.data(), q4.data(), count);
  dequantize_row_q4_0(q4.data(), output.data(), count);
  int clamped = 0;
  for (int64_t i = 0; i < count; ++i) {
    const float step = std::fabs(f16_to_f32(q4[i / 32].scale));
    const float error = std::fabs(output[i] - input[i]);
    if (error > step * (0.5f + 8.0f / 2048.0f)) {
      ++clamped;
      EXPECT_LE(error, step * (1.0f + 8.0f / 2048.0f)) << i;
      // Only values near the far end (more than 7.5 steps opposite the extreme) are clamped.
      EXPECT_GT(std::fabs(input[i]), 7.4f * step) << i;
    }
  }
  EXPECT_LT(clamped, count / 32);  // at most a few per block
}

TEST(QuantizeTest, F16AndBf16RowsMatchTheScalarConversions) {
  std::vector<float> input = random_values(1000, 11, 100.0f);
  input[0] = 65504.0f;
  input[1] = 1e-6f;  // an f16 subnormal
  std::vector<uint16_t> half(input.size());
  std::vector<float> output(input.size());
  convert_row_f32_to_f16(input.data(), half.data(), static_cast<int64_t>(input.size()));
  convert_row_f16_to_f32(half.data(), output.data(), static_cast<int64_t>(input.size()));
  for (size_t i = 0; i < input.size(); ++i) {
    ASSERT_EQ(half[i], f32_to_f16(input[i])) << i;
    ASSERT_EQ(output[i], f16_to_f32(half[i])) << i;
    if (i >= 2) {
      EXPECT_LE(std::fabs(output[i] - input[i]), std::fabs(input[i]) / 2048.0f) << i;
    }
  }
  convert_row_f32_to_bf16(input.data(), half.data(), static_cast<int64_t>(input.size()));
  convert_row_bf16_to_f32(half.data(), output.data(), static_cast<int64_t>(input.size()));
  for (size_t i = 0; i < input.size(); ++i) {
    ASSERT_EQ(half[i], f32_to_bf16(input[i])) << i;
    EXPECT_LE(std::fabs(output[i] - input[i]), std::fabs(input[i]) / 256.0f) << i;
  }
}

// Every weight dtype: the generic row functions give exactly the bytes and values of the
// dtype's own pair.
TEST(QuantizeTest, GenericRowFunctionsDispatchOnDtype) {
  const int64_t count = 512;  // whole 256-value super-blocks
  const std::vector<float> input = random_values(count, 3);
  for (DType dtype : kAllDTypes) {
    if (!is_weight_dtype(dtype)) continue;
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    std::vector<std::byte> generic(row_bytes(dtype, count));
    std::vector<std::byte> specific(row_bytes(dtype, count));
    std::vector<float> generic_output(count);
    std::vector<float> specific_output(count);
    quantize_row(dtype, input.data(), generic.data(), count);
    dequantize_row(dtype, generic.data(), generic_output.data(), count);
    auto* halves = reinterpret_cast<uint16_t*>(specific.data());
    // Quantizes with the dtype's own function, then dequantizes with its own.
    auto round_trip = [&](auto quantize, auto dequantize, auto* blocks) {
      quantize(input.data(), blocks, count);
      dequantize(blocks, specific_output.data(), count);
    };
    switch (dtype) {
      case DType::kF32:
        std::memcpy(specific.data(), input.data(), count * sizeof(float));
        std::memcpy(specific_output.data(), input.data(), count * sizeof(float));
        break;
      case DType::kF16:
        convert_row_f32_to_f16(input.data(), halves, count);
        convert_row_f16_to_f32(halves, specific_output.data(), count);
        break;
      case DType::kBF16:
        convert_row_f32_to_bf16(input.data(), halves, count);
        convert_row_bf16_to_f32(halves, specific_output.data(), count);
        break;
      case DType::kQ8_0:
        round_trip(quantize_row_q8_0, dequantize_row_q8_0,
                   reinterpret_cast<BlockQ8_0*>(specific.data()));
        break;
      case DType::kQ4_0:
        round_trip(quantize_row_q4_0, dequantize_row_q4_0,
                   reinterpret_cast<BlockQ4_0*>(specific.data()));
        break;
      case DType::kQ4_1:
        round_trip(quantize_row_q4_1, dequantize_row_q4_1,
                   reinterpret_cast<BlockQ4_1*>(specific.data()));
        break;
      case DType::kQ5_0:
        round_trip(quantize_row_q5_0, dequantize_row_q5_0,
                   reinterpret_cast<BlockQ5_0*>(specific.data()));
        break;
      case DType::kQ5_1:
        round_trip(quantize_row_q5_1, dequantize_row_q5_1,
                   reinterpret_cast<BlockQ5_1*>(specific.data()));
        break;
      case DType::kQ2_K:
        round_trip(quantize_row_q2_k, dequantize_row_q2_k,
                   reinterpret_cast<BlockQ2_K*>(specific.data()));
        break;
      case DType::kQ3_K:
        round_trip(quantize_row_q3_k, dequantize_row_q3_k,
                   reinterpret_cast<BlockQ3_K*>(specific.data()));
        break;
      case DType::kQ4_K:
        round_trip(quantize_row_q4_k, dequantize_row_q4_k,
                   reinterpret_cast<BlockQ4_K*>(specific.data()));
        break;
      case DType::kQ5_K:
        round_trip(quantize_row_q5_k, dequantize_row_q5_k,
                   reinterpret_cast<BlockQ5_K*>(specific.data()));
        break;
      case DType::kQ6_K:
        round_trip(quantize_row_q6_k, dequantize_row_q6_k,
                   reinterpret_cast<BlockQ6_K*>(specific.data()));
        break;
      case DType::kIQ4_NL:
        round_trip(quantize_row_iq4_nl, dequantize_row_iq4_nl,
                   reinterpret_cast<BlockIQ4_NL*>(specific.data()));
        break;
      case DType::kIQ4_XS:
        round_trip(quantize_row_iq4_xs, dequantize_row_iq4_xs,
                   reinterpret_cast<BlockIQ4_XS*>(specific.data()));
        break;
      case DType::kI32:
      case DType::kI8:
      case DType::kQ8_0Panels:
        FAIL();
    }
    EXPECT_EQ(generic, specific);
    EXPECT_EQ(generic_output, specific_output);
  }
}

}  // namespace
}  // namespace folio
