#include "folio/exec/persistent_inputs.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace folio::exec {
namespace {

size_t i32_bytes(int64_t count) {
  return static_cast<size_t>(count) * sizeof(int32_t);
}

void copy_prefix(const PoolSlice& buffer, std::span<const int32_t> values) {
  // An empty span may have a null data(), which memcpy must not be given even for 0 bytes.
  if (values.empty()) return;
  std::memcpy(buffer.data(), values.data(), values.size_bytes());
}

// The buffers in the order they are laid out, with their sizes.
struct BufferSizes {
  std::array<size_t, 12> bytes{};
  size_t total = 0;
  std::array<size_t, 12> offsets{};
};

BufferSizes buffer_sizes(const StepLimits& limits) {
  BufferSizes sizes;
  sizes.bytes = {
      i32_bytes(limits.max_tokens),
      i32_bytes(limits.max_tokens),
      i32_bytes(limits.max_tokens),
      i32_bytes(limits.max_sequences),
      i32_bytes(int64_t{limits.max_sequences} + 1),
      i32_bytes(int64_t{limits.max_sequences} * limits.max_blocks_per_sequence),
      i32_bytes(limits.max_logit_rows),
      i32_bytes(limits.max_tokens),
      i32_bytes(limits.max_logit_rows),
      sizeof(int32_t),
      sizeof(int32_t),
      static_cast<size_t>(int64_t{limits.max_tokens} * limits.hidden_size) * sizeof(float)};
  SliceLayout layout;
  for (size_t i = 0; i < sizes.bytes.size(); ++i) sizes.offsets[i] = layout.add(sizes.bytes[i]);
  sizes.total = layout.total();
  return sizes;
}

}  // namespace

PersistentInputs::PersistentInputs(const StepLimits& limits, memory::PageAllocation memory)
    : limits_(limits), memory_(std::move(memory)) {
  const BufferSizes sizes = buffer_sizes(limits);
  PoolSlice* const buffers[] = {&token_ids_,     &positions_,           &slot_mapping_,
                                &seq_lens_,      &query_start_,         &block_tables_,
                                &logit_indices_, &token_adapter_slots_, &logit_adapter_slots_,
                                &num_sequences_, &num_logit_rows_,      &hidden_};
  for (size_t i = 0; i < sizes.bytes.size(); ++i) {
    *buffers[i] = PoolSlice(memory_.data() + sizes.offsets[i], sizes.bytes[i]);
  }
}

Result<std::unique_ptr<PersistentInputs>> PersistentInputs::create(const StepLimits& limits,
                                                                   memory::PagePool& pool) {
  if (limits.max_tokens <= 0 || limits.max_sequences <= 0 || limits.max_logit_rows <= 0 ||
      limits.max_blocks_per_sequence <= 0 || limits.block_size <= 0) {
    return invalid_argument(
        "persistent inputs need positive limits: max_tokens {}, max_sequences {}, "
        "max_logit_rows {}, max_blocks_per_sequence {}, block_size {}",
        limits.max_tokens, limits.max_sequences, limits.max_logit_rows,
        limits.max_blocks_per_sequence, limits.block_size);
  }
  if (limits.num_dummy_blocks <= 0 || limits.first_dummy_block < 0 ||
      limits.first_dummy_block + limits.num_dummy_blocks > limits.num_kv_blocks) {
    return invalid_argument(
        "the padding blocks [{}, {}) must be a non-empty range inside the KV cache's {} blocks",
        limits.first_dummy_block, limits.first_dummy_block + limits.num_dummy_blocks,
        limits.num_kv_blocks);
  }
  FOLIO_ASSIGN_OR_RETURN(
      memory::PageAllocation memory,
      allocate_step_memory(pool, buffer_sizes(limits).total, memory::ContentType::kTemporary,
                           "the persistent input buffers"));
  return std::unique_ptr<PersistentInputs>(new PersistentInputs(limits, std::move(memory)));
}

void PersistentInputs::write(const ir::StepBatch& step, const ir::StepShape& shape,
                             std::span<const float> hidden) {
  const int32_t tokens = step.num_tokens();
  const int32_t sequences = step.num_sequences();
  const int32_t rows = step.num_logit_rows();
  FOLIO_DCHECK(tokens <= shape.num_tokens && shape.num_tokens <= limits_.max_tokens);
  FOLIO_DCHECK(sequences <= shape.num_sequence_slots &&
               shape.num_sequence_slots <= limits_.max_sequences);
  FOLIO_DCHECK(rows <= shape.num_logit_rows && shape.num_logit_rows <= limits_.max_logit_rows);

  copy_prefix(token_ids_, step.token_ids);
  copy_prefix(positions_, step.positions);
  copy_prefix(slot_mapping_, step.slot_mapping);
  copy_prefix(seq_lens_, step.seq_lens);
  copy_prefix(query_start_, step.query_start);
  copy_prefix(block_tables_, step.block_tables);
  copy_prefix(logit_indices_, step.logit_indices);
  *num_sequences_.as<int32_t>() = sequences;
  *num_logit_rows_.as<int32_t>() = rows;

  // Padding tokens: distinct slots of the dummy blocks (the executor checked at creation that
  // no bucket pads more tokens than the dummy blocks hold).
  const int64_t first_dummy_slot = limits_.first_dummy_block * limits_.block_size;
  const int64_t dummy_slots = int64_t{limits_.num_dummy_blocks} * limits_.block_size;
  int32_t* slots = slot_mapping_.as<int32_t>();
  for (int32_t t = tokens; t < shape.num_tokens; ++t) {
    token_ids_.as<int32_t>()[t] = 0;
    positions_.as<int32_t>()[t] = 0;
    slots[t] = static_cast<int32_t>(first_dummy_slot + (t - tokens) % dummy_slots);
  }
  // Padding sequences: empty, starting where the real tokens end.
  int32_t* starts = query_start_.as<int32_t>();
  int32_t* tables = block_tables_.as<int32_t>();
  const int64_t columns = limits_.max_blocks_per_sequence;
  for (int32_t s = sequences; s < shape.num_sequence_slots; ++s) {
    seq_lens_.as<int32_t>()[s] = 0;
    starts[s + 1] = tokens;
    std::fill(tables + s * columns, tables + (s + 1) * columns,
              static_cast<int32_t>(limits_.first_dummy_block));
  }
  std::fill(logit_indices_.as<int32_t>() + rows,
            logit_indices_.as<int32_t>() + shape.num_logit_rows, 0);
  if (limits_.hidden_size > 0) {
    FOLIO_DCHECK(hidden.size() == static_cast<size_t>(int64_t{tokens} * limits_.hidden_size));
    float* rows_in = hidden_.as<float>();
    if (!hidden.empty()) std::memcpy(rows_in, hidden.data(), hidden.size_bytes());
    std::fill(rows_in + int64_t{tokens} * limits_.hidden_size,
              rows_in + int64_t{shape.num_tokens} * limits_.hidden_size, 0.0f);
  }

  // Each token gets its sequence's adapter slot; padding tokens (and every token of a step
  // without slots) slot 0, no adapter.
  int32_t* token_slots = token_adapter_slots_.as<int32_t>();
  if (step.adapter_slots.empty()) {
    std::fill(token_slots, token_slots + shape.num_tokens, 0);
  } else {
    for (int32_t s = 0; s < sequences; ++s) {
      std::fill(token_slots + step.query_start[s], token_slots + step.query_start[s + 1],
                step.adapter_slots[s]);
    }
    std::fill(token_slots + tokens, token_slots + shape.num_tokens, 0);
  }
  int32_t* logit_slots = logit_adapter_slots_.as<int32_t>();
  for (int32_t j = 0; j < rows; ++j) logit_slots[j] = token_slots[step.logit_indices[j]];
  std::fill(logit_slots + rows, logit_slots + shape.num_logit_rows, 0);
}

Result<std::byte*> PersistentInputs::bind(const ir::TensorInfo& tensor) const {
  if (tensor.name == ir::kInputHidden) {
    const bool fits = limits_.hidden_size > 0 && tensor.dtype == DType::kF32 &&
                      tensor.shape.rank == 2 && tensor.shape[0] <= limits_.max_tokens &&
                      tensor.shape[1] == limits_.hidden_size;
    if (!fits) {
      return invalid_argument(
          "input '{}' is {} {}; the persistent buffer holds f32 rows of exactly {} values, up to "
          "{} rows",
          tensor.name, dtype_name(tensor.dtype), tensor.shape.to_string(), limits_.hidden_size,
          limits_.max_tokens);
    }
    return hidden_.data();
  }
  if (tensor.dtype != DType::kI32) {
    return invalid_argument("input '{}' is {}; persistent inputs are i32", tensor.name,
                            dtype_name(tensor.dtype));
  }
  struct Candidate {
    std::string_view name;
    const PoolSlice* buffer;
    int64_t capacity;  // rows of the first dimension
    int64_t columns;   // 0 for rank 1
  };
  const Candidate candidates[] = {
      {ir::kInputTokenIds, &token_ids_, limits_.max_tokens, 0},
      {ir::kInputPositions, &positions_, limits_.max_tokens, 0},
      {ir::kInputSlotMapping, &slot_mapping_, limits_.max_tokens, 0},
      {ir::kInputSeqLens, &seq_lens_, limits_.max_sequences, 0},
      {ir::kInputQueryStart, &query_start_, int64_t{limits_.max_sequences} + 1, 0},
      {ir::kInputBlockTables, &block_tables_, limits_.max_sequences,
       limits_.max_blocks_per_sequence},
      {ir::kInputLogitIndices, &logit_indices_, limits_.max_logit_rows, 0},
      {ir::kInputTokenAdapterSlots, &token_adapter_slots_, limits_.max_tokens, 0},
      {ir::kInputLogitAdapterSlots, &logit_adapter_slots_, limits_.max_logit_rows, 0},
  };
  for (const Candidate& candidate : candidates) {
    if (tensor.name != candidate.name) continue;
    const int expected_rank = candidate.columns == 0 ? 1 : 2;
    const bool fits = tensor.shape.rank == expected_rank && tensor.shape[0] <= candidate.capacity &&
                      (expected_rank == 1 || tensor.shape[1] == candidate.columns);
    if (!fits) {
      return invalid_argument("input '{}' has shape {}; the persistent buffer holds {} rows{}",
                              tensor.name, tensor.shape.to_string(), candidate.capacity,
                              candidate.columns == 0
                                  ? std::string()
                                  : fmt::format(" of exactly {} columns", candidate.columns));
    }
    return candidate.buffer->data();
  }
  return invalid_argument(
      "input '{}' is not a persistent input; expected one of token_ids, positions, slot_mapping, "
      "seq_lens, query_start, block_tables, logit_indices, token_adapter_slots, "
      "logit_adapter_slots, hidden_in",
      tensor.name);
}

}  // namespace folio::exec
