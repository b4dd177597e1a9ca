#include "testing/toy_step_runner.h"

#include <cstring>

#include "folio/base/random.h"

namespace folio::engine::testing {

namespace {

constexpr int32_t kRecordMagic = 0x746f7921;  // "toy!"

uint64_t mix(uint64_t key, uint64_t value) {
  return SplitMix64(key ^ (value * 0xd1b54a32d192ed03ULL)).next();
}

}  // namespace

Result<std::unique_ptr<ToyStepRunner>> ToyStepRunner::create(const kv::KvLayoutNumbers& layout,
                                                             int32_t vocab_size,
                                                             uint64_t model_seed,
                                                             int64_t num_adapters) {
  const int64_t row_bytes =
      int64_t{layout.num_kv_heads} * layout.head_dim * (layout.dtype == DType::kF16 ? 2 : 4);
  if (row_bytes < static_cast<int64_t>(sizeof(Record)) || layout.num_layers < 1) {
    return invalid_argument("the toy runner needs a K row of at least {} bytes per token, got {}",
                            sizeof(Record), row_bytes);
  }
  if (vocab_size < 2) return invalid_argument("vocabulary of {} tokens is too small", vocab_size);
  if (num_adapters < 1) return invalid_argument("num_adapters must be at least 1");
  return std::unique_ptr<ToyStepRunner>(
      new ToyStepRunner(layout, vocab_size, model_seed, num_adapters));
}

uint64_t ToyStepRunner::reference_key(uint64_t model_seed, int64_t adapter_id,
                                      std::span<const int32_t> tokens) {
  uint64_t key = mix(model_seed, static_cast<uint64_t>(adapter_id) + 1);
  for (int32_t token : tokens) key = mix(key, static_cast<uint32_t>(token));
  return key;
}

void ToyStepRunner::logits_for_key(uint64_t key, std::span<float> logits) {
  for (size_t token = 0; token < logits.size(); ++token) {
    // 24 bits: exact in f32, so the value is the same on every platform.
    const uint64_t bits = mix(key, token + 0x100000000ULL) >> 40;
    logits[token] = static_cast<float>(bits) * 0x1.0p-24f * 8.0f - 4.0f;
  }
}

std::byte* ToyStepRunner::k_row(int64_t block, int32_t offset) const {
  const int64_t row_bytes =
      int64_t{layout_.num_kv_heads} * layout_.head_dim * (layout_.dtype == DType::kF16 ? 2 : 4);
  // Layer 0, K half: [token_in_block][kv_head][head_dim].
  return layout_.block_pointer(block) + offset * row_bytes;
}

Result<uint64_t> ToyStepRunner::read_key(const ir::StepBatch& step, int32_t segment,
                                         int32_t position) const {
  const int32_t block_size = layout_.block_size;
  const int32_t block =
      step.block_tables[static_cast<size_t>(segment) * step.max_blocks_per_sequence +
                        position / block_size];
  Record record;
  std::memcpy(&record, k_row(block, position % block_size), sizeof(record));
  if (record.magic != kRecordMagic || record.position != position) {
    return data_loss(
        "toy model: sequence {} of the step reads position {} from block {} but finds {} "
        "(position {})",
        segment, position, block, record.magic == kRecordMagic ? "another record" : "no record",
        record.position);
  }
  return record.key;
}

Status ToyStepRunner::run_segment(const ir::StepBatch& step, int32_t segment) {
  const int32_t begin = step.query_start[segment];
  const int32_t end = step.query_start[segment + 1];
  const int32_t seq_len = step.seq_lens[segment];
  const int32_t first_position = seq_len - (end - begin);
  const int32_t block_size = layout_.block_size;
  const int32_t* table =
      step.block_tables.data() + static_cast<size_t>(segment) * step.max_blocks_per_sequence;
  uint64_t key = mix(model_seed_, static_cast<uint64_t>(step.adapter_id(segment)) + 1);
  if (first_position > 0) {
    FOLIO_ASSIGN_OR_RETURN(key, read_key(step, segment, first_position - 1));
  }
  for (int32_t index = begin; index < end; ++index) {
    const int32_t position = first_position + (index - begin);
    const int32_t slot = step.slot_mapping[index];
    if (step.positions[index] != position ||
        slot != table[position / block_size] * block_size + position % block_size) {
      return internal_error("toy model: token {} has position {} and slot {}, expected {} and {}",
                            index, step.positions[index], slot, position,
                            table[position / block_size] * block_size + position % block_size);
    }
    key = mix(key, static_cast<uint32_t>(step.token_ids[index]));
    token_keys_[index] = key;
    const Record record{position, kRecordMagic, key};
    std::memcpy(k_row(slot / block_size, slot % block_size), &record, sizeof(record));
  }
  // "Attention": every position of the context is reached through the block table.
  for (int32_t position = 0; position < seq_len; ++position) {
    FOLIO_RETURN_IF_ERROR(read_key(step, segment, position).status());
  }
  return Status();
}

Result<ir::StepOutput> ToyStepRunner::run(const ir::StepBatch& step) {
  ++num_steps_;
  if (observer_) FOLIO_RETURN_IF_ERROR(observer_(step));
  if (max_logit_rows_ > 0 && step.num_logit_rows() > max_logit_rows_) {
    return invalid_argument("toy model: step asks for {} logits rows, more than its {}",
                            step.num_logit_rows(), max_logit_rows_);
  }
  token_keys_.assign(static_cast<size_t>(step.num_tokens()), 0);
  for (int32_t segment = 0; segment < step.num_sequences(); ++segment) {
    FOLIO_RETURN_IF_ERROR(run_segment(step, segment));
  }
  logits_.resize(step.logit_indices.size() * static_cast<size_t>(vocab_size_));
  for (size_t row = 0; row < step.logit_indices.size(); ++row) {
    logits_for_key(token_keys_[static_cast<size_t>(step.logit_indices[row])],
                   std::span<float>(logits_).subspan(row * static_cast<size_t>(vocab_size_),
                                                     static_cast<size_t>(vocab_size_)));
  }
  return ir::StepOutput{logits_, step.num_logit_rows(), vocab_size_, {}, 0};
}

}  // namespace folio::engine::testing
