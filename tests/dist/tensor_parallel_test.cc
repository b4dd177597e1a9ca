// Tensor parallelism in one process (issue 15, slice 4): a generated model split over two (and
// four) ranks, each rank an executor of its own (its own shard of the weights, its own KV cache
// of its KV heads, its own pool and captured graphs) on a thread of its own, the ranks' partial
// sums added by the all_reduce_sum ops over dist's in-process group. Against one executor of the
// whole model: every logit within 1e-4 of the row's largest logit (the reduction adds partial
// sums in another order than one matmul does: about 5e-7 measured), the same greedy tokens, and
// every rank's logits bit-equal to rank 0's (all_reduce_sum is bit-identical on every member).
// q8_0 quantizes each matmul's activations to int8 per block of 32: an activation that differs
// by an ulp can round to the neighbouring integer, a step of 1/127 of its block's largest value,
// and every later step of that sequence reads KV written after it. So for q8_0 most steps are
// within 1e-4 (about 2e-7), and a step downstream of such a flip within 2e-2.
#include <algorithm>
#include <cmath>
#include <memory>
#include <ostream>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "folio/device/host_virtual_memory.h"
#include "folio/dist/group_step_collectives.h"
#include "folio/dist/in_process_collectives.h"
#include "folio/dist/pipeline_stage.h"
#include "folio/exec/arena_memory.h"
#include "folio/exec/executor.h"
#include "folio/exec/host_buffer.h"
#include "folio/exec/multi_shape_arena.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/kernels/cpu/q8_0_panels.h"
#include "folio/memory/page_pool.h"
#include "folio/model/llama_graph.h"
#include "folio/model/llama_model.h"
#include "folio/model/llama_tensor_shard.h"
#include "testing/pipeline_steps.h"

namespace folio::dist {
namespace {

using Script = testing::PipelineStepScript;
using model::LlamaModel;
using model::LlamaShape;
using model::LlamaTensorSplit;

constexpr int32_t kBlockSize = Script::kBlockSize;
constexpr int32_t kMaxBlocksPerSequence = Script::kMaxBlocksPerSequence;
constexpr int64_t kNumBlocks = Script::kNumBlocks;

// One executor over a KV cache of its own, for the whole model or one tensor-parallel rank.
class Rank {
 public:
  // `collectives` null: the whole model, unsplit.
  Status init(const LlamaShape& shape, const ir::WeightSource& weights,
              const LlamaTensorSplit& split, exec::StepCollectives* collectives,
              exec::ExecutionMode mode) {
    FOLIO_ASSIGN_OR_RETURN(vm_, device::make_host_virtual_memory());
    memory::PagePoolOptions pool_options;
    pool_options.name = fmt::format("tp_rank_{}", split.rank);
    pool_options.page_size = size_t{64} << 10;
    pool_options.num_pages = 512;
    FOLIO_ASSIGN_OR_RETURN(pool_, memory::PagePool::create(*vm_, pool_options));
    threads_ = std::make_unique<ThreadPool>(1);
    const ir::KvCacheGeometry geometry = model::llama_stage_kv_cache_geometry(
        shape, shape.num_layers, kBlockSize, DType::kF32, split);
    kernels::PagedKvLayout layout;
    layout.block_size = kBlockSize;
    layout.num_layers = geometry.num_layers;
    layout.num_kv_heads = geometry.num_kv_heads;
    layout.head_dim = geometry.head_dim;
    layout.dtype = DType::kF32;
    layout.block_bytes = geometry.block_bytes();
    layout.blocks_per_page = static_cast<int32_t>(kNumBlocks);
    layout.page_bytes = layout.block_bytes * kNumBlocks;
    kv_memory_ = exec::HostBuffer(static_cast<size_t>(layout.page_bytes));
    layout.base = kv_memory_.data();
    arena_ = exec::MultiShapeArena::create(std::make_unique<exec::DedicatedArenaMemory>(*vm_));
    model::LlamaGraphOptions graph_options;
    graph_options.tensor_split = split;
    const ir::KvCacheShape kv_cache{geometry, kNumBlocks, kMaxBlocksPerSequence};
    exec::ExecutorOptions options;
    options.name = pool_options.name;
    options.max_sequences = Script::kMaxSequences;
    options.max_logit_rows = 8;
    options.mode = mode;
    options.first_dummy_block = Script::kFirstDummyBlock;
    options.num_dummy_blocks = Script::kNumDummyBlocks;
    options.bucket_ladder = {1, 2, 4, 8, 16, 32};
    options.collectives = collectives;
    const exec::ExecutorResources resources{*threads_, *arena_, *pool_, weights,
                                            exec::KvCacheBinding{layout, kNumBlocks, 0}};
    ir::GraphFactory factory = [shape, kv_cache,
                                graph_options](const ir::StepShape& step) -> Result<ir::Graph> {
      return model::build_llama_step_graph(shape, step, kv_cache, graph_options);
    };
    FOLIO_ASSIGN_OR_RETURN(executor_,
                           exec::Executor::create(std::move(factory), resources, options));
    return Status();
  }

  // Runs `step` and keeps a copy of its logits.
  Status run(const ir::StepBatch& step) {
    FOLIO_ASSIGN_OR_RETURN(const ir::StepOutput output, executor_->execute(step));
    logits_.assign(output.logits.begin(), output.logits.end());
    vocab_ = output.vocab_size;
    return Status();
  }

  const std::vector<float>& logits() const { return logits_; }
  int32_t vocab() const { return vocab_; }
  exec::Executor& executor() { return *executor_; }

 private:
  std::unique_ptr<device::VirtualMemory> vm_;
  std::unique_ptr<memory::PagePool> pool_;
  std::unique_ptr<ThreadPool> threads_;
  exec::HostBuffer kv_memory_;
  std::unique_ptr<exec::MultiShapeArena> arena_;
  std::unique_ptr<exec::Executor> executor_;
  std::vector<float> logits_;
  int32_t vocab_ = 0;
};

Result<gguf::GgufFile> generated_file(const LlamaShape& shape) {
  FOLIO_ASSIGN_OR_RETURN(gguf::GgufWriter writer, model::make_random_llama_writer(shape, 47));
  FOLIO_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, writer.write_to_buffer());
  return gguf::GgufFile::parse_owned(std::move(bytes));
}

// The whole model (packed as the engine loads it) and `num_ranks` ranks over a copy opened
// without packing, each with its shard and its member of an in-process group.
class TensorParallelFixture {
 public:
  Status init(const LlamaShape& shape, int num_ranks, exec::ExecutionMode mode) {
    FOLIO_ASSIGN_OR_RETURN(gguf::GgufFile file, generated_file(shape));
    FOLIO_ASSIGN_OR_RETURN(whole_model_, LlamaModel::from_file(std::move(file)));
    FOLIO_ASSIGN_OR_RETURN(gguf::GgufFile again, generated_file(shape));
    FOLIO_ASSIGN_OR_RETURN(split_model_,
                           LlamaModel::from_file(std::move(again), {.pack_q8_0_panels = false}));
    FOLIO_RETURN_IF_ERROR(
        whole_.init(whole_model_->shape(), whole_model_->weights(), {}, nullptr, mode));
    FOLIO_ASSIGN_OR_RETURN(members_, make_in_process_group(num_ranks, std::chrono::seconds(30)));
    ranks_.resize(static_cast<size_t>(num_ranks));
    for (int r = 0; r < num_ranks; ++r) {
      const LlamaTensorSplit split{r, num_ranks};
      FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<model::LlamaTensorShard> shard,
                             model::LlamaTensorShard::create(split_model_->shape(),
                                                             split_model_->weights(), split, {}));
      step_collectives_.push_back(
          std::make_unique<GroupStepCollectives>(*members_[static_cast<size_t>(r)]));
      ranks_[static_cast<size_t>(r)] = std::make_unique<Rank>();
      FOLIO_RETURN_IF_ERROR(ranks_[static_cast<size_t>(r)]->init(
          shard->shape(), *shard, split, step_collectives_.back().get(), mode));
      shards_.push_back(std::move(shard));
    }
    return Status();
  }

  // Runs `step` on every rank at once (rank r > 0 on a thread of its own) and on the whole
  // model.
  Status run(const ir::StepBatch& step) {
    FOLIO_RETURN_IF_ERROR(whole_.run(step));
    std::vector<Status> statuses(ranks_.size());
    std::vector<std::thread> threads;
    for (size_t r = 1; r < ranks_.size(); ++r) {
      threads.emplace_back([&, r] { statuses[r] = ranks_[r]->run(step); });
    }
    statuses[0] = ranks_[0]->run(step);
    for (std::thread& thread : threads) thread.join();
    for (size_t r = 0; r < ranks_.size(); ++r) {
      if (!statuses[r].ok()) return statuses[r].with_context(fmt::format("rank {}", r));
    }
    return Status();
  }

  Rank& whole() { return whole_; }
  Rank& rank(size_t r) { return *ranks_[r]; }
  size_t num_ranks() const { return ranks_.size(); }
  const model::LlamaTensorShard& shard(size_t r) const { return *shards_[r]; }

 private:
  std::unique_ptr<LlamaModel> whole_model_;
  std::unique_ptr<LlamaModel> split_model_;
  Rank whole_;
  std::vector<std::unique_ptr<Collectives>> members_;
  std::vector<std::unique_ptr<exec::StepCollectives>> step_collectives_;
  std::vector<std::unique_ptr<model::LlamaTensorShard>> shards_;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

// Largest |actual - expected| over a row, divided by the row's largest |expected|.
double worst_relative_difference(const std::vector<float>& actual,
                                 const std::vector<float>& expected, int32_t vocab) {
  double worst = 0;
  for (size_t row = 0; row * static_cast<size_t>(vocab) < expected.size(); ++row) {
    double largest = 0, difference = 0;
    for (int32_t column = 0; column < vocab; ++column) {
      const size_t i = row * static_cast<size_t>(vocab) + static_cast<size_t>(column);
      largest = std::max(largest, std::abs(static_cast<double>(expected[i])));
      difference = std::max(difference, std::abs(static_cast<double>(actual[i]) - expected[i]));
    }
    worst = std::max(worst, difference / std::max(largest, 1e-30));
  }
  return worst;
}

int32_t argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

struct TensorParallelCase {
  const char* name;
  DType dtype;
  model::LlamaArchitecture architecture;
  int num_ranks;
  exec::ExecutionMode mode;
};

void PrintTo(const TensorParallelCase& test, std::ostream* out) {
  *out << test.name;
}

LlamaShape case_shape(const TensorParallelCase& test) {
  LlamaShape shape;
  shape.num_layers = 3;
  shape.weight_dtype = test.dtype;
  shape.architecture = test.architecture;
  if (test.num_ranks == 4) {
    // Four KV heads, and row-split widths of whole q8_0 blocks: 128 / 4 and 256 / 4.
    shape.hidden_size = 128;
    shape.num_heads = 8;
    shape.num_kv_heads = 4;
    shape.ffn_size = 256;
  }
  return shape;
}

class TensorParallelTest : public ::testing::TestWithParam<TensorParallelCase> {};

TEST_P(TensorParallelTest, RanksMatchOneProcess) {
  const TensorParallelCase& test = GetParam();
  const LlamaShape shape = case_shape(test);
  TensorParallelFixture fixture;
  const Status init = fixture.init(shape, test.num_ranks, test.mode);
  ASSERT_TRUE(init.ok()) << init;

  testing::PipelineStepMaker maker(static_cast<int32_t>(shape.vocab_size));
  int32_t rows_compared = 0;
  size_t steps_within_1e4 = 0;
  for (size_t step_index = 0; step_index < Script::steps().size(); ++step_index) {
    const testing::PipelineStepArrays arrays = maker.make(step_index);
    const Status status = fixture.run(arrays.batch());
    ASSERT_TRUE(status.ok()) << "step " << step_index << ": " << status;
    const std::vector<float>& expected = fixture.whole().logits();
    const std::vector<float>& actual = fixture.rank(0).logits();
    ASSERT_EQ(actual.size(), expected.size());
    const int32_t vocab = fixture.whole().vocab();
    const double difference = worst_relative_difference(actual, expected, vocab);
    EXPECT_LE(difference, test.dtype == DType::kQ8_0 ? 2e-2 : 1e-4) << "step " << step_index;
    if (difference <= 1e-4) steps_within_1e4 += 1;
    for (size_t row = 0; row * static_cast<size_t>(vocab) < expected.size(); ++row) {
      const std::span<const float> expected_row(expected.data() + row * vocab,
                                                static_cast<size_t>(vocab));
      const std::span<const float> actual_row(actual.data() + row * vocab,
                                              static_cast<size_t>(vocab));
      EXPECT_EQ(argmax(actual_row), argmax(expected_row)) << "step " << step_index;
      ++rows_compared;
    }
    for (size_t r = 1; r < fixture.num_ranks(); ++r) {
      EXPECT_EQ(fixture.rank(r).logits(), actual) << "rank " << r << ", step " << step_index;
    }
    if (test.mode == exec::ExecutionMode::kGraph) {
      EXPECT_NE(fixture.rank(0).executor().last_step_path(), exec::StepPath::kEager);
      EXPECT_NE(fixture.rank(0).executor().last_step_path(), exec::StepPath::kEagerFallback);
    }
  }
  EXPECT_EQ(rows_compared, Script::kTotalLogitRows);
  // Most steps within 1e-4 also for q8_0 (a rounding flip is rare).
  EXPECT_GE(4 * steps_within_1e4, 3 * Script::steps().size());
}

// Greedy decoding of one sequence, each side feeding back its own argmax: the same tokens.
TEST_P(TensorParallelTest, GreedyTokensEqualOneProcess) {
  const TensorParallelCase& test = GetParam();
  const LlamaShape shape = case_shape(test);
  TensorParallelFixture fixture;
  const Status init = fixture.init(shape, test.num_ranks, test.mode);
  ASSERT_TRUE(init.ok()) << init;
  const auto vocab = static_cast<int32_t>(shape.vocab_size);
  testing::PipelineStepArrays prompt;
  prompt.add_segment(0, 0, 9, 5, vocab);
  ASSERT_TRUE(fixture.run(prompt.batch()).ok());
  int32_t whole_token = argmax(fixture.whole().logits());
  int32_t split_token = argmax(fixture.rank(0).logits());
  std::vector<int32_t> whole_tokens = {whole_token}, split_tokens = {split_token};
  for (int32_t position = 9; position < 2 * kBlockSize; ++position) {
    // Each side's own next token; the batch carries the whole model's, and the ranks' must be
    // the same for the comparison to go on.
    ASSERT_EQ(split_token, whole_token) << "position " << position;
    testing::PipelineStepArrays step;
    step.add_segment(0, position, 1, whole_token, vocab);
    const Status status = fixture.run(step.batch());
    ASSERT_TRUE(status.ok()) << status;
    whole_token = argmax(fixture.whole().logits());
    split_token = argmax(fixture.rank(0).logits());
    whole_tokens.push_back(whole_token);
    split_tokens.push_back(split_token);
  }
  EXPECT_EQ(split_tokens, whole_tokens);
}

std::vector<TensorParallelCase> tensor_parallel_cases() {
  using model::LlamaArchitecture;
  return {
      {"f32_tp2_eager", DType::kF32, LlamaArchitecture::kLlama, 2, exec::ExecutionMode::kEager},
      {"f32_tp2_graph", DType::kF32, LlamaArchitecture::kLlama, 2, exec::ExecutionMode::kGraph},
      {"q8_0_tp2_eager", DType::kQ8_0, LlamaArchitecture::kLlama, 2, exec::ExecutionMode::kEager},
      {"q8_0_tp2_graph", DType::kQ8_0, LlamaArchitecture::kLlama, 2, exec::ExecutionMode::kGraph},
      {"f16_qwen2_tp2_graph", DType::kF16, LlamaArchitecture::kQwen2, 2,
       exec::ExecutionMode::kGraph},
      {"q8_0_tp4_graph", DType::kQ8_0, LlamaArchitecture::kLlama, 4, exec::ExecutionMode::kGraph},
  };
}

INSTANTIATE_TEST_SUITE_P(GeneratedModels, TensorParallelTest,
                         ::testing::ValuesIn(tensor_parallel_cases()),
                         [](const ::testing::TestParamInfo<TensorParallelCase>& info) {
                           return std::string(info.param.name);
                         });

// The shard holds only its slices: rank r's q rows are rows [r * q / n, (r + 1) * q / n) of the
// model's, and its attn_output columns the matching run of every row.
TEST(LlamaTensorShardTest, SlicesAreTheRanksRowsAndColumns) {
  LlamaShape shape;
  Result<gguf::GgufFile> file = generated_file(shape);
  ASSERT_TRUE(file.ok()) << file.status();
  Result<std::unique_ptr<LlamaModel>> model =
      LlamaModel::from_file(std::move(*file), {.pack_q8_0_panels = false});
  ASSERT_TRUE(model.ok()) << model.status();
  for (int64_t rank = 0; rank < 2; ++rank) {
    Result<std::unique_ptr<model::LlamaTensorShard>> shard = model::LlamaTensorShard::create(
        shape, (*model)->weights(), {rank, 2}, {.pack_q8_0_panels = false});
    ASSERT_TRUE(shard.ok()) << shard.status();
    Result<TensorView> full_q = (*model)->weights().find_weight("blk.1.attn_q.weight");
    Result<TensorView> q = (*shard)->find_weight("blk.1.attn_q.weight");
    ASSERT_TRUE(full_q.ok() && q.ok());
    ASSERT_EQ(q->dim(0), shape.q_dim() / 2);
    ASSERT_EQ(q->dim(1), shape.hidden_size);
    for (int64_t row = 0; row < q->dim(0); ++row) {
      EXPECT_EQ(std::memcmp(q->row(row), full_q->row(rank * q->dim(0) + row),
                            static_cast<size_t>(q->row_bytes())),
                0);
    }
    Result<TensorView> full_o = (*model)->weights().find_weight("blk.0.attn_output.weight");
    Result<TensorView> o = (*shard)->find_weight("blk.0.attn_output.weight");
    ASSERT_TRUE(full_o.ok() && o.ok());
    ASSERT_EQ(o->dim(0), shape.hidden_size);
    ASSERT_EQ(o->dim(1), shape.q_dim() / 2);
    for (int64_t row = 0; row < o->dim(0); ++row) {
      EXPECT_EQ(std::memcmp(o->row(row), full_o->row(row) + rank * o->row_bytes(),
                            static_cast<size_t>(o->row_bytes())),
                0);
    }
    // Replicated tensors are the model's own.
    Result<TensorView> norm = (*shard)->find_weight("blk.0.attn_norm.weight");
    Result<TensorView> full_norm = (*model)->weights().find_weight("blk.0.attn_norm.weight");
    ASSERT_TRUE(norm.ok() && full_norm.ok());
    EXPECT_EQ(norm->data(), full_norm->data());
  }
}

// A worker's rank (PipelineStage with a tensor split) refuses, before building anything: no
// group or a group of another rank or size, a layer range that is not the whole model, an
// illegal split, and (where the CPU packs q8_0 panels) a model opened with panels.
TEST(TensorParallelStageTest, RankRefusesAWrongGroupRangeOrModel) {
  LlamaShape shape;
  shape.weight_dtype = DType::kQ8_0;
  Result<gguf::GgufFile> file = generated_file(shape);
  ASSERT_TRUE(file.ok()) << file.status();
  Result<std::unique_ptr<LlamaModel>> model =
      LlamaModel::from_file(std::move(*file), {.pack_q8_0_panels = false});
  ASSERT_TRUE(model.ok()) << model.status();
  PipelineStageSpec spec;
  spec.end_layer = shape.num_layers;
  spec.num_kv_blocks = kNumBlocks;
  spec.block_size = kBlockSize;
  spec.max_blocks_per_sequence = kMaxBlocksPerSequence;
  spec.kv_dtype = DType::kF32;
  spec.first_dummy_block = Script::kFirstDummyBlock;
  spec.num_dummy_blocks = Script::kNumDummyBlocks;
  spec.bucket_ladder = {1, 2, 4};
  spec.max_sequences = Script::kMaxSequences;
  spec.pool_bytes = int64_t{8} << 20;
  spec.tensor_rank = 1;
  spec.tensor_ranks = 2;
  auto group_member = [](int rank, int size) {
    return std::move(
        make_in_process_group(size, std::chrono::seconds(5)).value()[static_cast<size_t>(rank)]);
  };
  const Status none = PipelineStage::create(**model, spec, 1, nullptr).status();
  EXPECT_EQ(none.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.message().find("tensor rank 1 of 2 needs its member of a group of 2, got none"),
            std::string_view::npos)
      << none;
  const Status other = PipelineStage::create(**model, spec, 1, group_member(0, 2)).status();
  EXPECT_NE(other.message().find("got rank 0 of 2"), std::string_view::npos) << other;
  PipelineStageSpec half = spec;
  half.end_layer = 1;
  const Status range = PipelineStage::create(**model, half, 1, group_member(1, 2)).status();
  EXPECT_NE(range.message().find("runs every layer"), std::string_view::npos) << range;
  PipelineStageSpec three = spec;
  three.tensor_ranks = 3;
  EXPECT_EQ(PipelineStage::create(**model, three, 1, group_member(1, 3)).status().code(),
            StatusCode::kInvalidArgument);
  Result<std::unique_ptr<PipelineStage>> rank =
      PipelineStage::create(**model, spec, 1, group_member(1, 2));
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ((*rank)->vocab_size(), shape.vocab_size);
  if (kernels::cpu::q8_0_panels_preferred()) {
    Result<gguf::GgufFile> again = generated_file(shape);
    ASSERT_TRUE(again.ok());
    Result<std::unique_ptr<LlamaModel>> packed = LlamaModel::from_file(std::move(*again));
    ASSERT_TRUE(packed.ok()) << packed.status();
    const Status panels = PipelineStage::create(**packed, spec, 1, group_member(1, 2)).status();
    EXPECT_EQ(panels.code(), StatusCode::kFailedPrecondition) << panels;
    EXPECT_NE(panels.message().find("pack_q8_0_panels = false"), std::string_view::npos) << panels;
  }
}

}  // namespace
}  // namespace folio::dist
