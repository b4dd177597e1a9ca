// AVX2 + FMA + F16C matmul row kernels, compiled with per-function target attributes.
//
// With 16 ymm registers the register tiles are smaller than on AVX-512: f32 / f16 / bf16 use
// 4 weight rows x 2 rows of x (8 accumulators); q8_0 / q4_0 use 2 x 2, since each weight row
// also keeps its bytes and scale in registers. Int8 dot products use maddubs (unsigned x
// signed bytes to 16 bits, pairs summed) then madd with ones (to 32 bits, so each 32-bit lane
// sums 4 products, like VNNI): q8_0 as |w| * (x with w's sign), which stays below the 16-bit
// saturation bound (2 * 128 * 127 < 32767); q4_0 as the stored nibble (value + 8) * x, the
// offset removed by the per-lane correction of QuantizedActivations.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "folio/base/check.h"
#include "folio/kernels/cpu/matmul.h"
#include "folio/kernels/cpu/matmul_kernels.h"
#include "folio/tensor/quantize.h"

// GCC 12 warns inside its own intrinsics (_mm512_undefined_ps and friends) when they are
// inlined into target-attribute functions (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define FOLIO_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace folio::kernels::cpu::internal {
namespace {

constexpr int64_t kBlock = kQuantBlockElements;

FOLIO_AVX2 inline float horizontal_sum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_shuffle_ps(sum, sum, 1));
  return _mm_cvtss_f32(sum);
}

// Calls tile(std::integral_constant<int, height>, first_row) over all rows of x in tiles of
// kTile rows, the last one shorter, so each tile height is its own instantiation.
template <int kTile, typename TileFunction>
FOLIO_AVX2 __attribute__((always_inline)) inline void for_each_tile(int64_t first_row,
                                                                    int64_t end_row,
                                                                    TileFunction&& tile) {
  static_assert(kTile == 2);
  int64_t row = first_row;
  for (; row + 2 <= end_row; row += 2) tile(std::integral_constant<int, 2>(), row);
  if (row < end_row) tile(std::integral_constant<int, 1>(), row);
}

// ---------------------------------------------------------------------------------------------
// f32 / f16 / bf16 weights

template <DType kDtype>
FOLIO_AVX2 inline __m256 load_widened(const std::byte* row, int64_t k) {
  if constexpr (kDtype == DType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  } else {
    const __m128i halves = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row) + k));
    if constexpr (kDtype == DType::kF16) {
      return _mm256_cvtph_ps(halves);
    } else {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
    }
  }
}

template <DType kDtype, int kGroup, int kTileRows>
FOLIO_AVX2 void float_tile(const std::byte* weight, int64_t weight_stride, const float* input,
                           int64_t input_features, const float* bias, float* output,
                           int64_t output_stride, Prefetch prefetch) {
  __m256 sums[kGroup][kTileRows];
  for (int g = 0; g < kGroup; ++g) {
    for (int t = 0; t < kTileRows; ++t) sums[g][t] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < input_features; k += 8) {
    prefetch.step();
    __m256 weights[kGroup];
    for (int g = 0; g < kGroup; ++g)
      weights[g] = load_widened<kDtype>(weight + g * weight_stride, k);
    for (int t = 0; t < kTileRows; ++t) {
      const __m256 x = _mm256_loadu_ps(input + t * input_features + k);
      for (int g = 0; g < kGroup; ++g) sums[g][t] = _mm256_fmadd_ps(weights[g], x, sums[g][t]);
    }
  }
  for (int t = 0; t < kTileRows; ++t) {
    for (int g = 0; g < kGroup; ++g) {
      output[t * output_stride + g] =
          horizontal_sum(sums[g][t]) + (bias != nullptr ? bias[g] : 0.0f);
    }
  }
}

template <DType kDtype, int kGroup>
FOLIO_AVX2 void float_group(const MatmulArguments& arguments, const std::byte* weight,
                            int64_t weight_stride, int64_t column, int64_t first_row,
                            int64_t end_row) {
  const int64_t input_features = arguments.input_features;
  const int64_t output_features = arguments.output_features;
  const float* bias = arguments.bias != nullptr ? arguments.bias + column : nullptr;
  // Only the first tile of x prefetches: the others find the group in cache. f32 weights
  // (and f16 / bf16 groups already widened into the scratch) rely on the hardware prefetcher.
  Prefetch prefetch;
  if constexpr (kDtype != DType::kF32)
    prefetch = Prefetch(weight, kGroup * weight_stride, input_features / 8);
  for_each_tile<2>(first_row, end_row, [&](auto tile_rows, int64_t row) {
    float_tile<kDtype, kGroup, decltype(tile_rows)::value>(
        weight, weight_stride, arguments.input + row * input_features, input_features, bias,
        arguments.output + row * output_features + column, output_features, prefetch);
    prefetch = Prefetch();
  });
}

// One pass: rows [first_row, end_row) of x against the weight groups of [row_begin, row_end).
template <DType kDtype>
FOLIO_AVX2 void float_pass(const MatmulArguments& arguments, int64_t row_begin, int64_t row_end,
                           int64_t first_row, int64_t end_row, float* group_scratch) {
  const int64_t input_features = arguments.input_features;
  const int64_t weight_row_bytes = row_bytes(kDtype, input_features);
  const auto* weight = static_cast<const std::byte*>(arguments.weight);
  const bool convert_groups = kDtype != DType::kF32 && arguments.num_rows >= kConvertedGroupMinRows;
  for (int64_t column = row_begin; column < row_end; column += kGroupRows) {
    const int64_t group_rows = std::min(kGroupRows, row_end - column);
    const std::byte* group = weight + column * weight_row_bytes;
    if (convert_groups) {
      for (int64_t g = 0; g < group_rows; ++g) {
        for (int64_t k = 0; k < input_features; k += 8) {
          _mm256_storeu_ps(group_scratch + g * input_features + k,
                           load_widened<kDtype>(group + g * weight_row_bytes, k));
        }
      }
      const auto* widened = reinterpret_cast<const std::byte*>(group_scratch);
      const int64_t stride = input_features * static_cast<int64_t>(sizeof(float));
      if (group_rows == kGroupRows) {
        float_group<DType::kF32, kGroupRows>(arguments, widened, stride, column, first_row,
                                             end_row);
      } else {
        for (int64_t g = 0; g < group_rows; ++g) {
          float_group<DType::kF32, 1>(arguments, widened + g * stride, stride, column + g,
                                      first_row, end_row);
        }
      }
    } else if (group_rows == kGroupRows) {
      float_group<kDtype, kGroupRows>(arguments, group, weight_row_bytes, column, first_row,
                                      end_row);
    } else {
      for (int64_t g = 0; g < group_rows; ++g) {
        float_group<kDtype, 1>(arguments, group + g * weight_row_bytes, weight_row_bytes,
                               column + g, first_row, end_row);
      }
    }
  }
}

template <DType kDtype>
FOLIO_AVX2 void float_rows(const MatmulArguments& arguments, int64_t row_begin, int64_t row_end,
                           float* group_scratch) {
  const int64_t weight_row_bytes = row_bytes(kDtype, arguments.input_features);
  if constexpr (kDtype != DType::kF32) {
    Prefetch::warm_up(
        static_cast<const std::byte*>(arguments.weight) + row_begin * weight_row_bytes,
        kGroupRows * weight_row_bytes, (row_end - row_begin) * weight_row_bytes);
  }
  const int64_t pass_rows = rows_per_pass(arguments.input_features * 4);
  for (int64_t first_row = 0; first_row < arguments.num_rows; first_row += pass_rows) {
    const int64_t end_row = std::min(arguments.num_rows, first_row + pass_rows);
    float_pass<kDtype>(arguments, row_begin, row_end, first_row, end_row, group_scratch);
  }
}

// ---------------------------------------------------------------------------------------------
// q8_0 / q4_0 weights: one block (32 values) per ymm, 8 lanes of 4 values.

// The weight block's bytes as the unsigned operand of maddubs: |w| for q8_0 (its sign moves
// to x), the stored nibbles for q4_0, in x's element order.
template <DType kDtype>
FOLIO_AVX2 inline __m256i unsigned_weights(const std::byte* block) {
  if constexpr (kDtype == DType::kQ8_0) {
    return _mm256_abs_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2)));
  } else {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
    const __m256i both =
        _mm256_inserti128_si256(_mm256_castsi128_si256(packed), _mm_srli_epi16(packed, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
  }
}

template <DType kDtype, int kGroup, int kTileRows>
FOLIO_AVX2 void quantized_tile(const std::byte* weight, int64_t weight_stride,
                               const QuantizedActivations& activations, int64_t first_row,
                               int64_t input_features, const float* bias, float* output,
                               int64_t output_stride, Prefetch prefetch) {
  constexpr int64_t kBlockBytes = dtype_info(kDtype).block_bytes;
  const int8_t* values = activations.values + first_row * input_features;
  const int32_t* corrections = activations.corrections + first_row * (input_features / 4);
  const float* lane_scales = activations.lane_scales + first_row * (input_features / 4);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 sums[kGroup][kTileRows];
  for (int g = 0; g < kGroup; ++g) {
    for (int t = 0; t < kTileRows; ++t) sums[g][t] = _mm256_setzero_ps();
  }
  for (int64_t block = 0; block < input_features / kBlock; ++block) {
    prefetch.step();
    __m256i weights[kGroup];
    __m256i signs[kGroup];
    __m256 scales[kGroup];
    for (int g = 0; g < kGroup; ++g) {
      const std::byte* block_start = weight + g * weight_stride + block * kBlockBytes;
      uint16_t scale;
      std::memcpy(&scale, block_start, sizeof(scale));
      scales[g] = _mm256_set1_ps(_cvtsh_ss(scale));
      weights[g] = unsigned_weights<kDtype>(block_start);
      if constexpr (kDtype == DType::kQ8_0) {
        signs[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block_start + 2));
      }
    }
    const int64_t element = block * kBlock;
    for (int t = 0; t < kTileRows; ++t) {
      const int64_t lane = (t * input_features + element) / 4;
      const __m256i x = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(values + t * input_features + element));
      const __m256 x_scales = _mm256_loadu_ps(lane_scales + lane);
      for (int g = 0; g < kGroup; ++g) {
        __m256i dot;
        if constexpr (kDtype == DType::kQ8_0) {
          dot = _mm256_madd_epi16(_mm256_maddubs_epi16(weights[g], _mm256_sign_epi8(x, signs[g])),
                                  ones);
        } else {
          const __m256i correction =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corrections + lane));
          dot = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(weights[g], x), ones),
                                 correction);
        }
        sums[g][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(scales[g], x_scales),
                                     sums[g][t]);
      }
    }
  }
  for (int t = 0; t < kTileRows; ++t) {
    for (int g = 0; g < kGroup; ++g) {
      output[t * output_stride + g] =
          horizontal_sum(sums[g][t]) + (bias != nullptr ? bias[g] : 0.0f);
    }
  }
}

template <DType kDtype, int kGroup>
FOLIO_AVX2 void quantized_group(const MatmulArguments& arguments,
                                const QuantizedActivations& activations, const std::byte* weight,
                                int64_t weight_stride, int64_t column, int64_t first_row,
                                int64_t end_row) {
  const int64_t input_features = arguments.input_features;
  const int64_t output_features = arguments.output_features;
  const float* bias = arguments.bias != nullptr ? arguments.bias + column : nullptr;
  Prefetch prefetch(weight, kGroup * weight_stride, input_features / kBlock);
  for_each_tile<2>(first_row, end_row, [&](auto tile_rows, int64_t row) {
    quantized_tile<kDtype, kGroup, decltype(tile_rows)::value>(
        weight, weight_stride, activations, row, input_features, bias,
        arguments.output + row * output_features + column, output_features, prefetch);
    prefetch = Prefetch();
  });
}

template <DType kDtype>
FOLIO_AVX2 void quantized_rows(const MatmulArguments& arguments,
                               const QuantizedActivations& activations, int64_t row_begin,
                               int64_t row_end) {
  constexpr int kPair = 2;  // weight rows per register tile
  const int64_t weight_row_bytes = row_bytes(kDtype, arguments.input_features);
  const auto* weight = static_cast<const std::byte*>(arguments.weight);
  Prefetch::warm_up(weight + row_begin * weight_row_bytes, kGroupRows * weight_row_bytes,
                    (row_end - row_begin) * weight_row_bytes);
  const int64_t pass_rows = rows_per_pass(arguments.input_features * 3);
  for (int64_t first_row = 0; first_row < arguments.num_rows; first_row += pass_rows) {
    const int64_t end_row = std::min(arguments.num_rows, first_row + pass_rows);
    int64_t column = row_begin;
    for (; column + kPair <= row_end; column += kPair) {
      quantized_group<kDtype, kPair>(arguments, activations, weight + column * weight_row_bytes,
                                     weight_row_bytes, column, first_row, end_row);
    }
    if (column < row_end) {
      quantized_group<kDtype, 1>(arguments, activations, weight + column * weight_row_bytes,
                                 weight_row_bytes, column, first_row, end_row);
    }
  }
}

}  // namespace

void float_rows_avx2(const MatmulArguments& arguments, int64_t row_begin, int64_t row_end,
                     float* group_scratch) {
  switch (arguments.weight_dtype) {
    case DType::kF32:
      return float_rows<DType::kF32>(arguments, row_begin, row_end, group_scratch);
    case DType::kF16:
      return float_rows<DType::kF16>(arguments, row_begin, row_end, group_scratch);
    case DType::kBF16:
      return float_rows<DType::kBF16>(arguments, row_begin, row_end, group_scratch);
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kI32:
    case DType::kI8:
      break;
  }
  FOLIO_UNREACHABLE("float_rows_avx2 on {}", dtype_name(arguments.weight_dtype));
}

void quantized_rows_avx2(const MatmulArguments& arguments, const QuantizedActivations& activations,
                         int64_t row_begin, int64_t row_end) {
  switch (arguments.weight_dtype) {
    case DType::kQ8_0:
      return quantized_rows<DType::kQ8_0>(arguments, activations, row_begin, row_end);
    case DType::kQ4_0:
      return quantized_rows<DType::kQ4_0>(arguments, activations, row_begin, row_end);
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kI32:
    case DType::kI8:
      break;
  }
  FOLIO_UNREACHABLE("quantized_rows_avx2 on {}", dtype_name(arguments.weight_dtype));
}

}  // namespace folio::kernels::cpu::internal
