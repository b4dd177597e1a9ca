// LoRA: the low-rank update of a projection's output for a batch whose tokens use different
// adapters (BGMV: each token gathers its own adapter's matrices). For token t with adapter slot
// a = token_slots[t]:
//   output[t, :] = base[t, :] + slots[a].scale * B_a (A_a x[t, :])   when slots[a].rank > 0
//   output[t, :] = base[t, :]                                        otherwise (slot 0: none)
// A_a is rank x input_features ("shrink"), B_a is output_features x rank ("expand"). The
// kernel stores B transposed, rank rows of output_features, so the expand is `rank` row
// updates that run along contiguous memory.
//
// Matrices come in two formats: f16 (the hot tier: pool pages) and int8 rows with one f32
// scale per 32 values (the warm tier: a compressed host copy the kernel computes on directly).
// An int8 matrix of R rows of C values is C' = round_up(C, 32) int8 per row, rows contiguous,
// followed by R * C' / 32 f32 scales (row-major); padding values are 0.
//
// token_slots and the slot table are read at run time, through pointers fixed when a graph is
// captured: a replay computes whatever adapters the step's slots name, so adapters load and
// unload without recapture. Every value passed by value is fixed per captured graph.
//
// Determinism: each token's update is computed by one thread in an order that depends only on
// the adapter's shape and the instruction set, never on the other tokens of the batch or the
// thread count (batch invariance).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace folio::kernels {

enum class LoraWeightFormat : uint8_t { kF16, kInt8 };
std::string_view lora_weight_format_name(LoraWeightFormat format);  // "f16", "int8"

// Bytes of one matrix of `rows` rows of `columns` values in `format`.
constexpr int64_t lora_matrix_bytes(LoraWeightFormat format, int64_t rows, int64_t columns) {
  if (format == LoraWeightFormat::kF16) return rows * columns * 2;
  const int64_t padded = (columns + 31) / 32 * 32;
  return rows * padded + rows * (padded / 32) * 4;
}

// One adapter's matrices for one projection.
struct LoraSlotWeights {
  const std::byte* a = nullptr;  // A: rank rows of input_features values, in `format`
  const std::byte* b = nullptr;  // B^T: rank rows of output_features values, in `format`
  int32_t rank = 0;              // 0: no update (no adapter, or it does not target this one)
  float scale = 0.0f;            // user scale * alpha / rank (or the user scale when alpha is 0)
  LoraWeightFormat format = LoraWeightFormat::kF16;
};

struct LoraArguments {
  const float* input = nullptr;            // x: f32 [num_rows, input_features]
  const float* base = nullptr;             // f32 [num_rows, output_features]
  float* output = nullptr;                 // f32 [num_rows, output_features]; may alias base
  const int32_t* token_slots = nullptr;    // i32 [num_rows]: each in [0, num_slots)
  const LoraSlotWeights* slots = nullptr;  // [num_slots]
  int32_t num_slots = 0;
  int32_t max_rank = 0;            // every slot's rank is <= it (sizes the workspace)
  std::byte* workspace = nullptr;  // cpu::lora_workspace_bytes(max_rank, threads) bytes
  int64_t workspace_bytes = 0;
  int64_t num_rows = 0;
  int64_t input_features = 0;
  int64_t output_features = 0;
};

// Writes `rows` rows of `columns` f32 values as one matrix in `format` (lora_matrix_bytes bytes
// at `destination`). f16 rounds to nearest even; int8 takes each block of 32 values (the last
// one zero-padded) to scale = max |value| / 127 and q = round(value / scale), clamped to
// [-127, 127] (scale 0 for a block of zeros).
void write_lora_matrix(LoraWeightFormat format, const float* values, int64_t rows, int64_t columns,
                       std::byte* destination);
// Value (row, column) of a matrix in `format`, as the kernels read it (for references and
// tests).
float read_lora_value(LoraWeightFormat format, const std::byte* matrix, int64_t rows,
                      int64_t columns, int64_t row, int64_t column);

}  // namespace folio::kernels
