// Internal to the CPU matmul: the per-instruction-set row kernels that matmul.cc launches, and
// the layout of x quantized to 8 bits. Not for use outside kernels/cpu.
//
// Every row kernel computes output[m, n] = dot(x[m, :], W[n, :]) (+ bias[n]) for all m in
// [0, M) and n in [row_begin, row_end), in groups of kGroupRows weight rows (each instruction
// set tiles a group and x further by what fits its registers). The AVX2 and AVX-512 kernels
// share their tile loops (matmul_body.inc); only their `Simd` traits differ. The accumulation
// order of each output element depends only on K and the instruction set, never on row_begin,
// row_end, M or the tile it falls in: this is what makes results independent of the thread
// count and of the batch.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "folio/kernels/matmul.h"
#include "folio/tensor/quantize.h"

namespace folio::kernels::cpu::internal {

// Weight rows per work item. row_begin is a multiple of it; only the last group of W may be
// shorter.
inline constexpr int64_t kGroupRows = 4;
// Alignment of each workspace array.
inline constexpr int64_t kWorkspaceAlignment = 64;

constexpr int64_t align_up(int64_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// Rows of x per pass over a task's weight groups. A group is multiplied by every row of x, so
// the rows of one pass are re-read once per group: they must stay in L2 (2 MiB per core on the
// machines measured; a pass uses at most kPassBytes). Without passes, prefill of 256 rows with
// K = 2048 ran at 40% of the speed of 128 rows. A multiple of 4, the largest tile of x.
inline constexpr int64_t kPassBytes = 768 * 1024;
constexpr int64_t rows_per_pass(int64_t bytes_per_row) {
  return std::max<int64_t>(4, kPassBytes / bytes_per_row / 4 * 4);
}

// Software prefetch of the weights a tile will need next, into L2, a few cache lines per step
// of the tile's K loop. Without it, f16 and q8_0 decode reach only 50-75% of the read bandwidth
// (measured: docs/design/kernels.md): their dot products retire fewer bytes per instruction
// than f32, so the out-of-order window covers too few cache misses and the hardware prefetchers
// alone do not make up for it. f32 weights do not use it: there it costs ~8%.
class Prefetch {
 public:
  // Distance ahead of the current group: two groups, at least 4 KiB (latency x bandwidth of one
  // core is ~1.5 KiB; more hides DRAM page misses too).
  static constexpr int64_t kMinimumDistance = 4096;

  Prefetch() = default;
  // Prefetches the `group_bytes` bytes that start 2 * group_bytes (at least kMinimumDistance)
  // after `group`, spread over `steps` calls of step(). Weights are contiguous rows, so these
  // are the groups this task (or the next one) reads next; a prefetch past the end of the
  // matrix is harmless (prefetches never fault).
  Prefetch(const std::byte* group, int64_t group_bytes, int64_t steps)
      : next_(group + std::max(2 * group_bytes, kMinimumDistance)),
        end_(next_ + group_bytes),
        lines_per_step_((group_bytes / kLineBytes + steps) / std::max<int64_t>(steps, 1)) {}

  // Prefetches the first kMinimumDistance-or-two-groups bytes at `first_group` at once: what
  // the group before it would have prefetched, had this range not started a task.
  static void warm_up(const std::byte* first_group, int64_t group_bytes, int64_t range_bytes) {
    const int64_t bytes = std::min(range_bytes, std::max(2 * group_bytes, kMinimumDistance));
    for (int64_t offset = 0; offset < bytes; offset += kLineBytes) {
      __builtin_prefetch(first_group + offset, /*read*/ 0, /*locality: L2*/ 2);
    }
  }

  __attribute__((always_inline)) void step() {
    for (int64_t line = 0; line < lines_per_step_ && next_ < end_; ++line) {
      __builtin_prefetch(next_, /*read*/ 0, /*locality: L2*/ 2);
      next_ += kLineBytes;
    }
  }

 private:
  static constexpr int64_t kLineBytes = 64;
  const std::byte* next_ = nullptr;
  const std::byte* end_ = nullptr;
  int64_t lines_per_step_ = 0;
};

// x quantized per 32-value block: q = round(x / d), d = amax / 127 (kept in f32), the amax
// that of the block's super-block for has_super_block_activation_scale's weight dtypes. Two derived
// arrays serve the SIMD kernels, per group of 4 consecutive values (one 32-bit lane of an
// int8 dot product):
// - corrections, for weights stored as unsigned integers offset by c (value = s * (u - c)):
//   -c * (sum of the group's 4 q), with c = weight_offset(dtype): 128 for q8_0 (whose int8
//   values the AVX-512 kernel offsets by +128 to make them unsigned), 8 for q4_0 (whose nibbles
//   are stored offset by +8), and so on. Starting a lane's integer sum from it removes the
//   offset exactly.
//   For weights with a minimum (value = s * u + o, has_weight_minimum(dtype)), the lane instead
//   holds the f32 bits of d * (sum of the group's 4 q): the kernels add o * that per lane.
//   For the super-block types with a minimum (q2_K, q4_K, q5_K) the first K / 16 entries of a
//   row's K / 4 hold the f32 d * (sum of the q of 16 consecutive values) instead (the rest of
//   the row's entries unused): their kernels add the minimum terms once per super-block, 16
//   products, rather than once per step.
//   For q8_0 (has_block_corrections) the first K / 32 entries of a row's K / 4 hold one
//   correction per 32-value block instead, -128 * (sum of the block's q) (the rest unused): the
//   AVX-512 panel kernel (matmul_q8_0_avx512.cc) starts each block's integer sum from it, and
//   no other kernel reads q8_0's corrections (AVX2 uses the sign trick, portable signed bytes).
// - lane_scales: the block's d repeated in each of its 8 lanes.
// x's 32-bit lanes (groups of 4 values) per 32-value block: lane_scales has this many entries
// per block.
inline constexpr int64_t kLanesPerActivationBlock = kQuantBlockElements / 4;

struct QuantizedActivations {
  const int8_t* values = nullptr;        // i8 [num_rows, K]
  const int32_t* corrections = nullptr;  // i32 [num_rows, K / 4]
  const float* lane_scales = nullptr;    // f32 [num_rows, K / 4]
};

// The offset c the SIMD kernels remove from a weight dtype's unsigned integers through the
// corrections (0 when they need none). The AVX2 kernels multiply q8_0 and the iq4 grid values
// with the sign trick instead and ignore the corrections of those dtypes.
constexpr int32_t weight_offset(DType dtype) {
  switch (dtype) {
    case DType::kQ8_0:
    case DType::kQ8_0Panels:
    case DType::kIQ4_NL:
    case DType::kIQ4_XS:
      return 128;  // int8 values (grid values) made unsigned by +128
    case DType::kQ4_0:
      return 8;
    case DType::kQ5_0:
      return 16;
    case DType::kQ3_K:
      return 4;
    case DType::kQ6_K:
      return 32;
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kI32:
    case DType::kI8:
    case DType::kQ4_1:
    case DType::kQ5_1:
    case DType::kQ2_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
      return 0;
  }
  return 0;
}

// Whether a weight dtype's values are s * u + o with a per-(sub-)block offset o (ggml's
// minimum): x's corrections then hold d * (lane sum of q) instead (QuantizedActivations).
constexpr bool has_weight_minimum(DType dtype) {
  switch (dtype) {
    case DType::kQ4_1:
    case DType::kQ5_1:
    case DType::kQ2_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
      return true;
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kI32:
    case DType::kI8:
    case DType::kQ8_0Panels:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ5_0:
    case DType::kQ3_K:
    case DType::kQ6_K:
    case DType::kIQ4_NL:
    case DType::kIQ4_XS:
      return false;
  }
  return false;
}

// Whether x's corrections hold one entry per 32-value block for a weight dtype
// (QuantizedActivations): q8_0, whose AVX-512 kernel sums a whole block in one integer lane.
constexpr bool has_block_corrections(DType dtype) {
  return dtype == DType::kQ8_0 || dtype == DType::kQ8_0Panels;
}

// Whether the matmul multiplies a weight dtype through x quantized to int8 (every quantized
// weight dtype; f32 / f16 / bf16 take f32 dot products).
constexpr bool uses_quantized_activations(DType dtype) {
  return dtype_info(dtype).quantized;
}

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

// Whether the matmul adds a dtype's minimum terms per 16-value granule, once per super-block.
constexpr bool has_granule_minimums(DType dtype) {
  return has_weight_minimum(dtype) && dtype_info(dtype).block_elements == kSuperBlockElements;
}

// Whether x is quantized with one d per 256 values (ggml's q8_K) rather than per 32-value block
// for a weight dtype: then every 32-value block of a super-block has the same d, and the
// AVX-512 kernel sums a super-block's integer dot products, times the integer sub-block
// scales, in i32 before one conversion to f32 (a multiply and a conversion per super-block
// instead of per step; the other kernels, which read the d of each block, are unaffected).
// The super-block's amax bounds every value of its blocks, so the int8 values stay in range.
constexpr bool has_super_block_activation_scale(DType dtype) {
  return dtype == DType::kQ4_K || dtype == DType::kQ5_K || dtype == DType::kQ6_K;
}

// What a block quantizer of x writes into the corrections (QuantizedActivations): -offset *
// lane sum (8 entries); with scaled_sums the f32 bits of d * lane sum (8 entries); with
// granule_sums the f32 bits of d * (sum of 16 q) (2 entries); with block_sums -offset * (sum
// of the block's 32 q) (1 entry).
// With super_block_scale, d is max_magnitude / 127 instead of the block's own amax / 127:
// max_magnitude is the amax of the 256 values of the block's super-block, NaN when any of them
// is inf or NaN (so that every block of that super-block gets a NaN d, and a kernel reading
// one d per super-block still propagates the non-finite value).
struct LaneTerm {
  int32_t offset = 0;
  bool scaled_sums = false;
  bool granule_sums = false;
  bool super_block_scale = false;
  bool block_sums = false;
  float max_magnitude = 0.0f;
};
constexpr LaneTerm lane_term(DType weight_dtype) {
  return {.offset = weight_offset(weight_dtype),
          .scaled_sums = has_weight_minimum(weight_dtype) && !has_granule_minimums(weight_dtype),
          .granule_sums = has_granule_minimums(weight_dtype),
          .super_block_scale = has_super_block_activation_scale(weight_dtype),
          .block_sums = has_block_corrections(weight_dtype),
          .max_magnitude = 0.0f};
}

// The max_magnitude of LaneTerm for the 256 values at `input`: their amax, NaN if any is not
// finite. Shared by every instruction set, so that all write the same bytes.
inline float super_block_max_magnitude(const float* input) {
  float max_magnitude = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < kSuperBlockElements; ++i) {
    const float magnitude = input[i] < 0.0f ? -input[i] : input[i];
    finite = finite && magnitude <= std::numeric_limits<float>::max();
    max_magnitude = std::max(max_magnitude, magnitude);
  }
  return finite ? max_magnitude : std::numeric_limits<float>::quiet_NaN();
}

// Quantizes one 32-value block of x: values, its 8 lane corrections (`term`) and lane scales.
// A block holding inf or NaN gets a NaN scale and zero values, so the non-finite value reaches
// the output as NaN instead of vanishing into an int8 (a scaled sum is then NaN too).
void quantize_activation_block(const float* input, int8_t* values, int32_t* corrections,
                               float* lane_scales, LaneTerm term);

// Quantizes rows [row_begin, row_end) of arguments.input into the QuantizedActivations arrays
// laid out in `workspace` (quantized_activations_layout for all num_rows rows), block by block
// with `quantize_block` (quantize_activation_block's signature): the walk every instruction set
// shares, only its block quantizer differing.
template <typename BlockQuantizer, typename SuperBlockMaxMagnitude = float (*)(const float*)>
void quantize_activation_rows(const MatmulArguments& arguments, std::byte* workspace,
                              int64_t row_begin, int64_t row_end, BlockQuantizer quantize_block,
                              SuperBlockMaxMagnitude max_magnitude = super_block_max_magnitude) {
  const int64_t input_features = arguments.input_features;
  const QuantizedActivationsLayout layout =
      quantized_activations_layout(arguments.num_rows, input_features);
  auto* values = reinterpret_cast<int8_t*>(workspace + layout.values_offset);
  auto* corrections = reinterpret_cast<int32_t*>(workspace + layout.corrections_offset);
  auto* lane_scales = reinterpret_cast<float*>(workspace + layout.lane_scales_offset);
  LaneTerm term = lane_term(arguments.weight_dtype);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t row_start = row * input_features;
    for (int64_t k = 0; k < input_features; k += kQuantBlockElements) {
      const int64_t element = row_start + k;
      if (term.super_block_scale && k % kSuperBlockElements == 0) {
        // K is a multiple of 256 for the super-block dtypes.
        term.max_magnitude = max_magnitude(arguments.input + element);
      }
      // Granule and block sums of a row start at the row's first entry.
      int32_t* block_corrections = term.granule_sums ? corrections + row_start / 4 + k / 16
                                   : term.block_sums ? corrections + row_start / 4 + k / 32
                                                     : corrections + element / 4;
      quantize_block(arguments.input + element, values + element, block_corrections,
                     lane_scales + element / 4, term);
    }
  }
}

// quantize_activation_rows with each instruction set's block quantizer. Every instruction set
// writes the same bytes: d = amax / 127 and 1 / d in f32, q = roundf(x / d) (half away from
// zero) is exact arithmetic on each.
void quantize_activation_rows_portable(const MatmulArguments& arguments, std::byte* workspace,
                                       int64_t row_begin, int64_t row_end);
void quantize_activation_rows_avx512(const MatmulArguments& arguments, std::byte* workspace,
                                     int64_t row_begin, int64_t row_end);

// f32 / f16 / bf16 weights. `group_scratch` holds kGroupRows * K floats (f16 / bf16 groups are
// widened into it when num_rows >= kConvertedGroupMinRows) or is unused for f32.
using FloatRowsFunction = void (*)(const MatmulArguments& arguments, int64_t row_begin,
                                   int64_t row_end, float* group_scratch);
// Quantized weights (every quantized dtype) against x quantized by quantize_activation_rows.
using QuantizedRowsFunction = void (*)(const MatmulArguments& arguments,
                                       const QuantizedActivations& activations, int64_t row_begin,
                                       int64_t row_end);

void float_rows_portable(const MatmulArguments&, int64_t, int64_t, float*);
void float_rows_avx2(const MatmulArguments&, int64_t, int64_t, float*);
void float_rows_avx512(const MatmulArguments&, int64_t, int64_t, float*);
void quantized_rows_portable(const MatmulArguments&, const QuantizedActivations&, int64_t, int64_t);

// q8_0 on AVX-512 (matmul_q8_0_avx512.cc): weight rows in panels of kQ8_0PanelColumns, one
// output column per lane; a work item is a panel, panels [panel_begin, panel_end) of W (the
// last may be shorter). `scratch` holds q8_0_panel_scratch_bytes(K) bytes, 64-byte aligned,
// the task's own (a panel transposed for the tiles of x when M exceeds one tile). With
// use_amx (requires cpu_has_amx_int8()), tiles of 16 rows of x go through AMX, with the same
// results.
inline constexpr int64_t kQ8_0PanelColumns = 16;
int64_t q8_0_panel_scratch_bytes(int64_t input_features);
void q8_0_panel_rows_avx512(const MatmulArguments& arguments,
                            const QuantizedActivations& activations, int64_t panel_begin,
                            int64_t panel_end, std::byte* scratch, bool use_amx);
void quantized_rows_avx2(const MatmulArguments&, const QuantizedActivations&, int64_t, int64_t);
void quantized_rows_avx512(const MatmulArguments&, const QuantizedActivations&, int64_t, int64_t);

}  // namespace folio::kernels::cpu::internal
