#include "exec_test_util.h"

#include <algorithm>
#include <cmath>

#include "folio/tensor/quantize.h"

namespace folio::exec::testing {

std::unique_ptr<RandomWeights> RandomWeights::for_graph(const ir::Graph& graph, uint64_t seed) {
  auto weights = std::make_unique<RandomWeights>();
  std::mt19937_64 random(seed);
  for (const ir::TensorInfo& tensor : graph.tensors()) {
    if (tensor.residency != ir::Residency::kWeight) continue;
    const int64_t columns = tensor.shape.last();
    const int64_t rows = tensor.shape.num_elements() / columns;
    const bool is_norm = tensor.shape.rank == 1 && tensor.name.find("norm") != std::string::npos;
    const bool is_bias = tensor.shape.rank == 1 && !is_norm;
    const double scale = is_norm ? 0.1 : (is_bias ? 0.05 : 1.0 / std::sqrt(double(columns)));
    Entry entry{HostBuffer(static_cast<size_t>(tensor.bytes())), tensor.dtype,
                std::vector<int64_t>(tensor.shape.dims.begin(),
                                     tensor.shape.dims.begin() + tensor.shape.rank)};
    std::vector<float> row(static_cast<size_t>(columns));
    const int64_t stored_row_bytes = row_bytes(tensor.dtype, columns);
    for (int64_t r = 0; r < rows; ++r) {
      for (float& value : row) {
        const double centered = 2.0 * uniform(random) - 1.0;
        value = static_cast<float>((is_norm ? 1.0 : 0.0) + scale * centered);
      }
      quantize_row(tensor.dtype, row.data(), entry.data.data() + r * stored_row_bytes, columns);
    }
    weights->entries_.emplace(tensor.name, std::move(entry));
  }
  return weights;
}

Result<TensorView> RandomWeights::find_weight(std::string_view name) const {
  const auto found = entries_.find(std::string(name));
  if (found == entries_.end()) return not_found("no weight named '{}'", name);
  const Entry& entry = found->second;
  return TensorView::make(entry.data.data(), entry.dtype, entry.shape);
}

std::vector<float> RandomWeights::values(std::string_view name) const {
  const Entry& entry = entries_.at(std::string(name));
  const int64_t columns = entry.shape.back();
  int64_t elements = 1;
  for (int64_t dim : entry.shape) elements *= dim;
  std::vector<float> values(static_cast<size_t>(elements));
  const int64_t stored_row_bytes = row_bytes(entry.dtype, columns);
  for (int64_t r = 0; r < elements / columns; ++r) {
    dequantize_row(entry.dtype, entry.data.data() + r * stored_row_bytes,
                   values.data() + r * columns, columns);
  }
  return values;
}

TestKvCache TestKvCache::create(const TestModelConfig& config) {
  TestKvCache cache;
  kernels::PagedKvLayout& layout = cache.binding.layout;
  layout.block_size = config.block_size;
  layout.num_layers = static_cast<int32_t>(config.model.num_layers);
  layout.num_kv_heads = static_cast<int32_t>(config.model.num_kv_heads);
  layout.head_dim = static_cast<int32_t>(config.model.head_dim());
  layout.dtype = config.kv_dtype;
  layout.block_bytes = kernels::PagedKvLayout::compute_block_bytes(
      layout.num_layers, layout.block_size, layout.num_kv_heads, layout.head_dim, layout.dtype);
  layout.blocks_per_page = static_cast<int32_t>(config.num_blocks);
  layout.page_bytes = layout.block_bytes * config.num_blocks;
  cache.memory = HostBuffer(static_cast<size_t>(layout.page_bytes));
  layout.base = cache.memory.data();
  cache.binding.num_blocks = config.num_blocks;
  return cache;
}

ir::GraphFactory test_model_factory(const TestModelConfig& base) {
  return [base](const ir::StepShape& shape) {
    TestModelConfig config = base;
    config.step = shape;
    return folio::testing::build_llama_test_graph(config);
  };
}

ir::StepBatch OwnedStep::view() const {
  return ir::StepBatch{token_ids,     positions, slot_mapping,
                       query_start,   seq_lens,  block_tables,
                       logit_indices, {},        max_blocks_per_sequence};
}

GeneratorConfig GeneratorConfig::for_model(const TestModelConfig& config, int32_t max_sequences) {
  GeneratorConfig generator;
  generator.num_kv_blocks = config.num_blocks;
  generator.block_size = config.block_size;
  generator.max_blocks_per_sequence = config.max_blocks_per_sequence;
  generator.first_dummy_block = 0;
  generator.num_dummy_blocks = 1;
  generator.vocab = config.model.vocab_size;
  generator.max_sequences = max_sequences;
  return generator;
}

StepGenerator::StepGenerator(const GeneratorConfig& config, uint64_t seed)
    : config_(config), random_(seed) {
  for (int64_t block = 0; block < config.num_kv_blocks; ++block) {
    const bool reserved = block >= config.first_dummy_block &&
                          block < config.first_dummy_block + config.num_dummy_blocks;
    if (!reserved) free_blocks_.push_back(static_cast<int32_t>(block));
  }
  std::shuffle(free_blocks_.begin(), free_blocks_.end(), random_);
}

void StepGenerator::append(Sequence& sequence, int32_t tokens, OwnedStep& step) {
  FOLIO_CHECK(sequence.context + tokens <= capacity(), "sequence would exceed its block table");
  for (int32_t i = 0; i < tokens; ++i) {
    const int32_t position = sequence.context + i;
    if (position / config_.block_size >= static_cast<int32_t>(sequence.blocks.size())) {
      FOLIO_CHECK(!free_blocks_.empty(), "test generator ran out of KV blocks");
      if (!sequence.blocks.empty()) ++blocks_added_mid_sequence_;
      sequence.blocks.push_back(free_blocks_.back());
      free_blocks_.pop_back();
    }
    const int32_t block = sequence.blocks[static_cast<size_t>(position / config_.block_size)];
    step.token_ids.push_back(
        static_cast<int32_t>(random_() % static_cast<uint64_t>(config_.vocab)));
    step.positions.push_back(position);
    step.slot_mapping.push_back(block * config_.block_size + position % config_.block_size);
  }
  sequence.context += tokens;
  step.query_start.push_back(static_cast<int32_t>(step.token_ids.size()));
  step.seq_lens.push_back(sequence.context);
  step.logit_indices.push_back(static_cast<int32_t>(step.token_ids.size()) - 1);
  const size_t row = step.block_tables.size();
  step.block_tables.resize(row + static_cast<size_t>(config_.max_blocks_per_sequence), -1);
  std::copy(sequence.blocks.begin(), sequence.blocks.end(), step.block_tables.begin() + row);
}

OwnedStep StepGenerator::step(int32_t num_decode, std::span<const int32_t> prefill_lengths) {
  OwnedStep step;
  step.max_blocks_per_sequence = config_.max_blocks_per_sequence;
  step.query_start.push_back(0);
  // Sequences with room for one more token, in random order.
  std::vector<size_t> candidates;
  for (size_t s = 0; s < sequences_.size(); ++s) {
    if (sequences_[s].context < capacity()) candidates.push_back(s);
  }
  std::shuffle(candidates.begin(), candidates.end(), random_);
  FOLIO_CHECK(static_cast<size_t>(num_decode) <= candidates.size(), "not enough live sequences");
  for (int32_t i = 0; i < num_decode; ++i) append(sequences_[candidates[size_t(i)]], 1, step);
  for (int32_t length : prefill_lengths) {
    FOLIO_CHECK(static_cast<int32_t>(sequences_.size()) < config_.max_sequences + 64,
                "too many live sequences");
    sequences_.emplace_back();
    append(sequences_.back(), length, step);
  }
  return step;
}

OwnedStep StepGenerator::decode(int32_t batch) {
  int32_t with_room = 0;
  for (const Sequence& sequence : sequences_) with_room += sequence.context < capacity() ? 1 : 0;
  const int32_t decodes = std::min(batch, with_room);
  const std::vector<int32_t> fresh(static_cast<size_t>(batch - decodes), 1);
  return step(decodes, fresh);
}

void StepGenerator::finish(int32_t count) {
  for (int32_t i = 0; i < count && !sequences_.empty(); ++i) {
    const size_t victim = random_() % sequences_.size();
    free_blocks_.insert(free_blocks_.end(), sequences_[victim].blocks.begin(),
                        sequences_[victim].blocks.end());
    sequences_.erase(sequences_.begin() + static_cast<std::ptrdiff_t>(victim));
  }
}

}  // namespace folio::exec::testing

#include "folio/device/host_virtual_memory.h"

namespace folio::exec::testing {

TestModelState TestModelState::create(const TestModelConfig& config, uint64_t weight_seed) {
  TestModelState state;
  state.config = config;
  Result<ir::Graph> graph = folio::testing::build_llama_test_graph(config);
  FOLIO_CHECK(graph.ok(), "test graph: {}", graph.status().to_string());
  state.weights = RandomWeights::for_graph(*graph, weight_seed);
  state.kv = TestKvCache::create(config);
  return state;
}

ExecutorOptions test_options(int32_t max_sequences, ExecutionMode mode) {
  ExecutorOptions options;
  options.max_sequences = max_sequences;
  options.mode = mode;
  options.first_dummy_block = 0;
  options.num_dummy_blocks = 1;
  return options;
}

memory::PagePool& shared_step_pool() {
  static memory::PagePool* const pool = [] {
    Result<std::unique_ptr<device::VirtualMemory>> vm = device::make_host_virtual_memory();
    FOLIO_CHECK(vm.ok(), "host virtual memory: {}", vm.status().to_string());
    memory::PagePoolOptions options;
    options.name = "test_step_memory";
    options.page_size = 4096;
    options.num_pages = 16384;
    Result<std::unique_ptr<memory::PagePool>> created = memory::PagePool::create(**vm, options);
    FOLIO_CHECK(created.ok(), "page pool: {}", created.status().to_string());
    // Leaked on purpose, with its VirtualMemory: executors in static or leaked state of a test
    // binary may still hold pages at exit.
    vm->release();
    return created->release();
  }();
  return *pool;
}

Result<std::unique_ptr<Executor>> make_executor(const TestModelState& model, TestKvCache& kv,
                                                ThreadPool& pool, MultiShapeArena& arena,
                                                ExecutorOptions options) {
  return make_executor(model, kv, pool, arena, shared_step_pool(), std::move(options));
}

Result<std::unique_ptr<Executor>> make_executor(const TestModelState& model, TestKvCache& kv,
                                                ThreadPool& pool, MultiShapeArena& arena,
                                                memory::PagePool& step_pool,
                                                ExecutorOptions options) {
  const ExecutorResources resources{pool, arena, step_pool, *model.weights, kv.binding};
  return Executor::create(test_model_factory(model.config), resources, std::move(options));
}

TestArena TestArena::create(ArenaSharing sharing) {
  TestArena arena;
  Result<std::unique_ptr<device::VirtualMemory>> vm = device::make_host_virtual_memory();
  FOLIO_CHECK(vm.ok(), "host virtual memory: {}", vm.status().to_string());
  arena.vm = std::move(vm).value();
  arena.arena = MultiShapeArena::create(std::make_unique<DedicatedArenaMemory>(*arena.vm), sharing);
  return arena;
}

TestArena TestArena::create_on_pool(int64_t num_pages) {
  TestArena arena;
  Result<std::unique_ptr<device::VirtualMemory>> vm = device::make_host_virtual_memory();
  FOLIO_CHECK(vm.ok(), "host virtual memory: {}", vm.status().to_string());
  arena.vm = std::move(vm).value();
  memory::PagePoolOptions options;
  options.name = "test_graph_arena";
  options.page_size = 4096;
  options.num_pages = num_pages;
  options.thread_cache_pages = 0;
  Result<std::unique_ptr<memory::PagePool>> pool = memory::PagePool::create(*arena.vm, options);
  FOLIO_CHECK(pool.ok(), "page pool: {}", pool.status().to_string());
  arena.pool = std::move(pool).value();
  arena.arena = MultiShapeArena::create(std::make_unique<PoolArenaMemory>(*arena.pool, 1));
  return arena;
}

}  // namespace folio::exec::testing
