// The block types beyond q8_0 / q4_0: dequantizers against a float64 reference decoded from the
// raw bytes by each format's definition (written here independently of quant_blocks.h's
// structs), quantizer round trips with per-type error bounds, and hand-built blocks whose
// quantization follows from the algorithm by hand.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "folio/tensor/half.h"
#include "folio/tensor/quantize.h"

namespace folio {
namespace {

constexpr int kGrid[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                           1,    13,   25,  38,  53,  69,  89,  113};

// The block types this file covers, in the order of the error ordering they should follow.
constexpr DType kBlockTypes[] = {DType::kQ4_1,   DType::kQ5_0,  DType::kQ5_1, DType::kQ2_K,
                                 DType::kQ3_K,   DType::kQ4_K,  DType::kQ5_K, DType::kQ6_K,
                                 DType::kIQ4_NL, DType::kIQ4_XS};

double half_at(const uint8_t* bytes) {
  uint16_t bits;
  std::memcpy(&bits, bytes, 2);
  return f16_to_f32(bits);
}

// A 4-bit code of a 32-value group stored as q4_0 stores it: element k < 16 in the low nibble of
// byte k, element k + 16 in the high nibble of byte k.
int split_nibble(const uint8_t* nibbles, int k) {
  return k < 16 ? nibbles[k] & 0x0f : nibbles[k - 16] >> 4;
}

// The 2-bit code of element i of a q2_K / q3_K super-block: in each 128-value half, element
// 32 s + l (s < 4, l < 32) is bits 2s..2s+1 of byte l of the half's 32 bytes.
int two_bit_code(const uint8_t* quants, int i) {
  const int half = i / 128;
  const int within = i % 128;
  return (quants[32 * half + within % 32] >> (2 * (within / 32))) & 3;
}

// The 6-bit scale (first) and minimum (second) of sub-block j of q4_K / q5_K's 12 scale bytes.
std::pair<int, int> six_bit_pair(const uint8_t* scales, int j) {
  if (j < 4) return {scales[j] & 63, scales[j + 4] & 63};
  return {(scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4),
          (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4)};
}

// Element i of one block, in float64, with the sum of its terms' magnitudes (what float
// rounding is relative to).
struct Reference {
  double value = 0.0;
  double magnitude = 0.0;
};
Reference scaled(double scale_term, double offset_term) {
  return {scale_term + offset_term, std::fabs(scale_term) + std::fabs(offset_term)};
}

// Element i of one block of `dtype`, decoded in float64 from its raw bytes.
Reference reference_value(DType dtype, const uint8_t* block, int i) {
  switch (dtype) {
    case DType::kQ4_1:
      return scaled(half_at(block) * split_nibble(block + 4, i), half_at(block + 2));
    case DType::kQ5_0:
    case DType::kQ5_1: {
      const bool affine = dtype == DType::kQ5_1;
      const uint8_t* high = block + (affine ? 4 : 2);
      const int fifth = (high[i / 8] >> (i % 8)) & 1;
      const int code = split_nibble(high + 4, i) | (fifth << 4);
      return affine ? scaled(half_at(block) * code, half_at(block + 2))
                    : scaled(half_at(block) * (code - 16), 0.0);
    }
    case DType::kQ2_K: {
      const int packed = block[i / 16];
      return scaled(half_at(block + 80) * (packed & 0x0f) * two_bit_code(block + 16, i),
                    -half_at(block + 82) * (packed >> 4));
    }
    case DType::kQ3_K: {
      const int j = i / 16;
      const int low = j < 8 ? block[96 + j] & 0x0f : block[96 + j - 8] >> 4;
      const int scale = (low | (((block[96 + 8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
      const int high = (block[i % 32] >> (i / 32)) & 1;
      return scaled(half_at(block + 108) * scale * (two_bit_code(block + 32, i) + 4 * high - 4),
                    0.0);
    }
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const bool five = dtype == DType::kQ5_K;
      const int j = i / 32;
      const auto [scale, minimum] = six_bit_pair(block + 4, j);
      const uint8_t* quants = block + (five ? 48 : 16);
      int code = (quants[32 * (i / 64) + i % 32] >> (4 * (j % 2))) & 0x0f;
      if (five) code |= ((block[16 + i % 32] >> j) & 1) << 4;
      return scaled(half_at(block) * scale * code, -half_at(block + 2) * minimum);
    }
    case DType::kQ6_K: {
      const int half = i / 128;
      const int quarter = (i % 128) / 32;
      const int l = i % 32;
      const uint8_t low_byte = block[64 * half + l + 32 * (quarter % 2)];
      const int low = quarter < 2 ? low_byte & 0x0f : low_byte >> 4;
      const int high = (block[128 + 32 * half + l] >> (2 * quarter)) & 3;
      const int scale = static_cast<int8_t>(block[192 + i / 16]);
      return scaled(half_at(block + 208) * scale * ((low | (high << 4)) - 32), 0.0);
    }
    case DType::kIQ4_NL:
      return scaled(half_at(block) * kGrid[split_nibble(block + 2, i)], 0.0);
    case DType::kIQ4_XS: {
      const int j = i / 32;
      const int scales_high = block[2] | (block[3] << 8);
      const int scale =
          ((block[4 + j / 2] >> (4 * (j % 2))) & 0x0f) | (((scales_high >> (2 * j)) & 3) << 4);
      return scaled(half_at(block) * (scale - 32) * kGrid[split_nibble(block + 8 + 16 * j, i % 32)],
                    0.0);
    }
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
  ADD_FAILURE() << "no reference for " << dtype_name(dtype);
  return {};
}

TEST(QuantizeBlocksTest, DequantizersMatchAFloat64ReferenceOnRandomBytes) {
  std::mt19937 generator(11);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-2.0f, 2.0f);
  for (DType dtype : kBlockTypes) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const DTypeInfo info = dtype_info(dtype);
    const int64_t blocks = 8;
    const int64_t count = blocks * info.block_elements;
    std::vector<uint8_t> bytes(row_bytes(dtype, count));
    for (uint8_t& value : bytes) value = static_cast<uint8_t>(byte(generator));
    for (int64_t block = 0; block < blocks; ++block) {
      const BlockHalfFields fields = block_half_fields(dtype);
      for (int offset : {fields.scale, fields.minimum}) {
        if (offset < 0) continue;
        const uint16_t bits = f32_to_f16(scale(generator));
        std::memcpy(bytes.data() + block * info.block_bytes + offset, &bits, 2);
      }
    }
    std::vector<float> output(count);
    dequantize_row(dtype, bytes.data(), output.data(), count);
    for (int64_t i = 0; i < count; ++i) {
      const uint8_t* block = bytes.data() + i / info.block_elements * info.block_bytes;
      const Reference expected =
          reference_value(dtype, block, static_cast<int>(i % info.block_elements));
      // Folio rounds each product to f32 (as ggml does): a few ulps of the terms.
      ASSERT_NEAR(output[i], expected.value, 4e-7 * expected.magnitude) << "element " << i;
    }
  }
}

std::vector<float> gaussian_row(int64_t count, uint32_t seed, float deviation = 1.0f) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, deviation);
  std::vector<float> values(count);
  for (float& value : values) value = normal(generator);
  return values;
}

// sqrt(sum (x - y)^2 / sum x^2) after a round trip through `dtype`.
double relative_rms_error(DType dtype, const std::vector<float>& input) {
  const int64_t count = static_cast<int64_t>(input.size());
  std::vector<std::byte> bytes(row_bytes(dtype, count));
  std::vector<float> output(count);
  quantize_row(dtype, input.data(), bytes.data(), count);
  dequantize_row(dtype, bytes.data(), output.data(), count);
  double error = 0.0;
  double norm = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    EXPECT_TRUE(std::isfinite(output[i])) << i;
    error +=
        (static_cast<double>(output[i]) - input[i]) * (static_cast<double>(output[i]) - input[i]);
    norm += static_cast<double>(input[i]) * input[i];
  }
  return norm > 0.0 ? std::sqrt(error / norm) : std::sqrt(error);
}

// Relative RMS error bounds on gaussian rows, about 1.3x what these quantizers measure on 64K
// values (docs/design/tensor.md lists the measurements: q2_K 0.297, q3_K 0.151, q4_K 0.072,
// q5_K 0.036, q6_K 0.018, q4_1 0.079, q5_0 0.043, q5_1 0.038, iq4_nl 0.076, iq4_xs 0.077). The
// error of a uniform code is step / sqrt(12) with step = range / (2^bits - 1), so each bit
// about halves it, which the k-quants follow; 32-value blocks with their own f16 scale (q5_0,
// q5_1) sit a little below the 256-value super-blocks of the same bits.
double error_bound(DType dtype) {
  switch (dtype) {
    case DType::kQ4_1:
      return 0.10;
    case DType::kQ5_0:
      return 0.055;
    case DType::kQ5_1:
      return 0.05;
    case DType::kQ2_K:
      return 0.38;
    case DType::kQ3_K:
      return 0.19;
    case DType::kQ4_K:
      return 0.092;
    case DType::kQ5_K:
      return 0.047;
    case DType::kQ6_K:
      return 0.023;
    case DType::kIQ4_NL:
      return 0.10;
    case DType::kIQ4_XS:
      return 0.10;
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
  return 0.0;
}

TEST(QuantizeBlocksTest, GaussianRoundTripErrorStaysWithinEachTypesBound) {
  const std::vector<float> input = gaussian_row(256 * 256, 5, 0.02f);
  for (DType dtype : kBlockTypes) {
    const double error = relative_rms_error(dtype, input);
    std::printf("%-7s relative RMS error %.4f\n", std::string(dtype_name(dtype)).c_str(), error);
    EXPECT_LT(error, error_bound(dtype)) << dtype_name(dtype);
    EXPECT_GT(error, error_bound(dtype) / 3.0) << dtype_name(dtype) << ": suspiciously exact";
  }
}

TEST(QuantizeBlocksTest, KQuantErrorFallsWithEveryBit) {
  const std::vector<float> input = gaussian_row(256 * 64, 9);
  const DType ladder[] = {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
  double previous = relative_rms_error(ladder[0], input);
  for (size_t i = 1; i < std::size(ladder); ++i) {
    const double error = relative_rms_error(ladder[i], input);
    EXPECT_LT(error, 0.75 * previous)
        << dtype_name(ladder[i]) << " vs " << dtype_name(ladder[i - 1]);
    previous = error;
  }
}

TEST(QuantizeBlocksTest, RowsWithOutliersStayWithinTwiceTheBound) {
  std::vector<float> input = gaussian_row(256 * 32, 13);
  // One outlier of 20 sigma per 256 values, as weight matrices have.
  for (size_t i = 17; i < input.size(); i += 256) input[i] = (i % 512 == 17 ? 20.0f : -20.0f);
  for (DType dtype : kBlockTypes) {
    EXPECT_LT(relative_rms_error(dtype, input), 2.0 * error_bound(dtype)) << dtype_name(dtype);
  }
}

TEST(QuantizeBlocksTest, AllZeroRowsDecodeToExactZeros) {
  const std::vector<float> input(512, 0.0f);
  for (DType dtype : kBlockTypes) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    std::vector<std::byte> bytes(row_bytes(dtype, 512));
    std::vector<float> output(512, 1.0f);
    quantize_row(dtype, input.data(), bytes.data(), 512);
    dequantize_row(dtype, bytes.data(), output.data(), 512);
    for (float value : output) ASSERT_EQ(value, 0.0f);
  }
}

// A constant row: the affine types (a stored minimum) are exact up to the f16 rounding of the
// constant; the symmetric ones put it at their extreme level, exact up to the f16 scale.
TEST(QuantizeBlocksTest, ConstantRowsRoundTripWithinF16Precision) {
  for (float constant : {0.37f, -1.5f, 1000.0f}) {
    const std::vector<float> input(512, constant);
    for (DType dtype : kBlockTypes) {
      std::vector<std::byte> bytes(row_bytes(dtype, 512));
      std::vector<float> output(512);
      quantize_row(dtype, input.data(), bytes.data(), 512);
      dequantize_row(dtype, bytes.data(), output.data(), 512);
      for (float value : output) {
        // Two f16 roundings (a scale and a sub-scale) of relative error 2^-11 each.
        ASSERT_NEAR(value, constant, std::fabs(constant) * 3.0 / 2048.0)
            << dtype_name(dtype) << " constant " << constant;
      }
    }
  }
}

// Values far below f16's range must neither divide by zero nor produce inf or NaN: they decode
// to (nearly) zero.
TEST(QuantizeBlocksTest, TinyValuesDecodeToFiniteValuesNearZero) {
  for (float magnitude : {1e-12f, 1e-20f, 1e-30f, 1e-39f}) {
    const std::vector<float> input = gaussian_row(512, 3, magnitude);
    for (DType dtype : kBlockTypes) {
      std::vector<std::byte> bytes(row_bytes(dtype, 512));
      std::vector<float> output(512);
      quantize_row(dtype, input.data(), bytes.data(), 512);
      dequantize_row(dtype, bytes.data(), output.data(), 512);
      for (size_t i = 0; i < output.size(); ++i) {
        ASSERT_TRUE(std::isfinite(output[i])) << dtype_name(dtype) << " " << magnitude;
        ASSERT_LE(std::fabs(output[i] - input[i]), 10.0f * magnitude + 1e-7f)
            << dtype_name(dtype) << " " << magnitude << " element " << i;
      }
    }
  }
}

// q5_0: x_i = (i - 16) / 2. The extreme is x_0 = -8, so d = -8 / -16 = 0.5, 1/d = 2 and level
// i = trunc(x_i * 2 + 16.5) = i: nibbles i | i << 4 and fifth bits set for i >= 16.
TEST(QuantizeBlocksTest, HandBuiltQ5_0BlockStoresEachIndexAsItsLevel) {
  float input[32];
  for (int i = 0; i < 32; ++i) input[i] = static_cast<float>(i - 16) * 0.5f;
  BlockQ5_0 block;
  quantize_row_q5_0(input, &block, 32);
  EXPECT_EQ(block.scale, f32_to_f16(0.5f));
  uint32_t high_bits;
  std::memcpy(&high_bits, block.high_bits, 4);
  EXPECT_EQ(high_bits, 0xffff0000u);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(block.nibbles[i], i | (i << 4)) << i;
  float output[32];
  dequantize_row_q5_0(&block, output, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(output[i], input[i]) << i;
}

// q4_1: x_i = 1 + (i % 16) / 4: min 1, max 4.75, d = 3.75 / 15 = 0.25 and level
// trunc((x - 1) * 4 + 0.5) = i % 16, so nibble i | i << 4 and an exact round trip.
TEST(QuantizeBlocksTest, HandBuiltQ4_1BlockStoresMinimumAndStep) {
  float input[32];
  for (int i = 0; i < 32; ++i) input[i] = 1.0f + static_cast<float>(i % 16) * 0.25f;
  BlockQ4_1 block;
  quantize_row_q4_1(input, &block, 32);
  EXPECT_EQ(block.scale, f32_to_f16(0.25f));
  EXPECT_EQ(block.minimum, f32_to_f16(1.0f));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(block.nibbles[i], i | (i << 4)) << i;
  float output[32];
  dequantize_row_q4_1(&block, output, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(output[i], input[i]) << i;
}

// q6_K: x = q / 64 with q in [-32, 31] and q = -32 first in every sub-block. Each sub-block's
// search starts at 1 / scale = -32 / -0.5 = 64, which reproduces q exactly (zero error, which no
// other candidate beats), so every sub-block scale is 1/64; the super-block scale is then
// 1 / (-128 / (1/64)) = -2^-13 (exact in f16), every int8 scale -128, and d * scale = 1/64
// decodes each q exactly.
TEST(QuantizeBlocksTest, HandBuiltQ6_KBlockWithExactLevelsRoundTripsExactly) {
  float input[256];
  for (int i = 0; i < 256; ++i) {
    const int q = i % 16 == 0 ? -32 : ((i * 7) % 64) - 32;
    input[i] = static_cast<float>(q) / 64.0f;
  }
  BlockQ6_K block;
  quantize_row_q6_k(input, &block, 256);
  EXPECT_EQ(block.scale, f32_to_f16(-1.0f / 8192.0f));
  for (int j = 0; j < 16; ++j) EXPECT_EQ(block.scales[j], -128) << j;
  float output[256];
  dequantize_row_q6_k(&block, output, 256);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(output[i], input[i]) << i;
}

// iq4_nl: x_i = grid[i % 16] / 128. Among the candidate inverse scales (k - 127) / extreme with
// extreme = -127/128, k = 0 gives 128, which maps every value onto its own grid point: a perfect
// fit, so the scale is 1/128 (up to float rounding of the fit, which f16 absorbs) and the
// nibbles are the grid indices i % 16.
TEST(QuantizeBlocksTest, HandBuiltIq4NlBlockOnTheGridRoundTripsExactly) {
  float input[32];
  for (int i = 0; i < 32; ++i) input[i] = static_cast<float>(kGrid[i % 16]) / 128.0f;
  BlockIQ4_NL block;
  quantize_row_iq4_nl(input, &block, 32);
  EXPECT_EQ(block.scale, f32_to_f16(1.0f / 128.0f));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(block.nibbles[i], i | (i << 4)) << i;
  float output[32];
  dequantize_row_iq4_nl(&block, output, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(output[i], input[i]) << i;
}

// q4_K: x = s * q with q in [0, 15], 0 and 15 in every sub-block and s = 63/64. The range
// search starts from scale (max - min) / 15 = s with minimum 0, which fits every value (the
// least-squares candidates cannot do better than no error), so the stored d is s / 63 = 1/64
// (exact in f16), every 6-bit scale 63, dmin 0, and d * 63 * q reproduces x.
TEST(QuantizeBlocksTest, HandBuiltQ4_KBlockOfWholeStepsRoundTripsExactly) {
  float input[256];
  for (int i = 0; i < 256; ++i) {
    const int q = i % 32 == 0 ? 0 : (i % 32 == 1 ? 15 : (i * 5) % 16);
    input[i] = static_cast<float>(q) * (63.0f / 64.0f);
  }
  BlockQ4_K block;
  quantize_row_q4_k(input, &block, 256);
  EXPECT_EQ(block.scale, f32_to_f16(1.0f / 64.0f));
  EXPECT_EQ(f16_to_f32(block.minimum_scale), 0.0f);
  for (int j = 0; j < 8; ++j) EXPECT_EQ(k_quant_scale_and_minimum(j, block.scales).scale, 63) << j;
  float output[256];
  dequantize_row_q4_k(&block, output, 256);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(output[i], input[i]) << i;
}

}  // namespace
}  // namespace folio
