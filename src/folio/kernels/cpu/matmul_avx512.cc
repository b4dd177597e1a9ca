// AVX-512 matmul row kernels (F/BW/VL/DQ + VNNI), compiled with per-function target
// attributes so the rest of the binary still runs on any x86-64.
//
// Register tiles: 4 weight rows x 4 rows of x, one 16-lane f32 accumulator per pair (16 of the
// 32 zmm registers). Each accumulator sums its lanes over K in order and is reduced once at the
// end with the same instruction sequence whatever the tile shape, so a result does not depend
// on which tile computed it.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

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

#define FOLIO_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))

namespace folio::kernels::cpu::internal {
namespace {

constexpr int kTile = 4;  // rows of x per register tile
constexpr int64_t kBlock = kQuantBlockElements;

// ---------------------------------------------------------------------------------------------
// f32 / f16 / bf16 weights

// 16 weights from element k of a row, widened to f32 (exactly: f16 and bf16 fit in f32).
template <DType kDtype>
FOLIO_AVX512 inline __m512 load_widened(const std::byte* row, int64_t k) {
  if constexpr (kDtype == DType::kF32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + k);
  } else {
    const __m256i halves = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(row) + k));
    if constexpr (kDtype == DType::kF16) {
      return _mm512_cvtph_ps(halves);
    } else {  // bf16: the upper half of an f32
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
    }
  }
}

// output[t, g] = dot(x[t], W[g]) + bias[g] for a kGroup x kTileRows tile.
template <DType kDtype, int kGroup, int kTileRows>
FOLIO_AVX512 void float_tile(const std::byte* weight, int64_t weight_stride, const float* input,
                             int64_t input_features, const float* bias, float* output,
                             int64_t output_stride, Prefetch prefetch) {
  __m512 sums[kGroup][kTileRows];
  for (int g = 0; g < kGroup; ++g) {
    for (int t = 0; t < kTileRows; ++t) sums[g][t] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < input_features; k += 16) {
    prefetch.step();
    __m512 weights[kGroup];
    for (int g = 0; g < kGroup; ++g)
      weights[g] = load_widened<kDtype>(weight + g * weight_stride, k);
    for (int t = 0; t < kTileRows; ++t) {
      const __m512 x = _mm512_loadu_ps(input + t * input_features + k);
      for (int g = 0; g < kGroup; ++g) sums[g][t] = _mm512_fmadd_ps(weights[g], x, sums[g][t]);
    }
  }
  for (int t = 0; t < kTileRows; ++t) {
    for (int g = 0; g < kGroup; ++g) {
      output[t * output_stride + g] =
          _mm512_reduce_add_ps(sums[g][t]) + (bias != nullptr ? bias[g] : 0.0f);
    }
  }
}

// All rows of x against kGroup weight rows starting at output column `column`.
template <DType kDtype, int kGroup>
FOLIO_AVX512 void float_group(const MatmulArguments& arguments, const std::byte* weight,
                              int64_t weight_stride, int64_t column, int64_t first_row,
                              int64_t end_row) {
  const int64_t input_features = arguments.input_features;
  const int64_t output_features = arguments.output_features;
  const float* bias = arguments.bias != nullptr ? arguments.bias + column : nullptr;
  // Only the first tile of x prefetches: the others find the group in cache. f32 weights
  // (and f16 / bf16 groups already widened into the scratch) rely on the hardware prefetcher.
  Prefetch prefetch;
  if constexpr (kDtype != DType::kF32)
    prefetch = Prefetch(weight, kGroup * weight_stride, input_features / 16);
  int64_t row = first_row;
  for (; row + kTile <= end_row; row += kTile) {
    float_tile<kDtype, kGroup, kTile>(
        weight, weight_stride, arguments.input + row * input_features, input_features, bias,
        arguments.output + row * output_features + column, output_features, prefetch);
    prefetch = {};
  }
  const float* input = arguments.input + row * input_features;
  float* output = arguments.output + row * output_features + column;
  switch (end_row - row) {
    case 3:
      float_tile<kDtype, kGroup, 3>(weight, weight_stride, input, input_features, bias, output,
                                    output_features, prefetch);
      break;
    case 2:
      float_tile<kDtype, kGroup, 2>(weight, weight_stride, input, input_features, bias, output,
                                    output_features, prefetch);
      break;
    case 1:
      float_tile<kDtype, kGroup, 1>(weight, weight_stride, input, input_features, bias, output,
                                    output_features, prefetch);
      break;
    default:
      break;
  }
}

// One pass: rows [first_row, end_row) of x against the weight groups of [row_begin, row_end).
template <DType kDtype>
FOLIO_AVX512 void float_pass(const MatmulArguments& arguments, int64_t row_begin, int64_t row_end,
                             int64_t first_row, int64_t end_row, float* group_scratch) {
  const int64_t input_features = arguments.input_features;
  const int64_t weight_row_bytes = row_bytes(kDtype, input_features);
  const auto* weight = static_cast<const std::byte*>(arguments.weight);
  const bool convert_groups = kDtype != DType::kF32 && arguments.num_rows >= kConvertedGroupMinRows;
  for (int64_t column = row_begin; column < row_end; column += kGroupRows) {
    const int64_t group_rows = std::min(kGroupRows, row_end - column);
    const std::byte* group = weight + column * weight_row_bytes;
    const std::byte* rows = group;
    int64_t stride = weight_row_bytes;
    if (convert_groups) {
      // Widen once per group and pass instead of once per tile of x: the same f32 values.
      for (int64_t g = 0; g < group_rows; ++g) {
        for (int64_t k = 0; k < input_features; k += 16) {
          _mm512_storeu_ps(group_scratch + g * input_features + k,
                           load_widened<kDtype>(group + g * weight_row_bytes, k));
        }
      }
      rows = reinterpret_cast<const std::byte*>(group_scratch);
      stride = input_features * static_cast<int64_t>(sizeof(float));
    }
    if (convert_groups && group_rows == kGroupRows) {
      float_group<DType::kF32, kGroupRows>(arguments, rows, stride, column, first_row, end_row);
    } else if (convert_groups) {
      for (int64_t g = 0; g < group_rows; ++g) {
        float_group<DType::kF32, 1>(arguments, rows + g * stride, stride, column + g, first_row,
                                    end_row);
      }
    } else if (group_rows == kGroupRows) {
      float_group<kDtype, kGroupRows>(arguments, rows, stride, column, first_row, end_row);
    } else {
      for (int64_t g = 0; g < group_rows; ++g) {
        float_group<kDtype, 1>(arguments, rows + g * stride, stride, column + g, first_row,
                               end_row);
      }
    }
  }
}

template <DType kDtype>
FOLIO_AVX512 void float_rows(const MatmulArguments& arguments, int64_t row_begin, int64_t row_end,
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
// q8_0 / q4_0 weights: two blocks (64 values) per zmm; lanes 0-7 hold block 0, 8-15 block 1.

// The two blocks' f16 scales as f32, each repeated over its 8 lanes; `pair` is false when
// only the first block exists (the odd last block of a row), whose upper lanes are then 0.
FOLIO_AVX512 inline __m512 weight_scales(const std::byte* block, int64_t block_bytes, bool pair) {
  uint16_t first;
  uint16_t second = 0;
  std::memcpy(&first, block, sizeof(first));
  if (pair) std::memcpy(&second, block + block_bytes, sizeof(second));
  const __m128 scales = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(first | (second << 16))));
  const __m512i spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(scales));
}

// The 64 weight values of two blocks as unsigned bytes in x's element order: q8_0 values
// offset by +128 (XOR 0x80), q4_0 nibbles as stored (value + 8). Unused upper bytes are 0.
template <DType kDtype>
FOLIO_AVX512 inline __m512i weight_bytes(const std::byte* block, bool pair) {
  if constexpr (kDtype == DType::kQ8_0) {
    constexpr int64_t kBytes = sizeof(BlockQ8_0);
    const __m256i sign = _mm256_set1_epi8(static_cast<char>(0x80));
    const __m256i first =
        _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2)), sign);
    if (!pair) return _mm512_zextsi256_si512(first);
    const __m256i second = _mm256_xor_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kBytes + 2)), sign);
    return _mm512_inserti64x4(_mm512_castsi256_si512(first), second, 1);
  } else {
    constexpr int64_t kBytes = sizeof(BlockQ4_0);
    const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
    if (!pair) {
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
}

// Adds blocks [block, block + 2) (kPair) or just `block` (the odd last one) of the tile into
// sums. The weight side (bytes and scales) is prepared once and used for every row of x.
template <DType kDtype, int kGroup, int kTileRows, bool kPair>
FOLIO_AVX512 __attribute__((always_inline)) inline void quantized_step(
    const std::byte* weight, int64_t weight_stride, const int8_t* values,
    const int32_t* corrections, const float* lane_scales, int64_t input_features, int64_t block,
    __m512 (&sums)[kGroup][kTileRows]) {
  constexpr int64_t kBlockBytes = dtype_info(kDtype).block_bytes;
  constexpr __mmask16 kLanes = kPair ? 0xffff : 0x00ff;
  constexpr __mmask64 kBytes = kPair ? ~__mmask64{0} : 0xffffffffULL;
  __m512i weights[kGroup];
  __m512 scales[kGroup];
  for (int g = 0; g < kGroup; ++g) {
    const std::byte* first = weight + g * weight_stride + block * kBlockBytes;
    weights[g] = weight_bytes<kDtype>(first, kPair);
    scales[g] = weight_scales(first, kBlockBytes, kPair);
  }
  const int64_t element = block * kBlock;
  for (int t = 0; t < kTileRows; ++t) {
    const int64_t lane = (t * input_features + element) / 4;
    __m512i x;
    __m512i correction;
    __m512 x_scales;
    if constexpr (kPair) {
      x = _mm512_loadu_si512(values + t * input_features + element);
      correction = _mm512_loadu_si512(corrections + lane);
      x_scales = _mm512_loadu_ps(lane_scales + lane);
    } else {
      x = _mm512_maskz_loadu_epi8(kBytes, values + t * input_features + element);
      correction = _mm512_maskz_loadu_epi32(kLanes, corrections + lane);
      x_scales = _mm512_maskz_loadu_ps(kLanes, lane_scales + lane);
    }
    for (int g = 0; g < kGroup; ++g) {
      // Starting from the correction removes the +128 / +8 offset of the weight bytes exactly.
      const __m512i dot = _mm512_dpbusd_epi32(correction, weights[g], x);
      sums[g][t] =
          _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scales[g], x_scales), sums[g][t]);
    }
  }
}

template <DType kDtype, int kGroup, int kTileRows>
FOLIO_AVX512 void quantized_tile(const std::byte* weight, int64_t weight_stride,
                                 const QuantizedActivations& activations, int64_t first_row,
                                 int64_t input_features, const float* bias, float* output,
                                 int64_t output_stride, Prefetch prefetch) {
  const int64_t num_blocks = input_features / kBlock;
  const int8_t* values = activations.values + first_row * input_features;
  const int32_t* corrections = activations.corrections + first_row * (input_features / 4);
  const float* lane_scales = activations.lane_scales + first_row * (input_features / 4);
  __m512 sums[kGroup][kTileRows];
  for (int g = 0; g < kGroup; ++g) {
    for (int t = 0; t < kTileRows; ++t) sums[g][t] = _mm512_setzero_ps();
  }
  int64_t block = 0;
  for (; block + 2 <= num_blocks; block += 2) {
    prefetch.step();
    quantized_step<kDtype, kGroup, kTileRows, true>(weight, weight_stride, values, corrections,
                                                    lane_scales, input_features, block, sums);
  }
  if (block < num_blocks) {
    quantized_step<kDtype, kGroup, kTileRows, false>(weight, weight_stride, values, corrections,
                                                     lane_scales, input_features, block, sums);
  }
  for (int t = 0; t < kTileRows; ++t) {
    for (int g = 0; g < kGroup; ++g) {
      output[t * output_stride + g] =
          _mm512_reduce_add_ps(sums[g][t]) + (bias != nullptr ? bias[g] : 0.0f);
    }
  }
}

template <DType kDtype, int kGroup>
FOLIO_AVX512 void quantized_group(const MatmulArguments& arguments,
                                  const QuantizedActivations& activations, const std::byte* weight,
                                  int64_t weight_stride, int64_t column, int64_t first_row,
                                  int64_t end_row) {
  const int64_t input_features = arguments.input_features;
  const int64_t output_features = arguments.output_features;
  const float* bias = arguments.bias != nullptr ? arguments.bias + column : nullptr;
  // Only the first tile of x prefetches: the others find the group in cache.
  Prefetch prefetch(weight, kGroup * weight_stride, (input_features + 63) / 64);
  int64_t row = first_row;
  for (; row + kTile <= end_row; row += kTile) {
    quantized_tile<kDtype, kGroup, kTile>(weight, weight_stride, activations, row, input_features,
                                          bias, arguments.output + row * output_features + column,
                                          output_features, prefetch);
    prefetch = {};
  }
  float* output = arguments.output + row * output_features + column;
  switch (end_row - row) {
    case 3:
      quantized_tile<kDtype, kGroup, 3>(weight, weight_stride, activations, row, input_features,
                                        bias, output, output_features, prefetch);
      break;
    case 2:
      quantized_tile<kDtype, kGroup, 2>(weight, weight_stride, activations, row, input_features,
                                        bias, output, output_features, prefetch);
      break;
    case 1:
      quantized_tile<kDtype, kGroup, 1>(weight, weight_stride, activations, row, input_features,
                                        bias, output, output_features, prefetch);
      break;
    default:
      break;
  }
}

template <DType kDtype>
FOLIO_AVX512 void quantized_rows(const MatmulArguments& arguments,
                                 const QuantizedActivations& activations, int64_t row_begin,
                                 int64_t row_end) {
  const int64_t weight_row_bytes = row_bytes(kDtype, arguments.input_features);
  const auto* weight = static_cast<const std::byte*>(arguments.weight);
  Prefetch::warm_up(weight + row_begin * weight_row_bytes, kGroupRows * weight_row_bytes,
                    (row_end - row_begin) * weight_row_bytes);
  // x takes 3 bytes per value: int8 value, and per 4 values an i32 correction and f32 scale.
  const int64_t pass_rows = rows_per_pass(arguments.input_features * 3);
  for (int64_t first_row = 0; first_row < arguments.num_rows; first_row += pass_rows) {
    const int64_t end_row = std::min(arguments.num_rows, first_row + pass_rows);
    for (int64_t column = row_begin; column < row_end; column += kGroupRows) {
      const int64_t group_rows = std::min(kGroupRows, row_end - column);
      const std::byte* group = weight + column * weight_row_bytes;
      if (group_rows == kGroupRows) {
        quantized_group<kDtype, kGroupRows>(arguments, activations, group, weight_row_bytes, column,
                                            first_row, end_row);
      } else {
        for (int64_t g = 0; g < group_rows; ++g) {
          quantized_group<kDtype, 1>(arguments, activations, group + g * weight_row_bytes,
                                     weight_row_bytes, column + g, first_row, end_row);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Quantizing x

// roundf (half away from zero) of values known to be integral-range floats: truncate, then
// step away from zero where the dropped fraction is at least one half. Exact, unlike adding
// 0.5 (which rounds 0.49999997 up).
FOLIO_AVX512 inline __m512 round_half_away(__m512 value) {
  const __m512 truncated = _mm512_roundscale_ps(value, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 fraction = _mm512_sub_ps(value, truncated);
  const __m512 half = _mm512_set1_ps(0.5f);
  const __mmask16 up = _mm512_cmp_ps_mask(fraction, half, _CMP_GE_OQ);
  const __mmask16 down =
      _mm512_cmp_ps_mask(fraction, _mm512_sub_ps(_mm512_setzero_ps(), half), _CMP_LE_OQ);
  const __m512 rounded_up = _mm512_mask_add_ps(truncated, up, truncated, _mm512_set1_ps(1.0f));
  return _mm512_mask_sub_ps(rounded_up, down, truncated, _mm512_set1_ps(1.0f));
}

// One block, the same bytes as quantize_activation_block (which takes blocks holding inf or
// NaN, and is the reference this is tested against).
FOLIO_AVX512 void quantize_block(const float* input, int8_t* values, int32_t* corrections,
                                 float* lane_scales, int32_t offset) {
  const __m512 low = _mm512_loadu_ps(input);
  const __m512 high = _mm512_loadu_ps(input + 16);
  const __m512 magnitude = _mm512_max_ps(_mm512_abs_ps(low), _mm512_abs_ps(high));
  const __m512 infinity = _mm512_set1_ps(__builtin_inff());
  if (_mm512_cmp_ps_mask(_mm512_abs_ps(low), infinity, _CMP_LT_OQ) != 0xffff ||
      _mm512_cmp_ps_mask(_mm512_abs_ps(high), infinity, _CMP_LT_OQ) != 0xffff) {
    quantize_activation_block(input, values, corrections, lane_scales, offset);
    return;
  }
  const float scale = _mm512_reduce_max_ps(magnitude) / 127.0f;
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
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(corrections),
                      _mm256_mullo_epi32(sums, _mm256_set1_epi32(-offset)));
  _mm256_storeu_ps(lane_scales, _mm256_set1_ps(scale));
}

}  // namespace

void float_rows_avx512(const MatmulArguments& arguments, int64_t row_begin, int64_t row_end,
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
  FOLIO_UNREACHABLE("float_rows_avx512 on {}", dtype_name(arguments.weight_dtype));
}

void quantize_activation_rows_avx512(const MatmulArguments& arguments, std::byte* workspace,
                                     int64_t row_begin, int64_t row_end) {
  const int64_t input_features = arguments.input_features;
  const QuantizedActivationsLayout layout =
      quantized_activations_layout(arguments.num_rows, input_features);
  auto* values = reinterpret_cast<int8_t*>(workspace + layout.values_offset);
  auto* corrections = reinterpret_cast<int32_t*>(workspace + layout.corrections_offset);
  auto* lane_scales = reinterpret_cast<float*>(workspace + layout.lane_scales_offset);
  const int32_t offset = arguments.weight_dtype == DType::kQ8_0 ? 128 : 8;
  for (int64_t element = row_begin * input_features; element < row_end * input_features;
       element += kBlock) {
    quantize_block(arguments.input + element, values + element, corrections + element / 4,
                   lane_scales + element / 4, offset);
  }
}

void quantized_rows_avx512(const MatmulArguments& arguments,
                           const QuantizedActivations& activations, int64_t row_begin,
                           int64_t row_end) {
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
  FOLIO_UNREACHABLE("quantized_rows_avx512 on {}", dtype_name(arguments.weight_dtype));
}

}  // namespace folio::kernels::cpu::internal
