// Pipeline stages (issue 15, slice 3): a generated model split into contiguous layer ranges, one
// executor per stage, each with a KV cache of its own layers only, chained in one process (the
// residual stream of one stage is the hidden input of the next). The logits must be bit-equal to
// the single executor of the whole model, for f32, f16 and q8_0 weights, eagerly and through
// captured/replayed programs, over mixed prefill/decode steps of two sequences that keep reading
// what earlier steps wrote into each stage's cache.
#include <cstring>
#include <memory>
#include <ostream>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "folio/device/host_virtual_memory.h"
#include "folio/exec/arena_memory.h"
#include "folio/exec/executor.h"
#include "folio/exec/host_buffer.h"
#include "folio/exec/multi_shape_arena.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/memory/page_pool.h"
#include "folio/model/llama_model.h"
#include "testing/pipeline_steps.h"

namespace folio::model {
namespace {

using Script = testing::PipelineStepScript;
constexpr int32_t kBlockSize = Script::kBlockSize;
constexpr int32_t kMaxBlocksPerSequence = Script::kMaxBlocksPerSequence;
constexpr int64_t kNumBlocks = Script::kNumBlocks;
constexpr int64_t kFirstDummyBlock = Script::kFirstDummyBlock;
constexpr int64_t kNumLayers = 4;

// One executor over layers [first, end) of a model and a KV cache of those layers only.
class Stage {
 public:
  // `whole`: the default graph options (the single-process graph), not an explicit stage.
  Status init(const LlamaModel& model, int64_t first, int64_t end, bool whole,
              exec::ExecutionMode mode, memory::PagePool& page_pool, device::VirtualMemory& vm,
              ThreadPool& threads) {
    const LlamaShape& shape = model.shape();
    kernels::PagedKvLayout layout;
    layout.block_size = kBlockSize;
    layout.num_layers = static_cast<int32_t>(end - first);
    layout.num_kv_heads = static_cast<int32_t>(shape.num_kv_heads);
    layout.head_dim = static_cast<int32_t>(shape.head_dim());
    layout.dtype = DType::kF32;
    layout.block_bytes = kernels::PagedKvLayout::compute_block_bytes(
        layout.num_layers, layout.block_size, layout.num_kv_heads, layout.head_dim, layout.dtype);
    layout.blocks_per_page = static_cast<int32_t>(kNumBlocks);
    layout.page_bytes = layout.block_bytes * kNumBlocks;
    kv_memory_ = exec::HostBuffer(static_cast<size_t>(layout.page_bytes));
    layout.base = kv_memory_.data();
    arena_ = exec::MultiShapeArena::create(std::make_unique<exec::DedicatedArenaMemory>(vm));

    LlamaGraphOptions graph_options;
    if (!whole) {
      graph_options.first_layer = first;
      graph_options.end_layer = end;
    }
    const ir::KvCacheShape kv_cache{
        llama_stage_kv_cache_geometry(shape, end - first, kBlockSize, DType::kF32), kNumBlocks,
        kMaxBlocksPerSequence};
    exec::ExecutorOptions options;
    options.name = fmt::format("stage_{}_{}", first, end);
    options.max_sequences = Script::kMaxSequences;
    options.max_logit_rows = 8;
    options.mode = mode;
    options.first_dummy_block = kFirstDummyBlock;
    options.num_dummy_blocks = Script::kNumDummyBlocks;
    options.bucket_ladder = {1, 2, 4, 8, 16, 32};
    const exec::ExecutorResources resources{
        threads, *arena_, page_pool, model.weights(),
        exec::KvCacheBinding{layout, kNumBlocks, static_cast<int32_t>(first)}};
    FOLIO_ASSIGN_OR_RETURN(
        executor_,
        exec::Executor::create(model.graph_factory(kv_cache, graph_options), resources, options));
    return Status();
  }

  exec::Executor& executor() { return *executor_; }

 private:
  exec::HostBuffer kv_memory_;
  std::unique_ptr<exec::MultiShapeArena> arena_;
  std::unique_ptr<exec::Executor> executor_;
};

struct PipelineCase {
  const char* name;
  DType dtype;
  std::vector<int64_t> cuts;  // stage boundaries after layer 0: {2} is PP=2 over [0,2), [2,4)
  exec::ExecutionMode mode;
};

// gtest prints the case by its name (its bytes otherwise).
void PrintTo(const PipelineCase& test, std::ostream* out) {
  *out << test.name;
}

class LlamaPipelineTest : public ::testing::TestWithParam<PipelineCase> {};

TEST_P(LlamaPipelineTest, ChainedStagesGiveBitEqualLogits) {
  const PipelineCase& test = GetParam();
  LlamaShape shape;
  shape.num_layers = kNumLayers;
  shape.weight_dtype = test.dtype;
  Result<gguf::GgufWriter> writer = make_random_llama_writer(shape, 31);
  ASSERT_TRUE(writer.ok()) << writer.status();
  Result<std::vector<uint8_t>> bytes = writer->write_to_buffer();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  Result<gguf::GgufFile> file = gguf::GgufFile::parse_owned(std::move(*bytes));
  ASSERT_TRUE(file.ok()) << file.status();
  Result<std::unique_ptr<LlamaModel>> model = LlamaModel::from_file(std::move(*file));
  ASSERT_TRUE(model.ok()) << model.status();

  Result<std::unique_ptr<device::VirtualMemory>> vm = device::make_host_virtual_memory();
  ASSERT_TRUE(vm.ok()) << vm.status();
  memory::PagePoolOptions pool_options;
  pool_options.name = "pipeline_test";
  pool_options.page_size = size_t{64} << 10;
  pool_options.num_pages = 1024;
  Result<std::unique_ptr<memory::PagePool>> page_pool =
      memory::PagePool::create(**vm, pool_options);
  ASSERT_TRUE(page_pool.ok()) << page_pool.status();
  ThreadPool threads(2);

  Stage whole;
  ASSERT_TRUE(whole.init(**model, 0, kNumLayers, true, test.mode, **page_pool, **vm, threads).ok());
  std::vector<int64_t> bounds = {0};
  bounds.insert(bounds.end(), test.cuts.begin(), test.cuts.end());
  bounds.push_back(kNumLayers);
  std::vector<std::unique_ptr<Stage>> stages;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    stages.push_back(std::make_unique<Stage>());
    const Status status = stages.back()->init(**model, bounds[s], bounds[s + 1], false, test.mode,
                                              **page_pool, **vm, threads);
    ASSERT_TRUE(status.ok()) << status;
  }
  EXPECT_EQ(stages.front()->executor().hidden_input_size(), 0);
  EXPECT_EQ(stages.back()->executor().hidden_output_size(), 0);

  testing::PipelineStepMaker maker(static_cast<int32_t>(shape.vocab_size));
  int32_t rows_compared = 0;
  for (size_t step_index = 0; step_index < Script::steps().size(); ++step_index) {
    const testing::PipelineStepArrays arrays = maker.make(step_index);
    const ir::StepBatch step = arrays.batch();
    Result<ir::StepOutput> expected = whole.executor().execute(step);
    ASSERT_TRUE(expected.ok()) << expected.status();
    // The wire between stages: a copy of each stage's residual stream.
    std::vector<float> hidden;
    ir::StepOutput actual;
    for (size_t s = 0; s < stages.size(); ++s) {
      Result<ir::StepOutput> output = stages[s]->executor().execute(step, hidden);
      ASSERT_TRUE(output.ok()) << "stage " << s << ": " << output.status();
      if (s + 1 < stages.size()) {
        ASSERT_TRUE(output->logits.empty());
        ASSERT_EQ(output->hidden_size, shape.hidden_size);
        ASSERT_EQ(output->hidden.size(),
                  static_cast<size_t>(step.num_tokens() * shape.hidden_size));
        hidden.assign(output->hidden.begin(), output->hidden.end());
      } else {
        actual = *output;
      }
    }
    ASSERT_EQ(actual.num_rows, expected->num_rows);
    ASSERT_EQ(actual.vocab_size, expected->vocab_size);
    ASSERT_EQ(actual.logits.size(), expected->logits.size());
    EXPECT_EQ(
        std::memcmp(actual.logits.data(), expected->logits.data(), expected->logits.size_bytes()),
        0)
        << "step " << step_index << ": logits differ (first " << actual.logits[0] << " vs "
        << expected->logits[0] << ")";
    rows_compared += actual.num_rows;
    if (test.mode == exec::ExecutionMode::kGraph) {
      for (const std::unique_ptr<Stage>& stage : stages) {
        EXPECT_NE(stage->executor().last_step_path(), exec::StepPath::kEager);
        EXPECT_NE(stage->executor().last_step_path(), exec::StepPath::kEagerFallback);
      }
    }
  }
  EXPECT_EQ(rows_compared, Script::kTotalLogitRows);
  if (test.mode == exec::ExecutionMode::kGraph) {
    // Repeated buckets were replayed, not captured again.
    EXPECT_GT(stages.back()->executor().stats().hits, 0);
  }
}

// A stage that reads the residual stream refuses a step without it (and a first stage one with
// it), before anything runs.
TEST(LlamaPipelineStageTest, HiddenInputMustMatchTheStage) {
  LlamaShape shape;
  shape.num_layers = kNumLayers;
  Result<gguf::GgufWriter> writer = make_random_llama_writer(shape, 31);
  ASSERT_TRUE(writer.ok()) << writer.status();
  Result<std::vector<uint8_t>> bytes = writer->write_to_buffer();
  ASSERT_TRUE(bytes.ok());
  Result<gguf::GgufFile> file = gguf::GgufFile::parse_owned(std::move(*bytes));
  ASSERT_TRUE(file.ok());
  Result<std::unique_ptr<LlamaModel>> model = LlamaModel::from_file(std::move(*file));
  ASSERT_TRUE(model.ok()) << model.status();
  Result<std::unique_ptr<device::VirtualMemory>> vm = device::make_host_virtual_memory();
  ASSERT_TRUE(vm.ok());
  memory::PagePoolOptions pool_options;
  pool_options.name = "pipeline_stage_test";
  pool_options.page_size = size_t{64} << 10;
  pool_options.num_pages = 256;
  Result<std::unique_ptr<memory::PagePool>> page_pool =
      memory::PagePool::create(**vm, pool_options);
  ASSERT_TRUE(page_pool.ok());
  ThreadPool threads(1);
  Stage first, second;
  ASSERT_TRUE(
      first.init(**model, 0, 2, false, exec::ExecutionMode::kEager, **page_pool, **vm, threads)
          .ok());
  ASSERT_TRUE(second
                  .init(**model, 2, kNumLayers, false, exec::ExecutionMode::kEager, **page_pool,
                        **vm, threads)
                  .ok());
  EXPECT_EQ(first.executor().hidden_output_size(), shape.hidden_size);
  EXPECT_EQ(second.executor().hidden_input_size(), shape.hidden_size);
  testing::PipelineStepArrays arrays;
  arrays.add_segment(0, 0, 3, 1, 512);
  const std::vector<float> short_hidden(static_cast<size_t>(2 * shape.hidden_size), 0.0f);
  Result<ir::StepOutput> missing = second.executor().execute(arrays.batch());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("pipeline stage reads 192"), std::string_view::npos)
      << missing.status();
  EXPECT_EQ(second.executor().execute(arrays.batch(), short_hidden).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(first.executor().execute(arrays.batch(), short_hidden).status().code(),
            StatusCode::kInvalidArgument);
  Result<ir::StepOutput> handed_on = first.executor().execute(arrays.batch());
  ASSERT_TRUE(handed_on.ok()) << handed_on.status();
  const std::vector<float> hidden(handed_on->hidden.begin(), handed_on->hidden.end());
  Result<ir::StepOutput> logits = second.executor().execute(arrays.batch(), hidden);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_EQ(logits->num_rows, 1);
  EXPECT_EQ(logits->vocab_size, shape.vocab_size);
}

std::vector<PipelineCase> pipeline_cases() {
  std::vector<PipelineCase> cases;
  const std::pair<const char*, DType> dtypes[] = {
      {"f32", DType::kF32}, {"f16", DType::kF16}, {"q8_0", DType::kQ8_0}};
  const std::pair<const char*, std::vector<int64_t>> splits[] = {{"pp2", {2}}, {"pp3", {1, 3}}};
  const std::pair<const char*, exec::ExecutionMode> modes[] = {
      {"eager", exec::ExecutionMode::kEager}, {"graph", exec::ExecutionMode::kGraph}};
  static std::vector<std::string> names;  // PipelineCase::name points into it
  names.reserve(12);
  for (const auto& [dtype_name, dtype] : dtypes) {
    for (const auto& [split_name, cuts] : splits) {
      for (const auto& [mode_name, mode] : modes) {
        names.push_back(fmt::format("{}_{}_{}", dtype_name, split_name, mode_name));
        cases.push_back(PipelineCase{names.back().c_str(), dtype, cuts, mode});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(GeneratedModels, LlamaPipelineTest, ::testing::ValuesIn(pipeline_cases()),
                         [](const ::testing::TestParamInfo<PipelineCase>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace folio::model
