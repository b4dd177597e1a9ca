// The block layouts of ggml's quantized types, byte for byte as GGUF files store them (ggml's
// ggml-common.h defines them; docs/design/tensor.md has the value formulas). Every struct is
// packed by construction (only byte and uint16_t members, sizes asserted), 2-byte aligned, and
// a row of a tensor is an array of them.
//
// Terms:
// - block: 32 values sharing a scale (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl);
// - super-block: 256 values (kSuperBlockElements) with one f16 scale `d` (and for the types with
//   minimums, one f16 `dmin`), divided into sub-blocks of 16 or 32 values, each with its own
//   small integer scale (and minimum) that multiplies `d` (`dmin`): the k-quants and iq4_xs.
// - f16 fields are raw IEEE half bits (tensor/half.h converts them).
#pragma once

#include <cstddef>
#include <cstdint>

#include "folio/tensor/dtype.h"

namespace folio {

inline constexpr int64_t kQuantBlockElements = 32;
inline constexpr int64_t kSuperBlockElements = 256;

// q8_0, 34 bytes. value = d * q.
struct BlockQ8_0 {
  uint16_t scale;                      // f16 d
  int8_t values[kQuantBlockElements];  // q
};
static_assert(sizeof(BlockQ8_0) == 34);

// q4_0, 18 bytes. Element i < 16 is the low nibble of nibbles[i], element i + 16 its high
// nibble (the same split for every 32-value 4-bit block below). value = d * (nibble - 8).
struct BlockQ4_0 {
  uint16_t scale;                            // f16 d
  uint8_t nibbles[kQuantBlockElements / 2];  // value = d * (nibble - 8)
};
static_assert(sizeof(BlockQ4_0) == 18);

// q4_1, 20 bytes. value = d * nibble + m.
struct BlockQ4_1 {
  uint16_t scale;    // f16 d
  uint16_t minimum;  // f16 m
  uint8_t nibbles[kQuantBlockElements / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

// q5_0, 22 bytes. The fifth bit of element i is bit i of the little-endian uint32 high_bits.
// value = d * ((nibble | fifth bit << 4) - 16).
struct BlockQ5_0 {
  uint16_t scale;        // f16 d
  uint8_t high_bits[4];  // little-endian uint32, bit i for element i
  uint8_t nibbles[kQuantBlockElements / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

// q5_1, 24 bytes. As q5_0 without the offset: value = d * (nibble | fifth bit << 4) + m.
struct BlockQ5_1 {
  uint16_t scale;    // f16 d
  uint16_t minimum;  // f16 m
  uint8_t high_bits[4];
  uint8_t nibbles[kQuantBlockElements / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

// q2_K, 84 bytes: 16 sub-blocks of 16. scales[j]: low nibble the scale, high nibble the minimum
// of sub-block j. Each 128-value half uses 32 bytes of quants; within it, sub-blocks come in
// pairs by bit shift: for shift s = 0, 2, 4, 6, values (q[l] >> s) & 3 for l < 16 then for
// 16 <= l < 32. value = d * scale * q - dmin * minimum.
struct BlockQ2_K {
  uint8_t scales[kSuperBlockElements / 16];
  uint8_t quants[kSuperBlockElements / 4];
  uint16_t scale;          // f16 d
  uint16_t minimum_scale;  // f16 dmin
};
static_assert(sizeof(BlockQ2_K) == 84);

// q3_K, 110 bytes: 16 sub-blocks of 16 with 6-bit scales (offset 32) packed in 12 bytes. The
// 2 low bits of each value are laid out as q2_K's; the third bit is in high_mask (bit b of
// high_mask[l] for the b-th (shift, half) pair). value = d * (scale - 32) * (low2 - (bit ? 0 : 4)).
struct BlockQ3_K {
  uint8_t high_mask[kSuperBlockElements / 8];
  uint8_t quants[kSuperBlockElements / 4];
  uint8_t scales[12];
  uint16_t scale;  // f16 d
};
static_assert(sizeof(BlockQ3_K) == 110);

// q4_K, 144 bytes: 8 sub-blocks of 32 with 6-bit scales and 6-bit minimums packed in 12 bytes
// (k_quant_scale_and_minimum). Each 64-value pair of sub-blocks uses 32 bytes: the first
// sub-block in the low nibbles, the second in the high nibbles.
// value = d * scale * nibble - dmin * minimum.
struct BlockQ4_K {
  uint16_t scale;          // f16 d
  uint16_t minimum_scale;  // f16 dmin
  uint8_t scales[12];
  uint8_t quants[kSuperBlockElements / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

// q5_K, 176 bytes: q4_K plus a fifth bit per value: for the p-th pair of sub-blocks (p = 0..3),
// bit 2p of high_bits[l] for the first sub-block's element l and bit 2p + 1 for the second's.
struct BlockQ5_K {
  uint16_t scale;          // f16 d
  uint16_t minimum_scale;  // f16 dmin
  uint8_t scales[12];
  uint8_t high_bits[kSuperBlockElements / 8];
  uint8_t quants[kSuperBlockElements / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

// q6_K, 210 bytes: 16 sub-blocks of 16 with int8 scales. Each 128-value half uses 64 bytes of
// low nibbles and 32 bytes of 2-bit high parts: for l < 32, elements l, l + 32, l + 64, l + 96
// are low nibble of low[l], of low[l + 32], high nibble of low[l], of low[l + 32], with high
// bits (high[l] >> 0, 2, 4, 6) & 3. value = d * scale * (q - 32).
struct BlockQ6_K {
  uint8_t low[kSuperBlockElements / 2];
  uint8_t high[kSuperBlockElements / 4];
  int8_t scales[kSuperBlockElements / 16];
  uint16_t scale;  // f16 d
};
static_assert(sizeof(BlockQ6_K) == 210);

// ggml's non-linear 4-bit grid for iq4_nl and iq4_xs: value = d * kIq4NonLinearValues[nibble].
inline constexpr int8_t kIq4NonLinearValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                   1,    13,   25,  38,  53,  69,  89,  113};

// iq4_nl, 18 bytes: q4_0's layout with the grid in place of nibble - 8.
struct BlockIQ4_NL {
  uint16_t scale;  // f16 d
  uint8_t nibbles[kQuantBlockElements / 2];
};
static_assert(sizeof(BlockIQ4_NL) == 18);

// iq4_xs, 136 bytes: 8 sub-blocks of 32, each laid out as an iq4_nl block's nibbles, with a
// 6-bit scale (offset 32): low 4 bits in scales_low (sub-block j: nibble j % 2 of byte j / 2),
// high 2 bits at bit 2j of scales_high. value = d * (scale - 32) * grid[nibble].
struct BlockIQ4_XS {
  uint16_t scale;        // f16 d
  uint16_t scales_high;  // little-endian
  uint8_t scales_low[4];
  uint8_t nibbles[kSuperBlockElements / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136);

// The 6-bit scale and minimum of sub-block j (0..7) of a q4_K / q5_K super-block, unpacked from
// its 12 scale bytes: sub-blocks 0-3 in the low 6 bits of bytes j and j + 4; sub-blocks 4-7
// take 4 bits from byte j + 4 and their top 2 bits from the spare top bits of bytes j - 4 and j.
struct ScaleAndMinimum {
  uint8_t scale;
  uint8_t minimum;
};
constexpr ScaleAndMinimum k_quant_scale_and_minimum(int j, const uint8_t* scales) {
  if (j < 4) {
    return {static_cast<uint8_t>(scales[j] & 63), static_cast<uint8_t>(scales[j + 4] & 63)};
  }
  return {static_cast<uint8_t>((scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4)),
          static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4))};
}

// The 16 6-bit scales (offset 32 not yet removed) of a q3_K super-block: low 4 bits in bytes
// 0-7 (sub-block j: byte j % 8, nibble j / 8), high 2 bits in bytes 8-11 (bits 2 * (j / 4) of
// byte 8 + j % 4).
inline void q3_k_scales(const uint8_t* packed, int8_t* scales) {
  for (int j = 0; j < 16; ++j) {
    const int low = (packed[j % 8] >> (4 * (j / 8))) & 0x0f;
    const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    scales[j] = static_cast<int8_t>(low | (high << 4));
  }
}

// Byte offsets of a block's f16 fields: `scale` (d) and `minimum` (dmin, or q4_1 / q5_1's m);
// -1 where the type has none (both for the float and integer dtypes). Whoever writes block bytes
// other than by quantizing (tests, benchmarks, fuzzers) must keep these finite.
struct BlockHalfFields {
  int scale = -1;
  int minimum = -1;
};

constexpr BlockHalfFields block_half_fields(DType dtype) {
  switch (dtype) {
    case DType::kQ8_0:
      return {offsetof(BlockQ8_0, scale), -1};
    case DType::kQ4_0:
      return {offsetof(BlockQ4_0, scale), -1};
    case DType::kQ4_1:
      return {offsetof(BlockQ4_1, scale), offsetof(BlockQ4_1, minimum)};
    case DType::kQ5_0:
      return {offsetof(BlockQ5_0, scale), -1};
    case DType::kQ5_1:
      return {offsetof(BlockQ5_1, scale), offsetof(BlockQ5_1, minimum)};
    case DType::kQ2_K:
      return {offsetof(BlockQ2_K, scale), offsetof(BlockQ2_K, minimum_scale)};
    case DType::kQ3_K:
      return {offsetof(BlockQ3_K, scale), -1};
    case DType::kQ4_K:
      return {offsetof(BlockQ4_K, scale), offsetof(BlockQ4_K, minimum_scale)};
    case DType::kQ5_K:
      return {offsetof(BlockQ5_K, scale), offsetof(BlockQ5_K, minimum_scale)};
    case DType::kQ6_K:
      return {offsetof(BlockQ6_K, scale), -1};
    case DType::kIQ4_NL:
      return {offsetof(BlockIQ4_NL, scale), -1};
    case DType::kIQ4_XS:
      return {offsetof(BlockIQ4_XS, scale), -1};
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kI32:
    case DType::kI8:
    case DType::kQ8_0Panels:
      break;
  }
  return {};
}

}  // namespace folio
