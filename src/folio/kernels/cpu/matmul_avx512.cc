// AVX-512 matmul row kernels (F/BW/VL/DQ + VNNI): the tile loops of matmul_body.inc over
// 16-lane vectors, and the quantizer of x. Compiled for those extensions only inside this file
// (#pragma GCC target) so the rest of the binary still runs on any x86-64; called only when the
// active SimdLevel is kAvx512.
//
// Register tiles: 4 weight rows x 4 rows of x, one 16-lane f32 accumulator per pair (16 of the
// 32 zmm registers). Int8 blocks: two per vector (lanes 0-7 hold the first, 8-15 the second),
// multiplied with VNNI vpdpbusd (unsigned x signed bytes, 4 products summed per 32-bit lane).
// The other block types are decoded to unsigned bytes by matmul_weight_decode_avx2.inc (two
// 32-value halves per vector), q4_K / q5_K / q6_K by 512-bit decoders here; a super-block's
// sub-block scales are converted once and spread over the lanes of each step by a permute.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <utility>

#include "folio/base/check.h"
#include "folio/kernels/cpu/matmul.h"
#include "folio/kernels/cpu/matmul_kernels.h"
#include "folio/kernels/cpu/simd_target.h"
#include "folio/tensor/quantize.h"

FOLIO_SIMD_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")

namespace folio::kernels::cpu::internal {
namespace {

// The f16 scales of two consecutive blocks as f32, each repeated over its 8 lanes; `whole` is
// false when only the first block exists (the odd last block of a row), whose upper lanes are
// then 0.
inline __m512 weight_scales(const std::byte* block, int64_t block_bytes, bool whole) {
  uint16_t first;
  uint16_t second = 0;
  std::memcpy(&first, block, sizeof(first));
  if (whole) std::memcpy(&second, block + block_bytes, sizeof(second));
  const __m128 scales = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(first | (second << 16))));
  const __m512i spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(scales));
}

// The 64 weight values of two q4_0 blocks as unsigned bytes in x's element order: nibbles as
// stored (value + 8). Unused upper bytes are 0. (q8_0 has its own kernel:
// matmul_q8_0_avx512.cc.)
inline __m512i q4_0_weight_bytes(const std::byte* block, bool whole) {
  constexpr int64_t kBytes = sizeof(BlockQ4_0);
  const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
  if (!whole) {
    const __m256i both =
        _mm256_inserti128_si256(_mm256_castsi128_si256(first), _mm_srli_epi16(first, 4), 1);
    return _mm512_zextsi256_si512(_mm256_and_si256(both, _mm256_set1_epi8(0x0f)));
  }
  const __m128i second = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kBytes + 2));
  const __m256i packed = _mm256_inserti128_si256(_mm256_castsi128_si256(first), second, 1);
  // Qwords [a0 a1 a0 a1 b0 b1 b0 b1], the second copy of each block shifted right by 4 so its
  // bytes' low nibbles are the stored high nibbles (elements 16-31 of the block).
  const __m512i doubled = _mm512_permutexvar_epi64(_mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0),
                                                   _mm512_castsi256_si512(packed));
  const __m512i shifted = _mm512_srlv_epi64(doubled, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
  return _mm512_and_si512(shifted, _mm512_set1_epi8(0x0f));
}

#include "folio/kernels/cpu/matmul_weight_decode_avx2.inc"
#include "folio/kernels/cpu/simd_avx512.inc"

// Two 256-bit halves as one vector.
inline __m512i concatenate(__m256i low, __m256i high) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
}

// The 16 nibble bytes of two 32-value blocks (element i < 16 the low nibble of byte i, i + 16
// its high nibble) as 64 bytes in element order, as q4_0_weight_bytes.
inline __m512i nibble_pairs(const std::byte* first, const std::byte* second) {
  const __m256i packed = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(first))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(second)), 1);
  const __m512i doubled = _mm512_permutexvar_epi64(_mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0),
                                                   _mm512_castsi256_si512(packed));
  const __m512i shifted = _mm512_srlv_epi64(doubled, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
  return _mm512_and_si512(shifted, _mm512_set1_epi8(0x0f));
}

inline __m512i iq4_unsigned_grid_512() {
  return _mm512_broadcast_i32x4(_mm256_castsi256_si128(iq4_unsigned_grid()));
}

// 32 bytes in both halves.
inline __m512i load_twice(const std::byte* pointer) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pointer)));
}

// The x-blocks (of the 8 of a super-block) in the lower and upper halves of step kStep of
// q4_K and q5_K: 4 j + h and 4 j + 2 + h, j = kStep / 2, h = kStep % 2.
struct StepXBlocks {
  int lower;
  int upper;
};
constexpr StepXBlocks step_x_blocks(int step) {
  return {4 * (step / 2) + step % 2, 4 * (step / 2) + 2 + step % 2};
}

// The vpermw indices of the q4_K / q5_K steps (Simd::step_scale_index), by row % 2 and step:
// loaded as constants rather than computed in the loop (GCC built them with 3-4 operations each
// per super-block).
struct StepScaleIndices {
  alignas(64) uint16_t words[2][4][32];
};
constexpr StepScaleIndices step_scale_indices() {
  StepScaleIndices indices{};
  for (int parity = 0; parity < 2; ++parity) {
    for (int step = 0; step < 4; ++step) {
      for (int word = 0; word < 32; ++word) {
        const int lane = word / 2;
        const int sub_block = lane < 8 ? step_x_blocks(step).lower : step_x_blocks(step).upper;
        indices.words[parity][step][word] = static_cast<uint16_t>(16 * parity + sub_block);
      }
    }
  }
  return indices;
}
constexpr StepScaleIndices kStepScaleIndices = step_scale_indices();

// The 64 bytes of step kStep (x-blocks 2 kStep, 2 kStep + 1; for q4_K and q5_K
// step_x_blocks(kStep)) of a super-block: for q4_K, q5_K
// and q6_K decoded in 512-bit registers (each loaded byte feeds both halves: fewer operations
// than two 256-bit decodes, measured), the others as two weight_block_bytes.
template <DType kDtype, int kStep>
inline __m512i super_block_step_bytes(const std::byte* block) {
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  if constexpr (kDtype == DType::kQ4_K || kDtype == DType::kQ5_K) {
    // Step kStep pairs x-blocks step_x_blocks(kStep): the low (even kStep) or high nibbles of
    // quant bytes 64 j - 64 j + 63, j = kStep / 2, one plain 64-byte load. (Pairing the low
    // and high nibbles of 32 bytes instead needs a 256-to-512-bit broadcast per step and row,
    // a shuffle: 12% of q4_K's time at batch 1, measured.)
    using Block = std::conditional_t<kDtype == DType::kQ4_K, BlockQ4_K, BlockQ5_K>;
    const __m512i packed = _mm512_loadu_si512(block + offsetof(Block, quants) + 64 * (kStep / 2));
    const __m512i low_bits =
        _mm512_and_si512(kStep % 2 == 0 ? packed : _mm512_srli_epi16(packed, 4), nibble);
    if constexpr (kDtype == DType::kQ4_K) {
      return low_bits;
    } else {
      // The fifth bit of x-block b's value l is bit b of high_bits[l].
      constexpr int kLower = step_x_blocks(kStep).lower;
      constexpr int kUpper = step_x_blocks(kStep).upper;
      const __m512i high = load_twice(block + offsetof(BlockQ5_K, high_bits));
      const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << kLower)),
                                             _mm256_set1_epi8(static_cast<char>(1 << kUpper)), 1);
      return _mm512_mask_add_epi8(low_bits, _mm512_test_epi8_mask(high, bit), low_bits,
                                  _mm512_set1_epi8(16));
    }
  } else if constexpr (kDtype == DType::kQ6_K) {
    // Half kStep / 2; parts 2p, 2p + 1 (p = kStep % 2) take the low (p = 0) or high nibbles of
    // its 64 low bytes, and bits (4p, 4p + 1), (4p + 2, 4p + 3) of its 32 high bytes. The high
    // bytes are masked to the bits of both steps of the half (0x33 for parts 0 and 2, 0xcc for 1
    // and 3) before the shift, so that the shifted bytes hold nothing but the two bits, at bits
    // 4-5: one vpternlogd then takes bits 0-3 from the low bytes and 4-7 from them, with no mask
    // of its own (3 operations per step instead of 3.5; the masked bytes are shared by the two
    // steps of the half).
    constexpr int kHalf = kStep / 2;
    const __m512i packed = _mm512_loadu_si512(block + 64 * kHalf);
    const __m512i low_bits = kStep % 2 == 0 ? packed : _mm512_srli_epi16(packed, 4);
    const __m512i high = _mm512_and_si512(
        load_twice(block + offsetof(BlockQ6_K, high) + 32 * kHalf),
        _mm512_setr_epi64(0x3333333333333333, 0x3333333333333333, 0x3333333333333333,
                          0x3333333333333333, 0xccccccccccccccccULL, 0xccccccccccccccccULL,
                          0xccccccccccccccccULL, 0xccccccccccccccccULL));
    const __m512i high_bits =
        kStep % 2 == 0 ? _mm512_sllv_epi64(high, _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2))
                       : _mm512_srlv_epi64(high, _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2));
    // (mask ? low_bits : high_bits) bit by bit, mask 0x0f in every byte.
    return _mm512_ternarylogic_epi32(low_bits, high_bits, _mm512_set1_epi8(0x0f), 0xe4);
  } else if constexpr (kDtype == DType::kIQ4_XS) {
    // Sub-blocks 2 kStep and 2 kStep + 1: 16 nibble bytes each, back to back.
    const std::byte* nibbles = block + offsetof(BlockIQ4_XS, nibbles) + 32 * kStep;
    return _mm512_shuffle_epi8(iq4_unsigned_grid_512(), nibble_pairs(nibbles, nibbles + 16));
  } else {
    return concatenate(weight_block_bytes<kDtype, 2 * kStep>(block),
                       weight_block_bytes<kDtype, 2 * kStep + 1>(block));
  }
}

// The other block types' two blocks: the 32-value decoders of
// matmul_weight_decode_avx2.inc, twice; the upper half is 0 unless `whole`.
template <DType kDtype, bool kWhole>
inline __m512i decoded_weight_bytes(const std::byte* block) {
  constexpr int64_t kBytes = dtype_info(kDtype).block_bytes;
  if constexpr (!kWhole) {
    return _mm512_zextsi256_si512(weight_block_bytes<kDtype, 0>(block));
  } else if constexpr (kDtype == DType::kQ4_1) {
    return nibble_pairs(block + offsetof(BlockQ4_1, nibbles),
                        block + kBytes + offsetof(BlockQ4_1, nibbles));
  } else if constexpr (kDtype == DType::kIQ4_NL) {
    return _mm512_shuffle_epi8(iq4_unsigned_grid_512(),
                               nibble_pairs(block + offsetof(BlockIQ4_NL, nibbles),
                                            block + kBytes + offsetof(BlockIQ4_NL, nibbles)));
  } else {
    static_assert(kDtype == DType::kQ5_0 || kDtype == DType::kQ5_1);
    using Block = std::conditional_t<kDtype == DType::kQ5_0, BlockQ5_0, BlockQ5_1>;
    const __m512i low_bits =
        nibble_pairs(block + offsetof(Block, nibbles), block + kBytes + offsetof(Block, nibbles));
    // Bit i of the mask: element i's fifth bit (the two blocks' 32-bit masks side by side).
    const __mmask64 fifth_bits =
        load_u32(block + offsetof(Block, high_bits)) |
        (uint64_t{load_u32(block + kBytes + offsetof(Block, high_bits))} << 32);
    return _mm512_mask_add_epi8(low_bits, fifth_bits, low_bits, _mm512_set1_epi8(16));
  }
}

struct Simd : SimdAvx512 {
  static constexpr std::string_view kName = "avx512";
  using IntegerVector = __m512i;
  static constexpr int kFloatTileInputRows = 4;
  static constexpr int kQuantizedTileInputRows = 4;
  static constexpr int kQuantizedTileWeightRows = 4;
  static constexpr bool kQ8_0InPanels = true;
  static constexpr int64_t kBlocksPerVector = 2;
  static constexpr int kStepsPerSuperBlock = 4;

  // bf16 is the upper half of an f32.
  static Vector load_bf16(const uint16_t* pointer) {
    const __m256i halves = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pointer));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
  }
  static Vector to_float(IntegerVector value) { return _mm512_cvtepi32_ps(value); }

  // The super-block dtypes whose x has one d per super-block (has_super_block_activation_scale)
  // sum a super-block in i32 (matmul_body.inc): per step and lane, the integer dot product
  // times the lane's integer sub-block scale, then once per super-block the conversion and the
  // multiply by d_w * d_x. Integer bounds (|x| <= 127): q4_K / q5_K take vpmaddubsw pairs
  // (|u0 x0 + u1 x1| <= 2 * 31 * 127, no saturation) times the 6-bit scale by vpdpwssd:
  // |sum| < 2^22 over a super-block's 4 steps. q6_K takes vpdpbusd from x's lane correction
  // (the exact lane dot product of u - 32 and x, |dot| <= 4 * 32 * 127 < 2^15) times the
  // signed 8-bit scale by vpdpwssd: |sum| <= 4 * 16256 * 128 < 2^24, exact in f32 too.
  static constexpr bool sums_super_blocks_in_integers(DType dtype) {
    return has_super_block_activation_scale(dtype);
  }
  static IntegerVector integer_zero() { return _mm512_setzero_si512(); }

  struct WeightBlocks {
    IntegerVector bytes;  // the unsigned operand of vpdpbusd
    Vector scales;
    Vector offsets;  // the dtypes with minimums only
    // sums_super_blocks_in_integers: each lane's integer sub-block scale, in both 16-bit
    // halves (the vpdpwssd operand).
    IntegerVector integer_scales;
  };
  // A super-block's 16 (or 8, in lanes 0-7) sub-block scales d * scale, and its offsets per
  // 16-value granule. sums_super_blocks_in_integers: the integer scales instead (as
  // WeightBlocks::integer_scales holds them, per sub-block) and d.
  //
  // q4_K / q5_K (load_group_super_block_scales): integer_scales holds the unpacked sub-block
  // scales and minimums of all the group's rows, row r in 128-bit chunk r (bytes 0-7 the
  // scales, 8-15 the minimums) widened to words, two rows per vector, and `row` says which is this
  // row's; each step picks its lanes' scales from it by one vpermw. q6_K: its 16 signed scales
  // widened to i16.
  //   Their `scales` holds d and dmin of every row of the group (row r in lanes 2r, 2r + 1),
  //   and `offsets` the minimums times dmin of the row pair
  //   (2r, 2r + 1), row 2r in lanes 0-7 and row 2r + 1 in lanes 8-15 (one per 32-value
  //   sub-block), `offset_lanes` this row's half.
  struct SuperBlockScales {
    Vector scales;
    Vector offsets;
    IntegerVector integer_scales;
    float scale;
    int row;
    __mmask16 offset_lanes;
  };
  template <DType kDtype>
  static Vector add_integer_sums(const SuperBlockScales& scales, IntegerVector sums, float x_scale,
                                 Vector sum) {
    if constexpr (loads_group_super_block_scales(kDtype)) {
      // d_w * d_x from lane 2 row of (d, dmin of every row) * d_x: the product is the same for
      // every row of a group and x, so it is made once per x row, one permute per weight row.
      const Vector products = _mm512_mul_ps(scales.scales, _mm512_set1_ps(x_scale));
      return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums),
                             _mm512_permutexvar_ps(_mm512_set1_epi32(2 * scales.row), products),
                             sum);
    } else {
      return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_set1_ps(scales.scale * x_scale), sum);
    }
  }
  // x's granule sums of a super-block: as stored (16 granules) for q2_K; for q4_K / q5_K summed
  // per 32-value sub-block (granules 2j and 2j + 1), in lanes j and 8 + j.
  using GranuleSums = Vector;
  template <DType kDtype>
  static GranuleSums load_granule_sums(const float* sums) {
    const Vector granules = _mm512_loadu_ps(sums);
    if constexpr (loads_group_super_block_scales(kDtype)) {
      const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
      const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
      return _mm512_add_ps(_mm512_permutexvar_ps(even, granules),
                           _mm512_permutexvar_ps(odd, granules));
    } else {
      return granules;
    }
  }
  template <DType kDtype>
  static Vector add_minimum_terms(const SuperBlockScales& scales, GranuleSums sums, Vector sum) {
    if constexpr (loads_group_super_block_scales(kDtype)) {
      // sum - offsets * sums in this row's 8 lanes.
      return _mm512_mask3_fnmadd_ps(scales.offsets, sums, sum, scales.offset_lanes);
    } else {
      return _mm512_fmadd_ps(scales.offsets, sums, sum);
    }
  }
  struct ActivationBlocks {
    IntegerVector values;
    IntegerVector corrections;
    Vector scales;
  };

  template <DType kDtype, bool kWhole>
  static WeightBlocks load_weight_blocks(const std::byte* block) {
    constexpr int64_t kBlockBytes = dtype_info(kDtype).block_bytes;
    WeightBlocks weights;
    if constexpr (kDtype == DType::kQ4_0) {
      weights.bytes = q4_0_weight_bytes(block, kWhole);
    } else {
      weights.bytes = decoded_weight_bytes<kDtype, kWhole>(block);
    }
    // Every 32-value block starts with its f16 d; q4_1 and q5_1 follow it with their f16 m.
    weights.scales = weight_scales(block, kBlockBytes, kWhole);
    if constexpr (has_weight_minimum(kDtype)) {
      weights.offsets = weight_scales(block + 2, kBlockBytes, kWhole);
    }
    return weights;
  }

  template <DType kDtype>
  static SuperBlockScales load_super_block_scales(const std::byte* block) {
    static_assert(!loads_group_super_block_scales(kDtype));
    SuperBlockScales scales;
    if constexpr (kDtype == DType::kQ6_K) {
      // The 16 signed scales as i16 (the vpdpwssd operand, spread per step by vpermw).
      scales.integer_scales = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + offsetof(BlockQ6_K, scales)))));
      scales.scale = super_block_scale<kDtype>(block);
    } else {
      const SubBlockBytes bytes = sub_block_bytes<kDtype>(block);
      const Vector integers = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes.scales));
      scales.scales = _mm512_mul_ps(integers, _mm512_set1_ps(super_block_scale<kDtype>(block)));
      if constexpr (has_weight_minimum(kDtype)) {
        // q2_K: one minimum per 16-value sub-block, i.e. per granule.
        scales.offsets = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes.minimums)),
                                       _mm512_set1_ps(-super_block_minimum_scale<kDtype>(block)));
      }
    }
    return scales;
  }

  // q4_K and q5_K unpack the scales of all the rows of a group at once
  // (load_group_super_block_scales): per weight row, the ~20 operations of unpacking one row's
  // 12 packed bytes, d and dmin were a third of the operations of a batch-1 super-block.
  static constexpr bool loads_group_super_block_scales(DType dtype) {
    return dtype == DType::kQ4_K || dtype == DType::kQ5_K;
  }

  // The vpermw index of step `step` of row `row`: dword lane i takes, in both 16-bit halves,
  // word 16 (row % 2) + b of the row's widened scales (load_group_super_block_scales), b the
  // lane's sub-block (step_x_blocks(step).lower for lanes 0-7, .upper for 8-15).
  static __m512i step_scale_index(int row, int step) {
    return _mm512_load_si512(kStepScaleIndices.words[row % 2][step]);
  }

  // Per weight row r of the group: its 16-byte header (d, dmin, the 12 packed bytes) in 128-bit
  // chunk r, unpacked there into 8 scale bytes and 8 minimum bytes (ggml's
  // k_quant_scale_and_minimum: from the packed words w0, w1, w2, [scales 0-3, scales 4-7,
  // minimums 0-3, minimums 4-7] = [w0 & 63s, (w2 & 15s) | ((w0 >> 2) & 48s), w1 & 63s,
  // ((w2 >> 4) & 15s) | ((w1 >> 2) & 48s)]). Row r's results depend on chunk r only, so a group
  // of one row computes the same values as the first row of a group of four.
  template <DType kDtype, int kGroup>
  static void load_group_super_block_scales(const std::byte* const (&blocks)[kGroup],
                                            SuperBlockScales (&scales)[kGroup]) {
    static_assert(loads_group_super_block_scales(kDtype) && (kGroup == 1 || kGroup == 4));
    const auto header = [&](int row) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[row]));
    };
    __m512i headers = _mm512_castsi128_si512(header(0));
    if constexpr (kGroup == 4) {
      headers = _mm512_inserti32x4(headers, header(1), 1);
      headers = _mm512_inserti32x4(headers, header(2), 2);
      headers = _mm512_inserti32x4(headers, header(3), 3);
    }
    // Dwords 1-3 of each chunk are w0, w1, w2.
    const __m512i low =
        _mm512_and_si512(_mm512_srlv_epi32(_mm512_shuffle_epi32(headers, _MM_PERM_DCDB),
                                           _mm512_set4_epi32(4, 0, 0, 0)),
                         _mm512_set4_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f));
    const __m512i high = _mm512_srli_epi32(_mm512_shuffle_epi32(headers, _MM_PERM_CCBB), 2);
    // low | (high & mask)
    const __m512i unpacked =
        _mm512_ternarylogic_epi32(low, high, _mm512_set4_epi32(0x30303030, 0, 0x30303030, 0), 0xf8);
    // d and dmin of row r in lanes 2r and 2r + 1.
    const __m512 multipliers =
        _mm512_castps256_ps512(_mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi32(
            _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), headers))));
    // Widened to words (vpermw; vpermb would need AVX-512 VBMI): rows 0 and 1 in the first
    // vector, 2 and 3 in the second, row r's 8 scales from word 16 (r % 2), minimums from 8 more.
    const __m512i words[2] = {_mm512_cvtepu8_epi16(_mm512_castsi512_si256(unpacked)),
                              _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(unpacked, 1))};
    // Per row pair: the 16 minimums (as dwords) times dmin of their row (rounded as ggml's
    // dequantizer rounds dmin * minimum).
    Vector pair_offsets[2];
    for (int pair = 0; pair < (kGroup + 1) / 2; ++pair) {
      const __m512i minimums = _mm512_maskz_permutexvar_epi16(
          0x55555555,
          _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31),
          words[pair]);
      const __m512i dmin_lanes =
          _mm512_add_epi32(_mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3),
                           _mm512_set1_epi32(4 * pair));
      pair_offsets[pair] = _mm512_mul_ps(_mm512_cvtepi32_ps(minimums),
                                         _mm512_permutexvar_ps(dmin_lanes, multipliers));
    }
    for (int row = 0; row < kGroup; ++row) {
      scales[row].integer_scales = words[row / 2];
      scales[row].row = row;
      scales[row].scales = multipliers;
      scales[row].offsets = pair_offsets[row / 2];
      scales[row].offset_lanes = row % 2 == 0 ? 0x00ff : 0xff00;
    }
  }

  // Step kStep covers x-blocks 2 kStep and 2 kStep + 1: lane i (4 values) is in sub-block
  // 4 kStep + i / 4 (16-value sub-blocks) or 2 kStep + i / 8 (32-value ones).
  template <DType kDtype, int kStep>
  static WeightBlocks load_super_block_step(const std::byte* block,
                                            const SuperBlockScales& scales) {
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i sub_block =
        sub_blocks_per_super_block(kDtype) == 16
            ? _mm512_add_epi32(_mm512_srli_epi32(lanes, 2), _mm512_set1_epi32(4 * kStep))
            : _mm512_add_epi32(_mm512_srli_epi32(lanes, 3), _mm512_set1_epi32(2 * kStep));
    WeightBlocks weights;
    weights.bytes = super_block_step_bytes<kDtype, kStep>(block);
    if constexpr (kDtype == DType::kQ6_K) {
      // Lane i: sub-block 4 kStep + i / 4's scale in its low 16 bits, 0 in the high ones.
      const __m512i index =
          _mm512_add_epi32(_mm512_srli_epi32(lanes, 2), _mm512_set1_epi32(4 * kStep));
      weights.integer_scales =
          _mm512_maskz_permutexvar_epi16(0x55555555, index, scales.integer_scales);
    } else if constexpr (loads_group_super_block_scales(kDtype)) {
      weights.integer_scales =
          _mm512_permutexvar_epi16(step_scale_index(scales.row, kStep), scales.integer_scales);
    } else {
      weights.scales = _mm512_permutexvar_ps(sub_block, scales.scales);
    }
    return weights;
  }

  template <DType kDtype>
  static void accumulate_integers(const WeightBlocks& weights, const ActivationBlocks& x,
                                  IntegerVector& sum) {
    if constexpr (kDtype == DType::kQ6_K) {
      // Per lane the exact dot product of the 4 values (u - 32) and x (from x's correction),
      // |dot| <= 4 * 32 * 127 < 2^15: its low 16 bits are it, times the scale in the low half
      // of integer_scales (the high half 0).
      sum = _mm512_dpwssd_epi32(sum, _mm512_dpbusd_epi32(x.corrections, weights.bytes, x.values),
                                weights.integer_scales);
    } else {
      static_assert(kDtype == DType::kQ4_K || kDtype == DType::kQ5_K);
      sum = _mm512_dpwssd_epi32(sum, _mm512_maddubs_epi16(weights.bytes, x.values),
                                weights.integer_scales);
    }
  }

  template <DType kDtype, bool kWhole>
  static ActivationBlocks load_activation_blocks(const int8_t* values, const int32_t* corrections,
                                                 const float* lane_scales) {
    if constexpr (has_granule_minimums(kDtype)) {
      // Their corrections are granule sums, added once per super-block.
      return {_mm512_loadu_si512(values), _mm512_setzero_si512(), _mm512_loadu_ps(lane_scales)};
    } else if constexpr (kWhole) {
      return {_mm512_loadu_si512(values), _mm512_loadu_si512(corrections),
              _mm512_loadu_ps(lane_scales)};
    } else {
      constexpr __mmask16 kFirstBlockLanes = 0x00ff;
      constexpr __mmask64 kFirstBlockBytes = 0xffffffffULL;
      return {_mm512_maskz_loadu_epi8(kFirstBlockBytes, values),
              _mm512_maskz_loadu_epi32(kFirstBlockLanes, corrections),
              _mm512_maskz_loadu_ps(kFirstBlockLanes, lane_scales)};
    }
  }

  // x for step kStep of a super-block whose first value (of this row of x) is at
  // `super_block_values`; corrections and lane_scales point at the step's lanes (natural order).
  template <DType kDtype, int kStep>
  static ActivationBlocks load_super_block_step_activations(const int8_t* super_block_values,
                                                            const int32_t* corrections,
                                                            const float* lane_scales) {
    if constexpr (kDtype == DType::kQ4_K || kDtype == DType::kQ5_K) {
      // Their steps pair x-blocks step_x_blocks(kStep); they use neither corrections nor lane
      // scales per step (granule sums, and one d per super-block).
      constexpr StepXBlocks kBlocks = step_x_blocks(kStep);
      const __m512i values = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(super_block_values + 32 * kBlocks.lower))),
          _mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(super_block_values + 32 * kBlocks.upper)),
          1);
      return {values, _mm512_setzero_si512(), _mm512_setzero_ps()};
    } else {
      return load_activation_blocks<kDtype, true>(super_block_values + 64 * kStep, corrections,
                                                  lane_scales);
    }
  }

  // Starting from the correction removes the offset of the weight bytes (+128, +8, ...)
  // exactly. The dtypes with minimums store no offset (and their corrections are f32 sums).
  template <DType kDtype>
  static IntegerVector block_dot(const WeightBlocks& weights, const ActivationBlocks& activations) {
    if constexpr (has_weight_minimum(kDtype)) {
      return _mm512_dpbusd_epi32(_mm512_setzero_si512(), weights.bytes, activations.values);
    } else {
      return _mm512_dpbusd_epi32(activations.corrections, weights.bytes, activations.values);
    }
  }
  static Vector scaled_sums(const ActivationBlocks& activations) {
    return _mm512_castsi512_ps(activations.corrections);
  }
};

#include "folio/kernels/cpu/matmul_body.inc"

// ---------------------------------------------------------------------------------------------
// Quantizing x

// roundf (half away from zero) of values known to be integral-range floats: truncate, then
// step away from zero where the dropped fraction is at least one half. Exact, unlike adding
// 0.5 (which rounds 0.49999997 up).
inline __m512 round_half_away(__m512 value) {
  const __m512 truncated = _mm512_roundscale_ps(value, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 fraction = _mm512_sub_ps(value, truncated);
  const __m512 half = _mm512_set1_ps(0.5f);
  const __mmask16 up = _mm512_cmp_ps_mask(fraction, half, _CMP_GE_OQ);
  const __mmask16 down =
      _mm512_cmp_ps_mask(fraction, _mm512_sub_ps(_mm512_setzero_ps(), half), _CMP_LE_OQ);
  const __m512 rounded_up = _mm512_mask_add_ps(truncated, up, truncated, _mm512_set1_ps(1.0f));
  return _mm512_mask_sub_ps(rounded_up, down, truncated, _mm512_set1_ps(1.0f));
}

// super_block_max_magnitude in 512-bit registers: the same value (the max of exact magnitudes
// does not depend on the order; NaN where any value is not finite).
float super_block_max_magnitude_avx512(const float* input) {
  const __m512 infinity = _mm512_set1_ps(__builtin_inff());
  __m512 maximum = _mm512_setzero_ps();
  __mmask16 finite = 0xffff;
  for (int64_t i = 0; i < kSuperBlockElements; i += 16) {
    const __m512 magnitude = _mm512_abs_ps(_mm512_loadu_ps(input + i));
    finite &= _mm512_cmp_ps_mask(magnitude, infinity, _CMP_LT_OQ);
    maximum = _mm512_max_ps(maximum, magnitude);
  }
  return finite == 0xffff ? _mm512_reduce_max_ps(maximum) : __builtin_nanf("");
}

// One block, the same bytes as quantize_activation_block (which takes blocks holding inf or
// NaN, and is the reference this is tested against).
void quantize_block(const float* input, int8_t* values, int32_t* corrections, float* lane_scales,
                    LaneTerm term) {
  const __m512 low = _mm512_loadu_ps(input);
  const __m512 high = _mm512_loadu_ps(input + 16);
  const __m512 magnitude = _mm512_max_ps(_mm512_abs_ps(low), _mm512_abs_ps(high));
  const __m512 infinity = _mm512_set1_ps(__builtin_inff());
  if (_mm512_cmp_ps_mask(_mm512_abs_ps(low), infinity, _CMP_LT_OQ) != 0xffff ||
      _mm512_cmp_ps_mask(_mm512_abs_ps(high), infinity, _CMP_LT_OQ) != 0xffff) {
    quantize_activation_block(input, values, corrections, lane_scales, term);
    return;
  }
  const float scale =
      (term.super_block_scale ? term.max_magnitude : _mm512_reduce_max_ps(magnitude)) / 127.0f;
  float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
  if (!(inverse < __builtin_inff())) inverse = 0.0f;
  const __m512 inverse_vector = _mm512_set1_ps(inverse);
  const __m512i low_q = _mm512_cvtps_epi32(round_half_away(_mm512_mul_ps(low, inverse_vector)));
  const __m512i high_q = _mm512_cvtps_epi32(round_half_away(_mm512_mul_ps(high, inverse_vector)));
  const __m256i bytes = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(low_q)),
                                                _mm512_cvtepi32_epi8(high_q), 1);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(values), bytes);
  // Sum of each lane's 4 bytes: a VNNI dot product with ones.
  const __m256i sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), bytes);
  if (term.granule_sums) {
    // Lanes 0-3 and 4-7 summed (exact in i32), each times d.
    const __m256i pairs = _mm256_hadd_epi32(sums, sums);
    const __m256i quads = _mm256_hadd_epi32(pairs, pairs);
    const float granule_sums[2] = {scale * static_cast<float>(_mm256_extract_epi32(quads, 0)),
                                   scale * static_cast<float>(_mm256_extract_epi32(quads, 4))};
    std::memcpy(corrections, granule_sums, sizeof(granule_sums));
  } else if (term.scaled_sums) {
    _mm256_storeu_ps(reinterpret_cast<float*>(corrections),
                     _mm256_mul_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(sums)));
  } else if (term.block_sums) {
    corrections[0] = -term.offset * _mm512_reduce_add_epi32(_mm512_zextsi256_si512(sums));
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(corrections),
                        _mm256_mullo_epi32(sums, _mm256_set1_epi32(-term.offset)));
  }
  _mm256_storeu_ps(lane_scales, _mm256_set1_ps(scale));
}

}  // namespace
}  // namespace folio::kernels::cpu::internal

FOLIO_SIMD_TARGET_END

namespace folio::kernels::cpu::internal {

void float_rows_avx512(const MatmulArguments& arguments, int64_t row_begin, int64_t row_end,
                       float* group_scratch) {
  float_rows_any_dtype(arguments, row_begin, row_end, group_scratch);
}

void quantize_activation_rows_avx512(const MatmulArguments& arguments, std::byte* workspace,
                                     int64_t row_begin, int64_t row_end) {
  quantize_activation_rows(arguments, workspace, row_begin, row_end, quantize_block,
                           super_block_max_magnitude_avx512);
}

void quantized_rows_avx512(const MatmulArguments& arguments,
                           const QuantizedActivations& activations, int64_t row_begin,
                           int64_t row_end) {
  quantized_rows_any_dtype(arguments, activations, row_begin, row_end);
}

}  // namespace folio::kernels::cpu::internal
