// The quantizers of quantize.h's other block types, following ggml's reference quantizers (the
// `quantize_row_*_ref` functions, and for iq4_nl / iq4_xs the search llama-quantize runs
// without an importance matrix): the same searches (quantize_search.h), the same float
// operations in the same order, and the same integer conversions, so a row quantized here has
// the bytes llama.cpp writes for it. Compiled with floating-point contraction off
// (CMakeLists.txt): a fused multiply-add would round differently from ggml's separate multiply
// and add. A *level* is a value's integer code before packing.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "folio/base/check.h"
#include "folio/tensor/half.h"
#include "folio/tensor/quantize.h"
#include "folio/tensor/quantize_search.h"

namespace folio {
namespace {

using block_search::AffineSearch;
using block_search::kGroupMaxEpsilon;
using block_search::nearest_grid_index;
using block_search::refine_symmetric_scale;
using block_search::round_to_nearest;
using block_search::search_affine_scale;
using block_search::search_grid_scale;
using block_search::search_symmetric_scale;
using block_search::signed_extreme;

void check_whole_blocks(DType dtype, int64_t count) {
  const int64_t block = dtype_info(dtype).block_elements;
  FOLIO_DCHECK(count % block == 0, "row of {} values is not a whole number of {}-value {} blocks",
               count, block, dtype_name(dtype));
}

// 1/scale, or 0 when scale is 0 or its reciprocal overflows (as in quantize.cc: such a scale
// is 0 in f16, so the block decodes to zeros whatever its codes).
float inverse_or_zero(float scale) {
  const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
  return std::isfinite(inverse) ? inverse : 0.0f;
}

// Packs 32 levels (< 32) of a 32-value block: low nibbles as q4_0 (element i < 16 in the low
// nibble of byte i, i + 16 in its high nibble), bit 4 of element i at bit i of `fifth_bits`.
void pack_32(const uint8_t* levels, uint8_t* nibbles, uint8_t* fifth_bits) {
  uint32_t high = 0;
  for (int i = 0; i < 16; ++i) {
    nibbles[i] = static_cast<uint8_t>((levels[i] & 0x0f) | ((levels[i + 16] & 0x0f) << 4));
    high |= static_cast<uint32_t>((levels[i] >> 4) & 1) << i;
    high |= static_cast<uint32_t>((levels[i + 16] >> 4) & 1) << (i + 16);
  }
  if (fifth_bits != nullptr) std::memcpy(fifth_bits, &high, sizeof(high));
}

// Sets `scale` (f16 d) and `levels` for a symmetric block: d = extreme / -offset, level =
// min(max_level, trunc(x / d + offset + 0.5)). q4_0's rule for q5_0 (offset 16).
void quantize_symmetric_32(const float* values, int offset, int max_level, uint16_t& scale,
                           uint8_t* levels) {
  const float d = signed_extreme(values, 32) / static_cast<float>(-offset);
  const float inverse = inverse_or_zero(d);
  scale = f32_to_f16(d);
  for (int i = 0; i < 32; ++i) {
    // x * inverse + offset + 0.5 lies in [0.5, 2 * offset + 0.5]: the cast is well defined.
    const int level =
        static_cast<int8_t>(values[i] * inverse + (static_cast<float>(offset) + 0.5f));
    levels[i] = static_cast<uint8_t>(std::min(max_level, level));
  }
}

// Sets d, m (f16) and levels for an affine block: m = min, d = (max - min) / max_level,
// level = trunc((x - min) / d + 0.5).
void quantize_affine_32(const float* values, int max_level, uint16_t& scale, uint16_t& minimum,
                        uint8_t* levels) {
  float low = FLT_MAX;
  float high = -FLT_MAX;
  for (int i = 0; i < 32; ++i) {
    low = std::min(low, values[i]);
    high = std::max(high, values[i]);
  }
  const float d = (high - low) / static_cast<float>(max_level);
  const float inverse = inverse_or_zero(d);
  scale = f32_to_f16(d);
  minimum = f32_to_f16(low);
  for (int i = 0; i < 32; ++i) {
    // (x - min) * inverse + 0.5 lies in [0.5, max_level + 0.5] up to the reciprocal's rounding.
    const int level = static_cast<int8_t>((values[i] - low) * inverse + 0.5f);
    levels[i] = static_cast<uint8_t>(std::min(max_level, level));
  }
}

// Packs 256 2-bit levels as q2_K / q3_K store them: per 128-value half, byte l of its 32 holds
// levels l, l + 32, l + 64, l + 96 at bits 0, 2, 4, 6.
void pack_2_bit(const uint8_t* levels, uint8_t* quants) {
  for (int half = 0; half < 2; ++half) {
    const uint8_t* in = levels + 128 * half;
    for (int l = 0; l < 32; ++l) {
      quants[32 * half + l] =
          static_cast<uint8_t>(in[l] | (in[l + 32] << 2) | (in[l + 64] << 4) | (in[l + 96] << 6));
    }
  }
}

// The q4_K / q5_K part shared by both: the eight sub-block searches, the 6-bit scales and
// minimums packed into `packed_scales`, d and dmin, and the final levels recomputed against
// the stored (rounded) scales.
void quantize_k_super_block(const float* values, const AffineSearch& search, uint8_t* levels,
                            uint8_t* packed_scales, uint16_t& d_bits, uint16_t& dmin_bits) {
  float scales[8];
  float minimums[8];
  float weights[32];
  uint8_t candidate_levels[32];
  float max_scale = 0.0f;
  float max_minimum = 0.0f;
  for (int j = 0; j < 8; ++j) {
    const float* sub_block = values + 32 * j;
    float sum_squares = 0.0f;
    for (int l = 0; l < 32; ++l) sum_squares += sub_block[l] * sub_block[l];
    const float mean_magnitude = std::sqrt(sum_squares / 32.0f);
    for (int l = 0; l < 32; ++l) weights[l] = mean_magnitude + std::fabs(sub_block[l]);
    scales[j] = search_affine_scale(32, search, sub_block, weights, levels + 32 * j, minimums[j],
                                    candidate_levels);
    max_scale = std::max(max_scale, scales[j]);
    max_minimum = std::max(max_minimum, minimums[j]);
  }
  const float inverse_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
  const float inverse_minimum = max_minimum > 0.0f ? 63.0f / max_minimum : 0.0f;
  for (int j = 0; j < 8; ++j) {
    // ggml stores the rounded value in a uint8_t before clamping: a (never expected) negative
    // scale wraps and then clamps to 63; kept for identical bytes.
    const uint8_t scale =
        std::min<uint8_t>(63, static_cast<uint8_t>(round_to_nearest(inverse_scale * scales[j])));
    const uint8_t minimum = std::min<uint8_t>(
        63, static_cast<uint8_t>(round_to_nearest(inverse_minimum * minimums[j])));
    if (j < 4) {
      packed_scales[j] = scale;
      packed_scales[j + 4] = minimum;
    } else {
      packed_scales[j + 4] = static_cast<uint8_t>((scale & 0x0f) | ((minimum & 0x0f) << 4));
      packed_scales[j - 4] = static_cast<uint8_t>(packed_scales[j - 4] | ((scale >> 4) << 6));
      packed_scales[j] = static_cast<uint8_t>(packed_scales[j] | ((minimum >> 4) << 6));
    }
  }
  d_bits = f32_to_f16(max_scale / 63.0f);
  dmin_bits = f32_to_f16(max_minimum / 63.0f);
  const float d = f16_to_f32(d_bits);
  const float dmin = f16_to_f32(dmin_bits);
  for (int j = 0; j < 8; ++j) {
    const ScaleAndMinimum packed = k_quant_scale_and_minimum(j, packed_scales);
    const float sub_scale = d * static_cast<float>(packed.scale);
    if (sub_scale == 0.0f) continue;  // every level decodes to -minimum: keep the search's
    const float sub_minimum = dmin * static_cast<float>(packed.minimum);
    for (int l = 0; l < 32; ++l) {
      levels[32 * j + l] = static_cast<uint8_t>(std::clamp(
          round_to_nearest((values[32 * j + l] + sub_minimum) / sub_scale), 0, search.max_level));
    }
  }
}

// Packs 32 grid indices as an iq4_nl block's nibbles.
void pack_grid_indices(const float* values, float inverse_scale, uint8_t* nibbles) {
  uint8_t levels[32];
  for (int j = 0; j < 32; ++j) {
    levels[j] = static_cast<uint8_t>(nearest_grid_index(inverse_scale * values[j]));
  }
  pack_32(levels, nibbles, nullptr);
}

}  // namespace

void quantize_row_q4_1(const float* input, BlockQ4_1* output, int64_t count) {
  check_whole_blocks(DType::kQ4_1, count);
  uint8_t levels[32];
  for (int64_t block = 0; block < count / kQuantBlockElements; ++block) {
    quantize_affine_32(input + block * kQuantBlockElements, 15, output[block].scale,
                       output[block].minimum, levels);
    pack_32(levels, output[block].nibbles, nullptr);
  }
}

void quantize_row_q5_0(const float* input, BlockQ5_0* output, int64_t count) {
  check_whole_blocks(DType::kQ5_0, count);
  uint8_t levels[32];
  for (int64_t block = 0; block < count / kQuantBlockElements; ++block) {
    quantize_symmetric_32(input + block * kQuantBlockElements, 16, 31, output[block].scale, levels);
    pack_32(levels, output[block].nibbles, output[block].high_bits);
  }
}

void quantize_row_q5_1(const float* input, BlockQ5_1* output, int64_t count) {
  check_whole_blocks(DType::kQ5_1, count);
  uint8_t levels[32];
  for (int64_t block = 0; block < count / kQuantBlockElements; ++block) {
    quantize_affine_32(input + block * kQuantBlockElements, 31, output[block].scale,
                       output[block].minimum, levels);
    pack_32(levels, output[block].nibbles, output[block].high_bits);
  }
}

void quantize_row_q2_k(const float* input, BlockQ2_K* output, int64_t count) {
  check_whole_blocks(DType::kQ2_K, count);
  constexpr AffineSearch kSearch{
      .max_level = 3, .first_offset = -0.5f, .step = 0.1f, .steps = 15, .absolute_error = true};
  for (int64_t super = 0; super < count / kSuperBlockElements; ++super) {
    const float* values = input + super * kSuperBlockElements;
    BlockQ2_K& block = output[super];
    uint8_t levels[256];
    uint8_t candidate_levels[16];
    float weights[16];
    float scales[16];
    float minimums[16];
    float max_scale = 0.0f;
    float max_minimum = 0.0f;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(values[16 * j + l]);
      scales[j] = search_affine_scale(16, kSearch, values + 16 * j, weights, levels + 16 * j,
                                      minimums[j], candidate_levels);
      max_scale = std::max(max_scale, scales[j]);
      max_minimum = std::max(max_minimum, minimums[j]);
    }
    // 4-bit sub-block scales and minimums; ggml stores the rounded int into a byte (wrapping)
    // and ORs the minimum's nibble on top, kept for identical bytes.
    if (max_scale > 0.0f) {
      const float inverse = 15.0f / max_scale;
      for (int j = 0; j < 16; ++j) {
        block.scales[j] = static_cast<uint8_t>(round_to_nearest(inverse * scales[j]));
      }
      block.scale = f32_to_f16(max_scale / 15.0f);
    } else {
      std::fill(block.scales, block.scales + 16, 0);
      block.scale = f32_to_f16(0.0f);
    }
    if (max_minimum > 0.0f) {
      const float inverse = 15.0f / max_minimum;
      for (int j = 0; j < 16; ++j) {
        const int minimum = round_to_nearest(inverse * minimums[j]);
        block.scales[j] = static_cast<uint8_t>(block.scales[j] | (minimum << 4));
      }
      block.minimum_scale = f32_to_f16(max_minimum / 15.0f);
    } else {
      block.minimum_scale = f32_to_f16(0.0f);
    }
    const float d = f16_to_f32(block.scale);
    const float dmin = f16_to_f32(block.minimum_scale);
    for (int j = 0; j < 16; ++j) {
      const float sub_scale = d * static_cast<float>(block.scales[j] & 0x0f);
      if (sub_scale == 0.0f) continue;
      const float sub_minimum = dmin * static_cast<float>(block.scales[j] >> 4);
      for (int l = 0; l < 16; ++l) {
        levels[16 * j + l] = static_cast<uint8_t>(
            std::clamp(round_to_nearest((values[16 * j + l] + sub_minimum) / sub_scale), 0, 3));
      }
    }
    pack_2_bit(levels, block.quants);
  }
}

void quantize_row_q3_k(const float* input, BlockQ3_K* output, int64_t count) {
  check_whole_blocks(DType::kQ3_K, count);
  for (int64_t super = 0; super < count / kSuperBlockElements; ++super) {
    const float* values = input + super * kSuperBlockElements;
    BlockQ3_K& block = output[super];
    int8_t levels[256];
    float scales[16];
    float max_scale = 0.0f;  // signed, of largest magnitude
    float max_magnitude = 0.0f;
    for (int j = 0; j < 16; ++j) {
      scales[j] = refine_symmetric_scale(16, 4, values + 16 * j, levels + 16 * j);
      if (std::fabs(scales[j]) > max_magnitude) {
        max_magnitude = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    std::fill(block.scales, block.scales + 12, 0);
    if (max_scale != 0.0f) {
      const float inverse = -32.0f / max_scale;
      for (int j = 0; j < 16; ++j) {
        // ggml narrows to int8_t before clamping; the product is within [-32, 32] anyway.
        const int8_t rounded = static_cast<int8_t>(round_to_nearest(inverse * scales[j]));
        const int scale = std::clamp<int>(rounded, -32, 31) + 32;
        if (j < 8) {
          block.scales[j] = static_cast<uint8_t>(scale & 0x0f);
        } else {
          block.scales[j - 8] = static_cast<uint8_t>(block.scales[j - 8] | ((scale & 0x0f) << 4));
        }
        block.scales[8 + j % 4] =
            static_cast<uint8_t>(block.scales[8 + j % 4] | ((scale >> 4) << (2 * (j / 4))));
      }
      block.scale = f32_to_f16(1.0f / inverse);
    } else {
      block.scale = f32_to_f16(0.0f);
    }
    int8_t unpacked[16];
    q3_k_scales(block.scales, unpacked);
    const float d = f16_to_f32(block.scale);
    for (int j = 0; j < 16; ++j) {
      const float sub_scale = d * static_cast<float>(unpacked[j] - 32);
      if (sub_scale == 0.0f) continue;
      for (int l = 0; l < 16; ++l) {
        const int level = std::clamp(round_to_nearest(values[16 * j + l] / sub_scale), -4, 3);
        levels[16 * j + l] = static_cast<int8_t>(level + 4);
      }
    }
    // The third bit of value j goes to bit j / 32 of high_mask[j % 32].
    std::fill(block.high_mask, block.high_mask + 32, 0);
    uint8_t low_bits[256];
    for (int j = 0; j < 256; ++j) {
      int level = levels[j];
      if (level > 3) {
        block.high_mask[j % 32] = static_cast<uint8_t>(block.high_mask[j % 32] | (1 << (j / 32)));
        level -= 4;
      }
      low_bits[j] = static_cast<uint8_t>(level);
    }
    pack_2_bit(low_bits, block.quants);
  }
}

void quantize_row_q4_k(const float* input, BlockQ4_K* output, int64_t count) {
  check_whole_blocks(DType::kQ4_K, count);
  constexpr AffineSearch kSearch{
      .max_level = 15, .first_offset = -1.0f, .step = 0.1f, .steps = 20, .absolute_error = false};
  for (int64_t super = 0; super < count / kSuperBlockElements; ++super) {
    BlockQ4_K& block = output[super];
    uint8_t levels[256];
    quantize_k_super_block(input + super * kSuperBlockElements, kSearch, levels, block.scales,
                           block.scale, block.minimum_scale);
    // Each pair of sub-blocks: the first in the low nibbles, the second in the high nibbles.
    for (int pair = 0; pair < 4; ++pair) {
      for (int l = 0; l < 32; ++l) {
        block.quants[32 * pair + l] =
            static_cast<uint8_t>(levels[64 * pair + l] | (levels[64 * pair + 32 + l] << 4));
      }
    }
  }
}

void quantize_row_q5_k(const float* input, BlockQ5_K* output, int64_t count) {
  check_whole_blocks(DType::kQ5_K, count);
  constexpr AffineSearch kSearch{
      .max_level = 31, .first_offset = -0.5f, .step = 0.1f, .steps = 15, .absolute_error = false};
  for (int64_t super = 0; super < count / kSuperBlockElements; ++super) {
    BlockQ5_K& block = output[super];
    uint8_t levels[256];
    quantize_k_super_block(input + super * kSuperBlockElements, kSearch, levels, block.scales,
                           block.scale, block.minimum_scale);
    std::fill(block.high_bits, block.high_bits + 32, 0);
    for (int pair = 0; pair < 4; ++pair) {
      for (int l = 0; l < 32; ++l) {
        const int first = levels[64 * pair + l];
        const int second = levels[64 * pair + 32 + l];
        block.high_bits[l] = static_cast<uint8_t>(
            block.high_bits[l] | ((first >> 4) << (2 * pair)) | ((second >> 4) << (2 * pair + 1)));
        block.quants[32 * pair + l] = static_cast<uint8_t>((first & 0x0f) | ((second & 0x0f) << 4));
      }
    }
  }
}

void quantize_row_q6_k(const float* input, BlockQ6_K* output, int64_t count) {
  check_whole_blocks(DType::kQ6_K, count);
  for (int64_t super = 0; super < count / kSuperBlockElements; ++super) {
    const float* values = input + super * kSuperBlockElements;
    BlockQ6_K& block = output[super];
    int8_t levels[256];
    float scales[16];
    float max_scale = 0.0f;  // signed, of largest magnitude
    float max_magnitude = 0.0f;
    for (int j = 0; j < 16; ++j) {
      scales[j] = search_symmetric_scale(16, 32, values + 16 * j, levels + 16 * j);
      if (std::fabs(scales[j]) > max_magnitude) {
        max_magnitude = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    if (max_magnitude < kGroupMaxEpsilon) {
      std::memset(&block, 0, sizeof(block));
      continue;
    }
    const float inverse = -128.0f / max_scale;
    block.scale = f32_to_f16(1.0f / inverse);
    for (int j = 0; j < 16; ++j) {
      block.scales[j] = static_cast<int8_t>(std::min(127, round_to_nearest(inverse * scales[j])));
    }
    const float d = f16_to_f32(block.scale);
    for (int j = 0; j < 16; ++j) {
      const float sub_scale = d * static_cast<float>(block.scales[j]);
      if (sub_scale == 0.0f) continue;
      for (int l = 0; l < 16; ++l) {
        const int level = std::clamp(round_to_nearest(values[16 * j + l] / sub_scale), -32, 31);
        levels[16 * j + l] = static_cast<int8_t>(level + 32);
      }
    }
    // Per 128-value half: low nibbles of l and l + 64 share low[l], of l + 32 and l + 96 share
    // low[l + 32]; the four top 2-bit parts share high[l].
    for (int half = 0; half < 2; ++half) {
      const int8_t* in = levels + 128 * half;
      uint8_t* low = block.low + 64 * half;
      uint8_t* high = block.high + 32 * half;
      for (int l = 0; l < 32; ++l) {
        low[l] = static_cast<uint8_t>((in[l] & 0x0f) | ((in[l + 64] & 0x0f) << 4));
        low[l + 32] = static_cast<uint8_t>((in[l + 32] & 0x0f) | ((in[l + 96] & 0x0f) << 4));
        high[l] = static_cast<uint8_t>((in[l] >> 4) | ((in[l + 32] >> 4) << 2) |
                                       ((in[l + 64] >> 4) << 4) | ((in[l + 96] >> 4) << 6));
      }
    }
  }
}

void quantize_row_iq4_nl(const float* input, BlockIQ4_NL* output, int64_t count) {
  check_whole_blocks(DType::kIQ4_NL, count);
  for (int64_t block = 0; block < count / kQuantBlockElements; ++block) {
    const float* values = input + block * kQuantBlockElements;
    const float scale = search_grid_scale(values);
    output[block].scale = f32_to_f16(scale);
    // Indices are chosen against the f32 scale, as ggml does, not the stored f16 one.
    pack_grid_indices(values, scale != 0.0f ? 1.0f / scale : 0.0f, output[block].nibbles);
  }
}

void quantize_row_iq4_xs(const float* input, BlockIQ4_XS* output, int64_t count) {
  check_whole_blocks(DType::kIQ4_XS, count);
  for (int64_t super = 0; super < count / kSuperBlockElements; ++super) {
    const float* values = input + super * kSuperBlockElements;
    BlockIQ4_XS& block = output[super];
    float scales[8];
    float max_scale = 0.0f;  // signed, of largest magnitude
    float max_magnitude = 0.0f;
    for (int j = 0; j < 8; ++j) {
      scales[j] = search_grid_scale(values + 32 * j);
      if (std::fabs(scales[j]) > max_magnitude) {
        max_magnitude = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    const float d = -max_scale / 32.0f;
    block.scale = f32_to_f16(d);
    block.scales_high = 0;
    const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 8; ++j) {
      const int level = std::clamp(round_to_nearest(inverse * scales[j]), -32, 31);
      // As in ggml, indices use the f32 d times the sub-block scale, not the stored f16 d.
      const float sub_scale = d * static_cast<float>(level);
      pack_grid_indices(values + 32 * j, sub_scale != 0.0f ? 1.0f / sub_scale : 0.0f,
                        block.nibbles + 16 * j);
      const int stored = level + 32;
      if (j % 2 == 0) {
        block.scales_low[j / 2] = static_cast<uint8_t>(stored & 0x0f);
      } else {
        block.scales_low[j / 2] =
            static_cast<uint8_t>(block.scales_low[j / 2] | ((stored & 0x0f) << 4));
      }
      block.scales_high = static_cast<uint16_t>(block.scales_high | ((stored >> 4) << (2 * j)));
    }
  }
}

}  // namespace folio
