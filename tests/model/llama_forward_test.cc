// End-to-end: the engine's logits for generated models against an independent reference (the
// PyTorch script tests/data/reference/llama_reference.py, float64, its own GGUF parser). The
// golden files were written by tests/data/reference/regenerate.sh from the same models this
// test generates in memory (same shape, same seed, same bytes: checked by hash).
//
// Each prompt runs (a) as one prefill step asking for the logits of every position and (b) one
// token per step (decode), eagerly and through captured/replayed programs.
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "folio/base/random.h"
#include "folio/device/host_virtual_memory.h"
#include "folio/exec/arena_memory.h"
#include "folio/exec/executor.h"
#include "folio/exec/host_buffer.h"
#include "folio/exec/multi_shape_arena.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/model/llama_model.h"

namespace folio::model {
namespace {

struct ReferenceModel {
  const char* name;
  LlamaArchitecture architecture;
  DType dtype;
  bool tie_embeddings;
  uint64_t seed;
  // Largest |engine - reference| allowed, relative to max(1, largest |reference| logit).
  double tolerance;
};

// Keep in sync with tests/data/reference/regenerate.sh. Tolerances: f32 and f16 weights are
// exact in f32, so only f32 rounding remains; q8_0 matmuls quantize activations to 8 bits
// (as ggml does), about 1/254 of each row's largest value per product.
constexpr ReferenceModel kReferenceModels[] = {
    {"llama_f32_gqa", LlamaArchitecture::kLlama, DType::kF32, false, 11, 1e-4},
    {"llama_q8_0_gqa", LlamaArchitecture::kLlama, DType::kQ8_0, false, 12, 5e-2},
    {"qwen2_f16_tied", LlamaArchitecture::kQwen2, DType::kF16, true, 13, 1e-4},
};

struct Golden {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<std::vector<double>>> logits;  // [prompt][position][vocab]
  std::string model_hash;
};

Golden read_golden(const std::string& name) {
  std::ifstream in(std::string(FOLIO_SOURCE_DIR) + "/tests/data/reference/" + name + ".json");
  EXPECT_TRUE(in.good()) << "missing golden file for " << name;
  nlohmann::json json = nlohmann::json::parse(in);
  Golden golden;
  golden.model_hash = json["model_fnv1a64"].get<std::string>();
  for (const auto& result : json["results"]) {
    golden.prompts.push_back(result["tokens"].get<std::vector<int32_t>>());
    golden.logits.push_back(result["logits"].get<std::vector<std::vector<double>>>());
  }
  return golden;
}

// A model, a flat KV cache and an executor over them.
class ForwardHarness {
 public:
  static constexpr int64_t kBlockSize = 16;
  static constexpr int64_t kMaxBlocksPerSequence = 4;
  static constexpr int64_t kNumBlocks = kMaxBlocksPerSequence + 2;  // + dummy blocks

  Status init(const ReferenceModel& reference, exec::ExecutionMode mode) {
    LlamaShape shape;
    shape.architecture = reference.architecture;
    shape.weight_dtype = reference.dtype;
    shape.tie_embeddings = reference.tie_embeddings;
    FOLIO_ASSIGN_OR_RETURN(gguf::GgufWriter writer,
                           make_random_llama_writer(shape, reference.seed));
    FOLIO_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, writer.write_to_buffer());
    model_hash_ = fmt::format("{:016x}", fnv1a64(bytes));
    FOLIO_ASSIGN_OR_RETURN(gguf::GgufFile file, gguf::GgufFile::parse_owned(std::move(bytes)));
    FOLIO_ASSIGN_OR_RETURN(model_, LlamaModel::from_file(std::move(file)));

    kernels::PagedKvLayout layout;
    layout.block_size = kBlockSize;
    layout.num_layers = static_cast<int32_t>(shape.num_layers);
    layout.num_kv_heads = static_cast<int32_t>(shape.num_kv_heads);
    layout.head_dim = static_cast<int32_t>(shape.head_dim());
    layout.dtype = DType::kF32;
    layout.block_bytes = kernels::PagedKvLayout::compute_block_bytes(
        layout.num_layers, layout.block_size, layout.num_kv_heads, layout.head_dim, layout.dtype);
    layout.blocks_per_page = kNumBlocks;
    layout.page_bytes = layout.block_bytes * kNumBlocks;
    kv_memory_ = exec::HostBuffer(static_cast<size_t>(layout.page_bytes));
    layout.base = kv_memory_.data();

    FOLIO_ASSIGN_OR_RETURN(vm_, device::make_host_virtual_memory());
    arena_ = exec::MultiShapeArena::create(std::make_unique<exec::DedicatedArenaMemory>(*vm_));
    const ir::KvCacheShape kv_cache{model_->kv_cache_geometry(kBlockSize, DType::kF32), kNumBlocks,
                                    kMaxBlocksPerSequence};
    exec::ExecutorOptions options;
    options.max_sequences = 4;
    options.max_logit_rows = 32;
    options.mode = mode;
    options.first_dummy_block = kMaxBlocksPerSequence;
    options.num_dummy_blocks = 2;
    options.bucket_ladder = {1, 2, 4, 8, 16, 32};
    exec::ExecutorResources resources{pool_, *arena_, model_->weights(),
                                      exec::KvCacheBinding{layout, kNumBlocks}};
    FOLIO_ASSIGN_OR_RETURN(
        executor_, exec::Executor::create(model_->graph_factory(kv_cache), resources, options));
    return Status();
  }

  const std::string& model_hash() const { return model_hash_; }

  // Runs tokens [first, first + count) of `prompt` (earlier ones are in the cache) and returns
  // the logits of each of them, f32 [count][vocab].
  Result<std::vector<std::vector<float>>> run(const std::vector<int32_t>& prompt, int32_t first,
                                              int32_t count) {
    std::vector<int32_t> tokens(prompt.begin() + first, prompt.begin() + first + count);
    std::vector<int32_t> positions, slots, logit_rows;
    for (int32_t i = 0; i < count; ++i) {
      positions.push_back(first + i);
      slots.push_back(first + i);  // block table is the identity: block b holds positions b*16..
      logit_rows.push_back(i);
    }
    std::vector<int32_t> query_start = {0, count};
    std::vector<int32_t> seq_lens = {first + count};
    std::vector<int32_t> block_tables(kMaxBlocksPerSequence);
    for (int32_t b = 0; b < kMaxBlocksPerSequence; ++b) block_tables[b] = b;
    const ir::StepBatch step{tokens,       positions,  slots, query_start,          seq_lens,
                             block_tables, logit_rows, {},    kMaxBlocksPerSequence};
    FOLIO_ASSIGN_OR_RETURN(ir::StepOutput output, executor_->execute(step));
    std::vector<std::vector<float>> rows;
    for (int32_t r = 0; r < output.num_rows; ++r) {
      auto row =
          output.logits.subspan(static_cast<size_t>(r * output.vocab_size), output.vocab_size);
      rows.emplace_back(row.begin(), row.end());
    }
    return rows;
  }

 private:
  ThreadPool pool_{2};
  std::unique_ptr<LlamaModel> model_;
  exec::HostBuffer kv_memory_;
  std::unique_ptr<device::VirtualMemory> vm_;
  std::unique_ptr<exec::MultiShapeArena> arena_;
  std::unique_ptr<exec::Executor> executor_;
  std::string model_hash_;
};

// max |actual - expected| / max(1, max |expected|) over a row.
double relative_error(const std::vector<float>& actual, const std::vector<double>& expected) {
  double worst = 0, scale = 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    worst = std::max(worst, std::abs(actual[i] - expected[i]));
    scale = std::max(scale, std::abs(expected[i]));
  }
  return worst / scale;
}

class LlamaForwardTest
    : public ::testing::TestWithParam<std::tuple<ReferenceModel, exec::ExecutionMode>> {};

TEST_P(LlamaForwardTest, LogitsMatchIndependentReference) {
  const auto& [reference, mode] = GetParam();
  Golden golden = read_golden(reference.name);
  ForwardHarness harness;
  ASSERT_TRUE(harness.init(reference, mode).ok());
  ASSERT_EQ(harness.model_hash(), golden.model_hash)
      << "the generated model changed; run tests/data/reference/regenerate.sh";
  double worst_prefill = 0, worst_decode = 0;
  for (size_t p = 0; p < golden.prompts.size(); ++p) {
    const std::vector<int32_t>& prompt = golden.prompts[p];
    const int32_t length = static_cast<int32_t>(prompt.size());
    // (a) the whole prompt in one step.
    Result<std::vector<std::vector<float>>> prefill = harness.run(prompt, 0, length);
    ASSERT_TRUE(prefill.ok()) << prefill.status();
    for (int32_t i = 0; i < length; ++i) {
      worst_prefill = std::max(worst_prefill, relative_error((*prefill)[i], golden.logits[p][i]));
    }
    // (b) one token per step, over the cache the previous steps wrote.
    for (int32_t i = 0; i < length; ++i) {
      Result<std::vector<std::vector<float>>> decode = harness.run(prompt, i, 1);
      ASSERT_TRUE(decode.ok()) << decode.status();
      worst_decode = std::max(worst_decode, relative_error((*decode)[0], golden.logits[p][i]));
    }
  }
  EXPECT_LE(worst_prefill, reference.tolerance);
  EXPECT_LE(worst_decode, reference.tolerance);
  std::printf("%s: worst relative error prefill %.3g, decode %.3g (tolerance %.1g)\n",
              reference.name, worst_prefill, worst_decode, reference.tolerance);
}

INSTANTIATE_TEST_SUITE_P(
    GeneratedModels, LlamaForwardTest,
    ::testing::Combine(::testing::ValuesIn(kReferenceModels),
                       ::testing::Values(exec::ExecutionMode::kEager, exec::ExecutionMode::kGraph)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param).name) +
             (std::get<1>(info.param) == exec::ExecutionMode::kEager ? "_eager" : "_graph");
    });

}  // namespace
}  // namespace folio::model
