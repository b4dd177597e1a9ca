// Internal to the CPU matmul: the per-instruction-set row kernels that matmul.cc launches, and
// the layout of x quantized to 8 bits. Not for use outside kernels/cpu.
//
// Every row kernel computes output[m, n] = dot(x[m, :], W[n, :]) (+ bias[n]) for all m in
// [0, M) and n in [row_begin, row_end), in groups of kGroupRows weight rows (each instruction
// set tiles a group and x further by what fits its registers). The accumulation order of each
// output element depends only on K and the instruction set, never on row_begin, row_end, M or the
// tile it falls in: this is what makes results independent of the thread count and of the batch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "folio/kernels/matmul.h"

namespace folio::kernels::cpu::internal {

// Weight rows per work item. row_begin is a multiple of it; only the last group of W may be
// shorter.
inline constexpr int64_t kGroupRows = 4;
// Alignment of each workspace array.
inline constexpr int64_t kWorkspaceAlignment = 64;

constexpr int64_t align_up(int64_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// x quantized per 32-value block: q = round(x / d), d = amax / 127 (kept in f32). Two derived
// arrays serve the SIMD kernels, per group of 4 consecutive values (one 32-bit lane of an
// int8 dot product):
// - corrections: -c * (sum of the group's 4 q), with c = 128 for q8_0 weights (whose int8
//   values the AVX-512 kernel offsets by +128 to make them unsigned) and c = 8 for q4_0 (whose
//   nibbles are stored offset by +8). Starting a lane's integer sum from it removes the offset
//   exactly.
// - lane_scales: the block's d repeated in each of its 8 lanes.
struct QuantizedActivations {
  const int8_t* values = nullptr;        // i8 [num_rows, K]
  const int32_t* corrections = nullptr;  // i32 [num_rows, K / 4]
  const float* lane_scales = nullptr;    // f32 [num_rows, K / 4]
};

// Byte offsets of the three arrays in the workspace, and the total.
struct QuantizedActivationsLayout {
  int64_t values_offset = 0;
  int64_t corrections_offset = 0;
  int64_t lane_scales_offset = 0;
  int64_t total_bytes = 0;
};

constexpr QuantizedActivationsLayout quantized_activations_layout(int64_t num_rows,
                                                                  int64_t input_features) {
  QuantizedActivationsLayout layout;
  const int64_t array_bytes = align_up(num_rows * input_features);  // each array is M * K bytes
  layout.values_offset = 0;
  layout.corrections_offset = array_bytes;
  layout.lane_scales_offset = 2 * array_bytes;
  layout.total_bytes = 3 * array_bytes;
  return layout;
}

// Quantizes rows [row_begin, row_end) of arguments.input into the QuantizedActivations arrays
// laid out in `workspace` (quantized_activations_layout for all num_rows rows). Portable code:
// the same bytes on every instruction set.
void quantize_activation_rows(const MatmulArguments& arguments, std::byte* workspace,
                              int64_t row_begin, int64_t row_end);

// f32 / f16 / bf16 weights. `group_scratch` holds kGroupRows * K floats (f16 / bf16 groups are
// widened into it when num_rows >= kConvertedGroupMinRows) or is unused for f32.
using FloatRowsFunction = void (*)(const MatmulArguments& arguments, int64_t row_begin,
                                   int64_t row_end, float* group_scratch);
// q8_0 / q4_0 weights against x quantized by quantize_activation_rows.
using QuantizedRowsFunction = void (*)(const MatmulArguments& arguments,
                                       const QuantizedActivations& activations, int64_t row_begin,
                                       int64_t row_end);

void float_rows_portable(const MatmulArguments&, int64_t, int64_t, float*);
void float_rows_avx2(const MatmulArguments&, int64_t, int64_t, float*);
void float_rows_avx512(const MatmulArguments&, int64_t, int64_t, float*);
void quantized_rows_portable(const MatmulArguments&, const QuantizedActivations&, int64_t, int64_t);
void quantized_rows_avx2(const MatmulArguments&, const QuantizedActivations&, int64_t, int64_t);
void quantized_rows_avx512(const MatmulArguments&, const QuantizedActivations&, int64_t, int64_t);

}  // namespace folio::kernels::cpu::internal
