// ToyStepRunner: a deterministic stand-in for a model that keeps its "KV" in the real paged KV
// cache, for tests of the scheduler and engine and for benchmarks of the engine's own overhead.
//
// It behaves like a causal language model in the one respect scheduling can break: the output
// at a position depends on every earlier token, and reaches them only through the KV cache. For
// each query token at position p it reads the key of position p - 1 from the cache (through the
// block table), computes key(p) = mix(key(p - 1), token) (key(-1) is a root mixed from the model
// seed and the adapter id), and writes {p, key(p)} into the token's K row at its slot. Before
// producing logits for a sequence it reads every position [0, seq_len) back through the block
// table and checks each holds its own position. A logits row is a fixed function of the key of
// the row's token: logits[v] = hash(key, v) scaled into [-4, 4).
//
// So a wrong slot mapping, block table, copy-on-write, swap, prefix-cache hit or recompute
// changes the tokens, or fails the step with kDataLoss naming the position, and the greedy
// output of a sequence is a pure function of its tokens (reference_logits()).
//
// Requires a KV layout whose K row per token (num_kv_heads * head_dim * element bytes) holds at
// least 16 bytes; only layer 0 is used.
// Thread-safety: run() on one thread (the engine's); the reference functions are pure.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "folio/engine/step_runner.h"
#include "folio/kv/kv_types.h"

namespace folio::engine::testing {

class ToyStepRunner final : public StepRunner {
 public:
  // Errors: a layout whose K row cannot hold a record, a vocabulary below 2.
  static Result<std::unique_ptr<ToyStepRunner>> create(const kv::KvLayoutNumbers& layout,
                                                       int32_t vocab_size, uint64_t model_seed = 0,
                                                       int64_t num_adapters = 1);

  Result<ir::StepOutput> run(const ir::StepBatch& step) override;
  int32_t vocab_size() const override { return vocab_size_; }
  // 0 (the default): any number of logits rows; otherwise a step asking for more fails with
  // kInvalidArgument, as the executor's validation would. Set before the engine is created.
  int32_t max_logit_rows() const override { return max_logit_rows_; }
  void set_max_logit_rows(int32_t rows) { max_logit_rows_ = rows; }
  // Adapters 0 .. num_adapters - 1 (0 is the base model).
  bool supports_adapter(int64_t adapter_id) const override {
    return adapter_id >= 0 && adapter_id < num_adapters_;
  }

  // Called with every step before it runs; a non-OK status fails the step with it. For tests
  // that inspect step shapes or inject runner failures.
  void set_step_observer(std::function<Status(const ir::StepBatch&)> observer) {
    observer_ = std::move(observer);
  }
  int64_t num_steps() const { return num_steps_; }

  // The reference model, without any KV cache: the key after `tokens`, and the logits row the
  // runner returns for a sequence whose tokens so far are `tokens`.
  static uint64_t reference_key(uint64_t model_seed, int64_t adapter_id,
                                std::span<const int32_t> tokens);
  static void logits_for_key(uint64_t key, std::span<float> logits);

 private:
  ToyStepRunner(const kv::KvLayoutNumbers& layout, int32_t vocab_size, uint64_t model_seed,
                int64_t num_adapters)
      : layout_(layout),
        vocab_size_(vocab_size),
        model_seed_(model_seed),
        num_adapters_(num_adapters) {}

  struct Record {
    int32_t position;
    int32_t magic;
    uint64_t key;
  };
  std::byte* k_row(int64_t block, int32_t offset) const;
  Status run_segment(const ir::StepBatch& step, int32_t segment);
  Result<uint64_t> read_key(const ir::StepBatch& step, int32_t segment, int32_t position) const;

  kv::KvLayoutNumbers layout_;
  int32_t vocab_size_;
  uint64_t model_seed_;
  int64_t num_adapters_;
  std::function<Status(const ir::StepBatch&)> observer_;
  int64_t num_steps_ = 0;
  int32_t max_logit_rows_ = 0;
  std::vector<uint64_t> token_keys_;  // [num_tokens] of the current step
  std::vector<float> logits_;         // f32 [num_logits, vocab]
};

}  // namespace folio::engine::testing
