// The invariant that matters most, with the real model: a request's greedy output is identical
// whether it runs alone or among 64 others, under a KV budget small enough to force preemption
// (by recompute and by swap), with chunked prefill on or off, with graphs on or off. The model
// is a small generated Llama (q8_0 weights, so batched kernels quantize activations row by row,
// GQA, two layers) run through the whole stack: page pool, paged KV cache, executor (captured
// graphs or eager), ModelStepRunner, scheduler. Each request's reference is its output when
// run alone, eagerly, in a fresh engine with ample memory and no chunking.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "engine_test_util.h"
#include "folio/engine/model_engine.h"
#include "folio/model/llama_model_file.h"

namespace folio::engine {
namespace {

using testing::random_prompt;
using testing::Recorder;

constexpr int32_t kNumRequests = 65;  // one request among 64 others

// LlamaShape's defaults (vocabulary 512, hidden 64, two layers, four heads over two KV heads,
// FFN 128) with a context of 128 and q8_0 weights.
model::LlamaShape test_shape() {
  model::LlamaShape shape;
  shape.context_length = 128;
  shape.weight_dtype = DType::kQ8_0;
  return shape;
}

using Spec = testing::RequestSpec;

std::vector<Spec> make_workload() {
  uint64_t state = 20261121;
  const std::vector<int32_t> shared_prefix = random_prompt(state, 24, 509);
  std::vector<Spec> specs;
  for (int32_t index = 0; index < kNumRequests; ++index) {
    Spec spec;
    const auto length = static_cast<int32_t>(4 + (state >> 40) % 41);
    spec.prompt = random_prompt(state, length, 509);
    for (int32_t& token : spec.prompt) token += 3;  // no BOS / EOS / UNK inside prompts
    if (index % 3 == 0) {                           // a third share a prefix of three blocks
      spec.prompt.insert(spec.prompt.begin(), shared_prefix.begin(), shared_prefix.end());
    }
    spec.max_tokens = static_cast<int32_t>(4 + (state >> 20) % 29);
    spec.priority = static_cast<int32_t>((state >> 50) % 3);
    spec.ignore_eos = true;
    spec.sampling.temperature = 0.0f;  // greedy
    if (index % 5 == 2) {              // seeded sampling must be just as reproducible
      spec.sampling.temperature = 0.9f;
      spec.sampling.top_k = 40;
      spec.sampling.top_p = 0.95f;
      spec.sampling.seed = 500 + index;
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

struct Configuration {
  bool use_graphs = false;
  bool chunked = true;
  int64_t kv_cache_bytes = 0;  // 0: ample
  int64_t swap_bytes = 0;
  PreemptionMode preemption = PreemptionMode::kRecompute;
};

constexpr int64_t kPageBytes = 16 << 10;  // 8 blocks of 8 tokens (2 KiB each, f16)

ModelEngineOptions engine_options(const Configuration& configuration) {
  ModelEngineOptions options;
  options.num_threads = 1;  // the kernels partition work by rows: results do not depend on it
  options.memory_budget_bytes = 4 << 20;  // check_invariants scans every pool page
  options.page_bytes = kPageBytes;
  options.kv_cache_bytes = configuration.kv_cache_bytes;
  options.block_size = 8;
  options.kv_dtype = DType::kF16;
  options.use_graphs = configuration.use_graphs;
  options.precapture_seconds = 0;
  options.swap_bytes = configuration.swap_bytes;
  options.scheduler.max_num_batched_tokens = 96;
  options.scheduler.max_num_sequences = 64;
  options.scheduler.chunked_prefill = configuration.chunked;
  options.scheduler.prefill_chunk_size = 24;
  options.scheduler.preemption_mode = configuration.preemption;
  options.scheduler.max_preemptions = 100000;
  return options;
}

struct RunResult {
  std::vector<std::vector<int32_t>> outputs;
  EngineStats stats;
};

class ModelEngineInvarianceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_path_ = new std::string(
        (std::filesystem::path(::testing::TempDir()) /
         ("folio_invariance_model_" + std::to_string(getpid()) + ".gguf"))
            .string());  // ctest runs each test in its own process, possibly at once
    ASSERT_TRUE(model::write_random_llama_model(*model_path_, test_shape(), 11).ok());
    specs_ = new std::vector<Spec>(make_workload());
    alone_ = new std::vector<std::vector<int32_t>>();
    Configuration reference;
    reference.chunked = false;
    for (const Spec& spec : *specs_) {
      alone_->push_back(run(reference, std::span<const Spec>(&spec, 1)).outputs.at(0));
    }
  }
  static void TearDownTestSuite() {
    std::filesystem::remove(*model_path_);
    delete model_path_;
    delete specs_;
    delete alone_;
  }

  // Submits every spec before the first step, steps to the end checking the engine's
  // invariants after each step, and checks that every request ended exactly once without error
  // and that every block and pool page is free or cached afterwards.
  static RunResult run(const Configuration& configuration, std::span<const Spec> specs) {
    RunResult result;
    Recorder recorder;  // outlives the engine, which reports unfinished requests when destroyed
    Result<std::unique_ptr<model::LlamaModel>> model = model::LlamaModel::open(*model_path_);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return result;
    Result<std::unique_ptr<ModelEngine>> bundle =
        ModelEngine::create(std::move(*model), engine_options(configuration));
    EXPECT_TRUE(bundle.ok()) << bundle.status();
    if (!bundle.ok()) return result;
    Engine& engine = (*bundle)->engine();
    std::vector<RequestId> ids;
    for (const Spec& spec : specs) {
      Request request = testing::to_request(spec);
      Result<RequestId> id = engine.submit(recorder.attach(request));
      EXPECT_TRUE(id.ok()) << id.status();
      if (id.ok()) ids.push_back(*id);
    }
    int64_t steps = 0;
    while (engine.has_unfinished_requests()) {
      engine.step();
      engine.check_invariants();
      if (++steps > 20000) {
        ADD_FAILURE() << "no end after " << steps << " steps (thrashing?)";
        break;
      }
    }
    recorder.expect_each_finished_once(ids);
    for (RequestId id : ids) {
      const Completion completion = recorder.completion(id);
      EXPECT_NE(completion.reason, FinishReason::kError) << completion.error;
      result.outputs.push_back(recorder.stream(id).tokens);
    }
    kv::BlockManager& blocks = (*bundle)->block_manager();
    blocks.check_invariants();
    EXPECT_EQ(blocks.num_sequences(), 0);
    EXPECT_EQ(blocks.counts().owned, blocks.num_dummy_blocks())
        << "only the dummy blocks may stay owned";
    // Pool pages: KV pages stay allocated (their blocks are free or cached) and graph arena
    // pages stay with the arena; nothing else may be left in use.
    const memory::PoolStats pool = (*bundle)->pool().stats();
    for (memory::ContentType content : memory::kAllContentTypes) {
      if (content == memory::ContentType::kKvCache || content == memory::ContentType::kGraphArena)
        continue;
      EXPECT_EQ(pool.per_content[memory::content_index(content)].pages_in_use, 0)
          << memory::content_type_name(content);
    }
    result.stats = engine.stats();
    return result;
  }

  void expect_same_outputs(const RunResult& result, std::string_view configuration) {
    ASSERT_EQ(result.outputs.size(), specs_->size()) << configuration;
    for (size_t index = 0; index < specs_->size(); ++index) {
      EXPECT_EQ(result.outputs[index], (*alone_)[index])
          << configuration << ": request " << index << " differs from its run alone";
    }
  }

  static std::string* model_path_;
  static std::vector<Spec>* specs_;
  static std::vector<std::vector<int32_t>>* alone_;
};

std::string* ModelEngineInvarianceTest::model_path_ = nullptr;
std::vector<Spec>* ModelEngineInvarianceTest::specs_ = nullptr;
std::vector<std::vector<int32_t>>* ModelEngineInvarianceTest::alone_ = nullptr;

std::string describe(const Configuration& configuration) {
  std::string text = configuration.use_graphs ? "graphs" : "eager";
  text += configuration.chunked ? ", chunked" : ", unchunked";
  if (configuration.kv_cache_bytes > 0) {
    text += configuration.preemption == PreemptionMode::kSwap ? ", swap" : ", recompute";
  }
  return text;
}

TEST_F(ModelEngineInvarianceTest, AloneOutputsHaveTheRequestedLengths) {
  for (size_t index = 0; index < specs_->size(); ++index) {
    EXPECT_EQ(static_cast<int32_t>((*alone_)[index].size()), (*specs_)[index].max_tokens);
  }
}

TEST_F(ModelEngineInvarianceTest, BatchedWithAmpleMemory) {
  for (bool use_graphs : {false, true}) {
    for (bool chunked : {true, false}) {
      Configuration configuration{use_graphs, chunked};
      const RunResult result = run(configuration, *specs_);
      EXPECT_EQ(result.stats.preemptions_by_recompute + result.stats.preemptions_by_swap, 0);
      expect_same_outputs(result, describe(configuration));
    }
  }
}

TEST_F(ModelEngineInvarianceTest, UnderPreemptionByRecompute) {
  for (bool use_graphs : {false, true}) {
    for (bool chunked : {true, false}) {
      Configuration configuration{use_graphs, chunked};
      configuration.kv_cache_bytes = 3 * kPageBytes;  // 24 blocks; the longest request needs 13
      const RunResult result = run(configuration, *specs_);
      EXPECT_GT(result.stats.preemptions_by_recompute, 0) << "the KV budget must force preemption";
      EXPECT_GT(result.stats.prefix_cache_hit_blocks, 0) << "recompute should hit the cache";
      expect_same_outputs(result, describe(configuration));
    }
  }
}

TEST_F(ModelEngineInvarianceTest, UnderPreemptionBySwap) {
  for (bool use_graphs : {false, true}) {
    for (bool chunked : {true, false}) {
      Configuration configuration{use_graphs, chunked};
      configuration.kv_cache_bytes = 3 * kPageBytes;
      configuration.swap_bytes = 4 << 20;
      configuration.preemption = PreemptionMode::kSwap;
      const RunResult result = run(configuration, *specs_);
      EXPECT_GT(result.stats.preemptions_by_swap, 0) << "the KV budget must force swapping";
      expect_same_outputs(result, describe(configuration));
    }
  }
}

}  // namespace
}  // namespace folio::engine
