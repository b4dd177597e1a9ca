// AVX2 + FMA + F16C matmul row kernels: the tile loops of matmul_body.inc over 8-lane vectors,
// compiled for those extensions only inside this file (#pragma GCC target); called only when
// the active SimdLevel is kAvx2.
//
// With 16 ymm registers the register tiles are smaller than on AVX-512: f32 / f16 / bf16 use
// 4 weight rows x 2 rows of x (8 accumulators); q8_0 / q4_0 use 2 x 2, since each weight row
// also keeps its bytes and scale in registers. One block (32 values) per vector. Int8 dot
// products use maddubs (unsigned x signed bytes to 16 bits, pairs summed) then madd with ones
// (to 32 bits, so each 32-bit lane sums 4 products, like VNNI): q8_0 as |w| * (x with w's
// sign), which stays below the 16-bit saturation bound (2 * 128 * 127 < 32767); q4_0 as the
// stored nibble (value + 8) * x, the offset removed by the per-lane correction of
// QuantizedActivations. The other block types: their decoded unsigned bytes (all below 64) * x
// plus the correction; the iq4 grid values (up to 127 in magnitude) with the sign trick.
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

FOLIO_SIMD_TARGET_BEGIN("avx2,fma,f16c")

namespace folio::kernels::cpu::internal {
namespace {

#include "folio/kernels/cpu/matmul_weight_decode_avx2.inc"
#include "folio/kernels/cpu/simd_avx2.inc"

// The dtypes whose weights maddubs takes as |w| with w's sign moved to x (signed values up to
// 128 in magnitude: as unsigned + 128 they would overflow its 16-bit pair sums).
constexpr bool uses_sign_trick(DType dtype) {
  return dtype == DType::kQ8_0 || dtype == DType::kIQ4_NL || dtype == DType::kIQ4_XS;
}
// The dtypes whose corrections the dot product adds: the unsigned-with-offset ones.
constexpr bool adds_correction(DType dtype) {
  return !uses_sign_trick(dtype) && !has_weight_minimum(dtype) && weight_offset(dtype) != 0;
}

struct Simd : SimdAvx2 {
  static constexpr std::string_view kName = "avx2";
  using IntegerVector = __m256i;
  static constexpr int kFloatTileInputRows = 2;
  static constexpr int kQuantizedTileInputRows = 2;
  static constexpr int kQuantizedTileWeightRows = 2;
  static constexpr bool kQ8_0InPanels = false;
  static constexpr int64_t kBlocksPerVector = 1;
  static constexpr int kStepsPerSuperBlock = 8;

  // bf16 is the upper half of an f32.
  static Vector load_bf16(const uint16_t* pointer) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(pointer));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
  }
  static Vector to_float(IntegerVector value) { return _mm256_cvtepi32_ps(value); }

  struct WeightBlocks {
    // The unsigned operand of maddubs, in x's element order: |w| for q8_0 (its sign moves to
    // x), the stored nibbles (w + 8) for q4_0.
    IntegerVector magnitudes;
    IntegerVector signs;  // uses_sign_trick: the values themselves, for their signs
    Vector scales;
    Vector offsets;  // the dtypes with minimums only
  };
  struct ActivationBlocks {
    IntegerVector values;
    // adds_correction dtypes: the offset corrections; the dtypes with minimums: the f32 scaled
    // lane sums; otherwise unused (the sign trick leaves no offset to remove).
    IntegerVector corrections;
    Vector scales;
  };
  // A super-block's sub-block scales d * scale and offsets: sub-blocks 0-7 and 8-15.
  // (offsets: per 16-value granule, 0-7 and 8-15)
  struct SuperBlockScales {
    Vector scales[2];
    Vector offsets[2];
  };
  struct GranuleSums {
    Vector sums[2];
  };
  template <DType kDtype>
  static GranuleSums load_granule_sums(const float* sums) {
    return {{_mm256_loadu_ps(sums), _mm256_loadu_ps(sums + 8)}};
  }
  template <DType kDtype>
  static Vector add_minimum_terms(const SuperBlockScales& scales, const GranuleSums& x,
                                  Vector sum) {
    return _mm256_fmadd_ps(scales.offsets[1], x.sums[1],
                           _mm256_fmadd_ps(scales.offsets[0], x.sums[0], sum));
  }

  // The unsigned-with-offset bytes of the decoders as maddubs operands.
  template <DType kDtype>
  static void set_weight_bytes(__m256i bytes, WeightBlocks& weights) {
    if constexpr (uses_sign_trick(kDtype)) {
      weights.signs = _mm256_xor_si256(bytes, _mm256_set1_epi8(static_cast<char>(0x80)));
      weights.magnitudes = _mm256_abs_epi8(weights.signs);
    } else {
      weights.magnitudes = bytes;
      weights.signs = _mm256_setzero_si256();
    }
  }

  // The low 8 bytes as f32.
  static Vector widen(__m128i eight_bytes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight_bytes));
  }

  template <DType kDtype>
  static SuperBlockScales load_super_block_scales(const std::byte* block) {
    const SubBlockBytes bytes = sub_block_bytes<kDtype>(block);
    const Vector d = _mm256_set1_ps(super_block_scale<kDtype>(block));
    SuperBlockScales scales;
    scales.scales[0] = _mm256_mul_ps(widen(bytes.scales), d);
    const Vector upper = widen(_mm_srli_si128(bytes.scales, 8));
    if constexpr (sub_blocks_per_super_block(kDtype) == 16) {
      scales.scales[1] = _mm256_mul_ps(upper, d);
      if constexpr (has_weight_minimum(kDtype)) {
        // q2_K: one minimum per 16-value sub-block, i.e. per granule; o = -(dmin * minimum),
        // the product rounded as ggml's dequantizer rounds it.
        const Vector minimum = _mm256_set1_ps(-super_block_minimum_scale<kDtype>(block));
        scales.offsets[0] = _mm256_mul_ps(widen(bytes.minimums), minimum);
        scales.offsets[1] = _mm256_mul_ps(widen(_mm_srli_si128(bytes.minimums, 8)), minimum);
      }
    } else {
      scales.scales[1] = _mm256_setzero_ps();
      if constexpr (has_weight_minimum(kDtype)) {
        // q4_K / q5_K: the 8 minimums follow the 8 scales; granule i is in sub-block i / 2.
        const Vector sub_blocks =
            _mm256_mul_ps(upper, _mm256_set1_ps(-super_block_minimum_scale<kDtype>(block)));
        scales.offsets[0] =
            _mm256_permutevar8x32_ps(sub_blocks, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
        scales.offsets[1] =
            _mm256_permutevar8x32_ps(sub_blocks, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
      }
    }
    return scales;
  }

  // Step kStep is x-block kStep: lane i (4 values) is in sub-block 2 kStep + i / 4 (16-value
  // sub-blocks) or kStep (32-value ones).
  template <DType kDtype, int kStep>
  static WeightBlocks load_super_block_step(const std::byte* block,
                                            const SuperBlockScales& scales) {
    constexpr bool kSixteen = sub_blocks_per_super_block(kDtype) == 16;
    constexpr int kHalf = kSixteen ? kStep / 4 : 0;
    const __m256i sub_block = kSixteen ? _mm256_add_epi32(_mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
                                                          _mm256_set1_epi32(2 * (kStep % 4)))
                                       : _mm256_set1_epi32(kStep);
    WeightBlocks weights;
    set_weight_bytes<kDtype>(weight_block_bytes<kDtype, kStep>(block), weights);
    weights.scales = _mm256_permutevar8x32_ps(scales.scales[kHalf], sub_block);
    return weights;
  }

  template <DType kDtype, bool kWhole>
  static WeightBlocks load_weight_blocks(const std::byte* block) {
    static_assert(kWhole, "one block per vector: a step never holds part of one");
    uint16_t scale;
    std::memcpy(&scale, block, sizeof(scale));
    WeightBlocks weights;
    weights.scales = _mm256_set1_ps(_cvtsh_ss(scale));
    if constexpr (kDtype == DType::kQ8_0) {
      weights.signs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
      weights.magnitudes = _mm256_abs_epi8(weights.signs);
    } else if constexpr (kDtype == DType::kQ4_0) {
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
      const __m256i both =
          _mm256_inserti128_si256(_mm256_castsi128_si256(packed), _mm_srli_epi16(packed, 4), 1);
      weights.magnitudes = _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
      weights.signs = _mm256_setzero_si256();
    } else {
      set_weight_bytes<kDtype>(weight_block_bytes<kDtype, 0>(block), weights);
      if constexpr (has_weight_minimum(kDtype)) {
        // q4_1 and q5_1 follow d with their f16 m.
        weights.offsets = _mm256_set1_ps(load_f16_scalar(block + 2));
      }
    }
    return weights;
  }

  template <DType kDtype, bool kWhole>
  static ActivationBlocks load_activation_blocks(const int8_t* values, const int32_t* corrections,
                                                 const float* lane_scales) {
    static_assert(kWhole, "one block per vector: a step never holds part of one");
    ActivationBlocks activations;
    activations.values = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values));
    activations.corrections =
        adds_correction(kDtype) || (has_weight_minimum(kDtype) && !has_granule_minimums(kDtype))
            ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corrections))
            : _mm256_setzero_si256();
    activations.scales = _mm256_loadu_ps(lane_scales);
    return activations;
  }

  template <DType kDtype>
  static IntegerVector block_dot(const WeightBlocks& weights, const ActivationBlocks& activations) {
    const __m256i ones = _mm256_set1_epi16(1);
    if constexpr (uses_sign_trick(kDtype)) {
      const __m256i signed_x = _mm256_sign_epi8(activations.values, weights.signs);
      return _mm256_madd_epi16(_mm256_maddubs_epi16(weights.magnitudes, signed_x), ones);
    } else {
      // Unsigned weights below 64: pair sums stay under 2 * 63 * 127 < 32767.
      const __m256i products = _mm256_maddubs_epi16(weights.magnitudes, activations.values);
      const __m256i dot = _mm256_madd_epi16(products, ones);
      if constexpr (adds_correction(kDtype)) {
        return _mm256_add_epi32(dot, activations.corrections);
      } else {
        return dot;
      }
    }
  }
  static Vector scaled_sums(const ActivationBlocks& activations) {
    return _mm256_castsi256_ps(activations.corrections);
  }

  template <DType kDtype, int kStep>
  static ActivationBlocks load_super_block_step_activations(const int8_t* super_block_values,
                                                            const int32_t* corrections,
                                                            const float* lane_scales) {
    return load_activation_blocks<kDtype, true>(super_block_values + 32 * kStep, corrections,
                                                lane_scales);
  }

  // Every super-block dtype is summed in f32 per step (matmul_body.inc); summing in integers
  // per super-block is the AVX-512 path's (docs/design/kernels.md lists AVX2's as open).
  static constexpr bool sums_super_blocks_in_integers(DType) { return false; }
  // Every super-block's scales are unpacked per weight row.
  static constexpr bool loads_group_super_block_scales(DType) { return false; }
  template <DType kDtype, int kGroup>
  static void load_group_super_block_scales(const std::byte* const (&)[kGroup],
                                            SuperBlockScales (&)[kGroup]) {}
  static IntegerVector integer_zero() { return _mm256_setzero_si256(); }
  template <DType kDtype>
  static void accumulate_integers(const WeightBlocks&, const ActivationBlocks&, IntegerVector&) {}
  template <DType kDtype>
  static Vector add_integer_sums(const SuperBlockScales&, IntegerVector, float, Vector sum) {
    return sum;
  }
};

#include "folio/kernels/cpu/matmul_body.inc"

}  // namespace
}  // namespace folio::kernels::cpu::internal

FOLIO_SIMD_TARGET_END

namespace folio::kernels::cpu::internal {

void float_rows_avx2(const MatmulArguments& arguments, int64_t row_begin, int64_t row_end,
                     float* group_scratch) {
  float_rows_any_dtype(arguments, row_begin, row_end, group_scratch);
}

void quantized_rows_avx2(const MatmulArguments& arguments, const QuantizedActivations& activations,
                         int64_t row_begin, int64_t row_end) {
  quantized_rows_any_dtype(arguments, activations, row_begin, row_end);
}

}  // namespace folio::kernels::cpu::internal
