// The dequantizers of quantize.h's other block types. Each follows ggml's reference
// dequantization operation for operation (the per-sub-block products d * scale and
// dmin * minimum are rounded to f32 first, then value = product * q - product), so the values
// are bit-identical to what llama.cpp reads from the same bytes.
#include <cstdint>
#include <cstring>

#include "folio/base/check.h"
#include "folio/tensor/half.h"
#include "folio/tensor/quantize.h"

namespace folio {
namespace {

void check_whole_blocks(DType dtype, int64_t count) {
  const int64_t block = dtype_info(dtype).block_elements;
  FOLIO_DCHECK(count % block == 0, "row of {} values is not a whole number of {}-value {} blocks",
               count, block, dtype_name(dtype));
}

uint32_t load_u32(const uint8_t* bytes) {
  uint32_t value;
  std::memcpy(&value, bytes, sizeof(value));
  return value;
}

// The four 32-value types with 4-bit low parts: element i < 16 is the low nibble of byte i,
// element i + 16 its high nibble; `fifth_bits` (0 for the 4-bit types) supplies bit 4.
template <typename Decode>
void dequantize_32(const uint8_t* nibbles, uint32_t fifth_bits, float* output, Decode decode) {
  for (int i = 0; i < 16; ++i) {
    const int high_low = ((fifth_bits >> i) << 4) & 0x10;
    const int high_high = (fifth_bits >> (i + 12)) & 0x10;
    output[i] = decode((nibbles[i] & 0x0f) | high_low);
    output[i + 16] = decode((nibbles[i] >> 4) | high_high);
  }
}

}  // namespace

void dequantize_row_q4_1(const BlockQ4_1* input, float* output, int64_t count) {
  check_whole_blocks(DType::kQ4_1, count);
  for (int64_t block = 0; block < count / kQuantBlockElements; ++block) {
    const float d = f16_to_f32(input[block].scale);
    const float m = f16_to_f32(input[block].minimum);
    dequantize_32(input[block].nibbles, 0, output + block * kQuantBlockElements,
                  [&](int q) { return static_cast<float>(q) * d + m; });
  }
}

void dequantize_row_q5_0(const BlockQ5_0* input, float* output, int64_t count) {
  check_whole_blocks(DType::kQ5_0, count);
  for (int64_t block = 0; block < count / kQuantBlockElements; ++block) {
    const float d = f16_to_f32(input[block].scale);
    dequantize_32(input[block].nibbles, load_u32(input[block].high_bits),
                  output + block * kQuantBlockElements,
                  [&](int q) { return static_cast<float>(q - 16) * d; });
  }
}

void dequantize_row_q5_1(const BlockQ5_1* input, float* output, int64_t count) {
  check_whole_blocks(DType::kQ5_1, count);
  for (int64_t block = 0; block < count / kQuantBlockElements; ++block) {
    const float d = f16_to_f32(input[block].scale);
    const float m = f16_to_f32(input[block].minimum);
    dequantize_32(input[block].nibbles, load_u32(input[block].high_bits),
                  output + block * kQuantBlockElements,
                  [&](int q) { return static_cast<float>(q) * d + m; });
  }
}

void dequantize_row_iq4_nl(const BlockIQ4_NL* input, float* output, int64_t count) {
  check_whole_blocks(DType::kIQ4_NL, count);
  for (int64_t block = 0; block < count / kQuantBlockElements; ++block) {
    const float d = f16_to_f32(input[block].scale);
    dequantize_32(input[block].nibbles, 0, output + block * kQuantBlockElements,
                  [&](int q) { return d * static_cast<float>(kIq4NonLinearValues[q]); });
  }
}

void dequantize_row_q2_k(const BlockQ2_K* input, float* output, int64_t count) {
  check_whole_blocks(DType::kQ2_K, count);
  for (int64_t super = 0; super < count / kSuperBlockElements; ++super) {
    const BlockQ2_K& block = input[super];
    const float d = f16_to_f32(block.scale);
    const float minimum = f16_to_f32(block.minimum_scale);
    const uint8_t* quants = block.quants;
    float* y = output + super * kSuperBlockElements;
    int sub_block = 0;
    for (int half = 0; half < 2; ++half) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int part = 0; part < 2; ++part) {
          const uint8_t packed = block.scales[sub_block++];
          const float scale = d * static_cast<float>(packed & 0x0f);
          const float offset = minimum * static_cast<float>(packed >> 4);
          for (int l = 0; l < 16; ++l) {
            *y++ = scale * static_cast<float>((quants[16 * part + l] >> shift) & 3) - offset;
          }
        }
      }
      quants += 32;
    }
  }
}

void dequantize_row_q3_k(const BlockQ3_K* input, float* output, int64_t count) {
  check_whole_blocks(DType::kQ3_K, count);
  for (int64_t super = 0; super < count / kSuperBlockElements; ++super) {
    const BlockQ3_K& block = input[super];
    const float d = f16_to_f32(block.scale);
    int8_t scales[16];
    q3_k_scales(block.scales, scales);
    const uint8_t* quants = block.quants;
    float* y = output + super * kSuperBlockElements;
    int sub_block = 0;
    uint8_t mask = 1;
    for (int half = 0; half < 2; ++half) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int part = 0; part < 2; ++part) {
          const float scale = d * static_cast<float>(scales[sub_block++] - 32);
          for (int l = 0; l < 16; ++l) {
            const int index = 16 * part + l;
            const int low = (quants[index] >> shift) & 3;
            const int value = low - ((block.high_mask[index] & mask) != 0 ? 0 : 4);
            *y++ = scale * static_cast<float>(value);
          }
        }
        mask = static_cast<uint8_t>(mask << 1);
      }
      quants += 32;
    }
  }
}

namespace {

// The q4_K / q5_K super-block: 8 sub-blocks of 32 with 6-bit scales and minimums, each pair of
// sub-blocks in the low and high nibbles of 32 bytes; q5_K adds bit 2 * pair + part of
// high_bits[l] as the fifth bit (high_bits is null for q4_K).
template <typename Block>
void dequantize_row_k_quant_with_minimums(const Block* input,
                                          const uint8_t* (*high_bits)(const Block&), float* output,
                                          int64_t count) {
  for (int64_t super = 0; super < count / kSuperBlockElements; ++super) {
    const Block& block = input[super];
    const float d = f16_to_f32(block.scale);
    const float minimum = f16_to_f32(block.minimum_scale);
    const uint8_t* quants = block.quants;
    const uint8_t* fifth_bits = high_bits(block);
    float* y = output + super * kSuperBlockElements;
    for (int pair = 0; pair < 4; ++pair) {
      for (int part = 0; part < 2; ++part) {
        const int sub_block = 2 * pair + part;
        const ScaleAndMinimum packed = k_quant_scale_and_minimum(sub_block, block.scales);
        const float scale = d * static_cast<float>(packed.scale);
        const float offset = minimum * static_cast<float>(packed.minimum);
        for (int l = 0; l < 32; ++l) {
          int value = (quants[l] >> (4 * part)) & 0x0f;
          if (fifth_bits != nullptr) value += ((fifth_bits[l] >> sub_block) & 1) << 4;
          *y++ = scale * static_cast<float>(value) - offset;
        }
      }
      quants += 32;
    }
  }
}

}  // namespace

void dequantize_row_q4_k(const BlockQ4_K* input, float* output, int64_t count) {
  check_whole_blocks(DType::kQ4_K, count);
  dequantize_row_k_quant_with_minimums<BlockQ4_K>(
      input, [](const BlockQ4_K&) -> const uint8_t* { return nullptr; }, output, count);
}

void dequantize_row_q5_k(const BlockQ5_K* input, float* output, int64_t count) {
  check_whole_blocks(DType::kQ5_K, count);
  dequantize_row_k_quant_with_minimums<BlockQ5_K>(
      input, [](const BlockQ5_K& block) -> const uint8_t* { return block.high_bits; }, output,
      count);
}

void dequantize_row_q6_k(const BlockQ6_K* input, float* output, int64_t count) {
  check_whole_blocks(DType::kQ6_K, count);
  for (int64_t super = 0; super < count / kSuperBlockElements; ++super) {
    const BlockQ6_K& block = input[super];
    const float d = f16_to_f32(block.scale);
    const uint8_t* low = block.low;
    const uint8_t* high = block.high;
    const int8_t* scales = block.scales;
    float* y = output + super * kSuperBlockElements;
    for (int half = 0; half < 2; ++half) {
      for (int l = 0; l < 32; ++l) {
        const int sub_block = l / 16;
        const int q1 = ((low[l] & 0x0f) | (((high[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((low[l + 32] & 0x0f) | (((high[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((low[l] >> 4) | (((high[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((low[l + 32] >> 4) | (((high[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(scales[sub_block]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(scales[sub_block + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(scales[sub_block + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(scales[sub_block + 6]) * static_cast<float>(q4);
      }
      y += 128;
      low += 64;
      high += 32;
      scales += 8;
    }
  }
}

void dequantize_row_iq4_xs(const BlockIQ4_XS* input, float* output, int64_t count) {
  check_whole_blocks(DType::kIQ4_XS, count);
  for (int64_t super = 0; super < count / kSuperBlockElements; ++super) {
    const BlockIQ4_XS& block = input[super];
    const float d = f16_to_f32(block.scale);
    float* y = output + super * kSuperBlockElements;
    for (int sub_block = 0; sub_block < 8; ++sub_block) {
      const int scale_bits = ((block.scales_low[sub_block / 2] >> (4 * (sub_block % 2))) & 0x0f) |
                             (((block.scales_high >> (2 * sub_block)) & 3) << 4);
      const float scale = d * static_cast<float>(scale_bits - 32);
      dequantize_32(block.nibbles + 16 * sub_block, 0, y + 32 * sub_block,
                    [&](int q) { return scale * static_cast<float>(kIq4NonLinearValues[q]); });
    }
  }
}

}  // namespace folio
