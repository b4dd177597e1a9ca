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
// QuantizedActivations.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "folio/base/check.h"
#include "folio/kernels/cpu/matmul.h"
#include "folio/kernels/cpu/matmul_kernels.h"
#include "folio/kernels/cpu/simd_target.h"
#include "folio/tensor/quantize.h"

// GCC 12 warns inside its own intrinsics (_mm512_undefined_ps and friends) when they are
// inlined into target-specific functions (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

FOLIO_SIMD_TARGET_BEGIN("avx2,fma,f16c")

namespace folio::kernels::cpu::internal {
namespace {

#include "folio/kernels/cpu/simd_avx2.inc"

struct Simd : SimdAvx2 {
  static constexpr std::string_view kName = "avx2";
  using IntegerVector = __m256i;
  static constexpr int kFloatTileInputRows = 2;
  static constexpr int kQuantizedTileInputRows = 2;
  static constexpr int kQuantizedTileWeightRows = 2;
  static constexpr int64_t kBlocksPerVector = 1;

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
    IntegerVector signs;  // q8_0: the values themselves, for their signs; q4_0: unused
    Vector scales;
  };
  struct ActivationBlocks {
    IntegerVector values;
    IntegerVector corrections;  // q4_0 only: q8_0's sign trick leaves no offset to remove
    Vector scales;
  };

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
    } else {
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
      const __m256i both =
          _mm256_inserti128_si256(_mm256_castsi128_si256(packed), _mm_srli_epi16(packed, 4), 1);
      weights.magnitudes = _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
      weights.signs = _mm256_setzero_si256();
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
        kDtype == DType::kQ4_0 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corrections))
                               : _mm256_setzero_si256();
    activations.scales = _mm256_loadu_ps(lane_scales);
    return activations;
  }

  template <DType kDtype>
  static IntegerVector block_dot(const WeightBlocks& weights, const ActivationBlocks& activations) {
    const __m256i ones = _mm256_set1_epi16(1);
    if constexpr (kDtype == DType::kQ8_0) {
      const __m256i signed_x = _mm256_sign_epi8(activations.values, weights.signs);
      return _mm256_madd_epi16(_mm256_maddubs_epi16(weights.magnitudes, signed_x), ones);
    } else {
      const __m256i products = _mm256_maddubs_epi16(weights.magnitudes, activations.values);
      return _mm256_add_epi32(_mm256_madd_epi16(products, ones), activations.corrections);
    }
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
