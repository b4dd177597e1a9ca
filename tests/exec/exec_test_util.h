// Test support for exec/: random in-memory weights for any step graph, a host KV cache in the
// paged layout, the test model (the model layer's Llama step graph, testing/llama_test_graph.h)
// as an ir::GraphFactory, and a step generator that plays a tiny scheduler (sequences, a free block
// list, block tables) so tests can drive the executor with realistic randomized steps without
// depending on kv/.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "folio/exec/executor.h"
#include "folio/exec/host_buffer.h"
#include "folio/exec/step_limits.h"
#include "folio/exec/tensor_binding.h"
#include "folio/memory/page_pool.h"
#include "testing/llama_test_graph.h"

namespace folio::exec::testing {

// The test model: its shape, a step shape (used where one graph stands for all) and its KV cache.
using TestModelConfig = folio::testing::LlamaTestGraphConfig;

// Weights with deterministic pseudo-random values (f32 drawn, then stored in each tensor's
// dtype). Norm weights (rank 1, name containing "norm") are near 1, biases near 0, matrices
// uniform in +-1/sqrt(columns).
class RandomWeights final : public ir::WeightSource {
 public:
  // Every weight tensor of `graph`.
  static std::unique_ptr<RandomWeights> for_graph(const ir::Graph& graph, uint64_t seed);

  Result<TensorView> find_weight(std::string_view name) const override;
  // The stored values widened back to f32 (what the kernels compute with).
  std::vector<float> values(std::string_view name) const;

 private:
  struct Entry {
    HostBuffer data;
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
  };
  std::unordered_map<std::string, Entry> entries_;
};

// Host memory for the paged KV cache of `config` (one page holding every block).
struct TestKvCache {
  HostBuffer memory;
  KvCacheBinding binding;

  static TestKvCache create(const TestModelConfig& config);
  std::span<const std::byte> bytes() const { return {memory.data(), memory.size()}; }
};

// The test model: `base` with the step shape filled in per bucket.
ir::GraphFactory test_model_factory(const TestModelConfig& base);

// A step's arrays, owned.
struct OwnedStep {
  std::vector<int32_t> token_ids, positions, slot_mapping, query_start, seq_lens, block_tables,
      logit_indices;
  int32_t max_blocks_per_sequence = 0;
  ir::StepBatch view() const;
  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
};

struct GeneratorConfig {
  int64_t num_kv_blocks = 0;
  int32_t block_size = 0;
  int32_t max_blocks_per_sequence = 0;
  int64_t first_dummy_block = 0;
  int32_t num_dummy_blocks = 1;
  int64_t vocab = 0;
  int32_t max_sequences = 0;

  static GeneratorConfig for_model(const TestModelConfig& config, int32_t max_sequences);
};

// Plays the scheduler: live sequences with block tables over a shuffled free list.
class StepGenerator {
 public:
  StepGenerator(const GeneratorConfig& config, uint64_t seed);

  // One step: a decode token for each of `num_decode` random live sequences that have room,
  // then a new sequence per entry of `prefill_lengths` with that many prompt tokens. Logits are
  // asked for the last token of every sequence. Requires: enough blocks and sequence slots.
  OwnedStep step(int32_t num_decode, std::span<const int32_t> prefill_lengths);
  // A decode step of `batch` sequences, starting one-token sequences when fewer are live.
  OwnedStep decode(int32_t batch);
  // Ends `count` random live sequences, returning their blocks.
  void finish(int32_t count);

  int32_t num_live() const { return static_cast<int32_t>(sequences_.size()); }
  // Blocks appended to a sequence that already had some (a new block needed mid-sequence).
  int64_t blocks_added_mid_sequence() const { return blocks_added_mid_sequence_; }
  std::mt19937_64& random() { return random_; }

 private:
  struct Sequence {
    int32_t context = 0;
    std::vector<int32_t> blocks;
  };
  void append(Sequence& sequence, int32_t tokens, OwnedStep& step);
  int32_t capacity() const { return config_.max_blocks_per_sequence * config_.block_size; }

  GeneratorConfig config_;
  std::mt19937_64 random_;
  std::vector<int32_t> free_blocks_;
  std::vector<Sequence> sequences_;
  int64_t blocks_added_mid_sequence_ = 0;
};

// Uniform in [0, 1) from the top 53 bits (the same on every standard library).
inline double uniform(std::mt19937_64& random) {
  return static_cast<double>(random() >> 11) * 0x1.0p-53;
}

}  // namespace folio::exec::testing

namespace folio::exec::testing {

// One model's test fixture pieces: config, weights and a KV cache of its own.
struct TestModelState {
  TestModelConfig config;
  std::unique_ptr<RandomWeights> weights;
  TestKvCache kv;

  // Weights from `weight_seed` (the same seed gives the same weights for the same config).
  static TestModelState create(const TestModelConfig& config, uint64_t weight_seed);
  // A fresh, zeroed KV cache with the same layout (a second executor's).
  TestKvCache fresh_kv() const { return TestKvCache::create(config); }
};

// Options most tests use: the default ladder, `max_sequences` sequences, padding block 0.
ExecutorOptions test_options(int32_t max_sequences, ExecutionMode mode);

// A page pool for the executors' own memory (persistent buffers, eager steps) of tests that do
// not look at it: 4 KiB pages, 64 MiB, alive for the whole process (never destroyed, so no
// executor can outlive it).
memory::PagePool& shared_step_pool();

// An executor on `step_pool` (default: shared_step_pool()).
Result<std::unique_ptr<Executor>> make_executor(const TestModelState& model, TestKvCache& kv,
                                                ThreadPool& pool, MultiShapeArena& arena,
                                                ExecutorOptions options);
Result<std::unique_ptr<Executor>> make_executor(const TestModelState& model, TestKvCache& kv,
                                                ThreadPool& pool, MultiShapeArena& arena,
                                                memory::PagePool& step_pool,
                                                ExecutorOptions options);

// A host VirtualMemory and an arena on dedicated memory or on the pages of a page pool (members
// are destroyed arena first, then pool, then VirtualMemory).
struct TestArena {
  std::unique_ptr<device::VirtualMemory> vm;
  std::unique_ptr<memory::PagePool> pool;
  std::unique_ptr<MultiShapeArena> arena;

  static TestArena create(ArenaSharing sharing = ArenaSharing::kShared);
  // A pool of `num_pages` 4 KiB pages, its graph-arena pages backing the arena.
  static TestArena create_on_pool(int64_t num_pages);
};

}  // namespace folio::exec::testing
