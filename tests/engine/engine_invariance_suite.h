// The batch-invariance suite of the engine (engine_invariance_test.cc says what it checks),
// as typed tests a runner instantiates: the engine's own runners (the toy, the model, the model
// with adapters) in tests/engine, the model over pipeline stages in tests/dist
// (pipeline_invariance_test.cc). A runner gives its workload, how a request runs alone, and
// run(configuration, specs); kSupportsSwap says whether preemption by swap applies, and
// kHasPagePool whether memory pressure can be (the toy runner has no page pool).
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "folio/engine/model_engine.h"
#include "folio/lora/adapter_writer.h"
#include "folio/model/llama_model_file.h"

namespace folio::engine::invariance {

using testing::EngineHarness;
using testing::HarnessOptions;
using testing::random_prompt;
using testing::Recorder;
using testing::reference_greedy;
using testing::to_request;

using testing::EngineHarness;
using testing::HarnessOptions;
using testing::random_prompt;
using testing::Recorder;
using testing::reference_greedy;
using testing::to_request;

constexpr int32_t kNumRequests = 65;  // one request among 64 others

using Spec = testing::RequestSpec;

// What a run varies; each runner says which values it supports.
struct Configuration {
  bool use_graphs = false;  // replay captured graphs (model runner)
  bool chunked = true;
  bool staggered = false;     // submit one request per step instead of all before the first
  bool tight_memory = false;  // a KV budget small enough to force preemption
  PreemptionMode preemption = PreemptionMode::kRecompute;
  bool scarce_swap = false;        // swap space too small for every victim: falls back to recompute
  bool pressure_handling = false;  // the model engine reacts to memory pressure
};

inline std::string describe(const Configuration& configuration) {
  std::string text = configuration.use_graphs ? "graphs" : "eager";
  text += configuration.chunked ? ", chunked" : ", unchunked";
  if (configuration.staggered) text += ", staggered";
  if (configuration.tight_memory) {
    text += configuration.preemption == PreemptionMode::kSwap ? ", swap" : ", recompute";
    if (configuration.scarce_swap) text += " (scarce)";
    if (configuration.pressure_handling) text += ", pressure handling";
  }
  return text;
}

struct RunResult {
  std::vector<std::vector<int32_t>> outputs;
  EngineStats stats;
  PressureCounts pressure;  // model runners with pressure handling
};

// Submits `specs` (all before the first step, or one more per step), steps to the end checking
// the engine's invariants after each step, and checks that every request ended exactly once
// without error. Returns each request's tokens.
// `recorder` must outlive the engine, which reports unfinished requests when destroyed.
inline RunResult drive(Engine& engine, Recorder& recorder, std::span<const Spec> specs,
                       bool staggered) {
  RunResult result;
  std::vector<RequestId> ids;
  size_t submitted = 0;
  auto submit_one = [&] {
    Request request = to_request(specs[submitted++]);
    Result<RequestId> id = engine.submit(recorder.attach(request));
    EXPECT_TRUE(id.ok()) << id.status();
    if (id.ok()) ids.push_back(*id);
  };
  if (!staggered) {
    while (submitted < specs.size()) submit_one();
  }
  int64_t steps = 0;
  while (submitted < specs.size() || engine.has_unfinished_requests()) {
    if (submitted < specs.size()) submit_one();
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
  result.stats = engine.stats();
  return result;
}

// Where the model engine's steps run: LocalSteps in its own executor; a runner of the dist tests
// (tests/dist/pipeline_invariance_test.cc) on pipeline stages of worker services, given the
// model file once per suite.
struct LocalSteps {
  static constexpr bool kSupportsSwap = true;
  static void set_up(const std::string& /*model_path*/) {}
  static void tear_down() {}
  static void apply(ModelEngineOptions& /*options*/) {}
};

// The real model: LlamaShape's defaults (vocabulary 512, hidden 64, two layers, four heads over
// two KV heads, FFN 128) with a context of 128 and q8_0 weights, written to a file per process
// (ctest runs each test in its own process, possibly at once). With kAdapters, also 20 random
// adapters of ranks 1 to 16 (f16 and q8_0 files, some adapting the LM head) registered as ids
// 1..20 in every engine.
template <bool kAdapters, typename Steps = LocalSteps>
struct ModelRunnerOf {
  static constexpr int32_t kNumAdapters = 20;
  static constexpr bool kSupportsSwap = Steps::kSupportsSwap;
  // Steps on a KV-parallel group refuse pressure handling (their KV is not in the pool).
  static constexpr bool kHasPagePool = [] {
    if constexpr (requires { Steps::kHasPagePool; }) {
      return Steps::kHasPagePool;
    } else {
      return true;
    }
  }();
  static constexpr int64_t kPageBytes = 16 << 10;  // 8 blocks of 8 tokens (2 KiB each, f16)

  static std::vector<bool> graph_modes() { return {false, true}; }
  static std::vector<bool> staggered_modes() { return {false}; }
  static std::vector<bool> scarce_swap_modes() { return {false}; }

  static void set_up() {
    model_path_ = new std::string((std::filesystem::path(::testing::TempDir()) /
                                   ("folio_invariance_model_" + std::to_string(getpid()) + ".gguf"))
                                      .string());
    model::LlamaShape shape;
    shape.context_length = 128;
    shape.weight_dtype = DType::kQ8_0;
    ASSERT_TRUE(model::write_random_llama_model(*model_path_, shape, 11).ok());
    Steps::set_up(*model_path_);
    adapter_paths_ = new std::vector<std::string>();
    if (!kAdapters) return;
    for (int32_t index = 0; index < kNumAdapters; ++index) {
      lora::RandomAdapterOptions options;
      options.rank = 1 + index % 16;
      // q8_0 where rows are whole blocks (lora_a), f16 elsewhere, as make-adapter writes.
      options.dtype = index % 3 == 2 ? DType::kQ8_0 : DType::kF16;
      options.output = index % 4 == 1;
      options.alpha = static_cast<float>(options.rank) * (index % 2 == 0 ? 1.0f : 0.5f);
      options.seed = 100 + static_cast<uint64_t>(index);
      Result<gguf::GgufWriter> writer = lora::make_random_adapter_writer(shape, options);
      ASSERT_TRUE(writer.ok()) << writer.status();
      adapter_paths_->push_back(*model_path_ + fmt::format(".adapter{}.gguf", index));
      ASSERT_TRUE(writer->write_file(adapter_paths_->back()).ok());
    }
  }
  static void tear_down() {
    Steps::tear_down();
    std::filesystem::remove(*model_path_);
    for (const std::string& path : *adapter_paths_) std::filesystem::remove(path);
    delete model_path_;
    delete adapter_paths_;
  }

  static std::vector<Spec> workload() {
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
      if (kAdapters) spec.adapter_id = index % (kNumAdapters + 1);  // 0: the base model
      specs.push_back(std::move(spec));
    }
    return specs;
  }

  static Configuration alone() {
    Configuration configuration;
    configuration.chunked = false;
    return configuration;
  }

  static ModelEngineOptions engine_options(const Configuration& configuration) {
    ModelEngineOptions options;
    options.num_threads = 1;  // the kernels partition work by rows: results do not depend on it
    options.memory_budget_bytes = 4 << 20;  // check_invariants scans every pool page
    options.page_bytes = kPageBytes;
    // 24 blocks; the longest request needs 13.
    options.kv_cache_bytes = configuration.tight_memory ? 3 * kPageBytes : 0;
    options.block_size = 8;
    options.kv_dtype = DType::kF16;
    options.use_graphs = configuration.use_graphs;
    options.precapture_seconds = 0;
    options.swap_bytes = configuration.preemption == PreemptionMode::kSwap ? 4 << 20 : 0;
    options.scheduler.max_num_batched_tokens = 96;
    options.scheduler.max_num_sequences = 64;
    options.scheduler.chunked_prefill = configuration.chunked;
    options.scheduler.prefill_chunk_size = 24;
    options.scheduler.preemption_mode = configuration.preemption;
    options.scheduler.max_preemptions = 100000;
    options.adapters = kAdapters;
    options.pressure.enabled = configuration.pressure_handling;
    Steps::apply(options);
    return options;
  }

  static void register_adapters(ModelEngine& bundle) {
    for (size_t index = 0; index < adapter_paths_->size(); ++index) {
      Result<lora::AdapterInfo> info = bundle.adapters()->register_adapter(
          fmt::format("adapter{}", index), (*adapter_paths_)[index]);
      EXPECT_TRUE(info.ok()) << info.status();
      EXPECT_EQ(info->id, static_cast<int64_t>(index) + 1);
    }
  }

  // One request of `num_choices` choices, alone: each choice's tokens, and the most KV blocks
  // shared at once while it ran.
  static std::vector<std::vector<int32_t>> run_choices(const Spec& spec, int32_t num_choices,
                                                       bool use_graphs, int64_t* most_shared) {
    Result<std::unique_ptr<model::LlamaModel>> model = model::LlamaModel::open(*model_path_);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return {};
    Configuration configuration;
    configuration.use_graphs = use_graphs;
    Result<std::unique_ptr<ModelEngine>> bundle =
        ModelEngine::create(std::move(*model), engine_options(configuration));
    EXPECT_TRUE(bundle.ok()) << bundle.status();
    if (!bundle.ok()) return {};
    register_adapters(**bundle);
    Engine& engine = (*bundle)->engine();
    Recorder recorder;
    Request request = to_request(spec);
    request.num_choices = num_choices;
    const Result<RequestId> id = engine.submit(recorder.attach(request));
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return {};
    *most_shared = 0;
    while (engine.has_unfinished_requests()) {
      engine.step();
      engine.check_invariants();
      *most_shared = std::max(*most_shared, (*bundle)->block_manager().counts().shared);
    }
    std::vector<std::vector<int32_t>> outputs;
    for (int32_t choice = 0; choice < num_choices; ++choice) {
      EXPECT_EQ(recorder.completion(*id, choice).reason, FinishReason::kLength)
          << recorder.completion(*id, choice).error;
      outputs.push_back(recorder.stream(*id, choice).tokens);
    }
    EXPECT_EQ((*bundle)->block_manager().num_sequences(), 0);
    return outputs;
  }

  // Also checks that every block and pool page is free or cached afterwards.
  static RunResult run(const Configuration& configuration, std::span<const Spec> specs) {
    Recorder recorder;
    Result<std::unique_ptr<model::LlamaModel>> model = model::LlamaModel::open(*model_path_);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return {};
    Result<std::unique_ptr<ModelEngine>> bundle =
        ModelEngine::create(std::move(*model), engine_options(configuration));
    EXPECT_TRUE(bundle.ok()) << bundle.status();
    if (!bundle.ok()) return {};
    register_adapters(**bundle);
    const auto temporary =
        static_cast<size_t>(memory::content_index(memory::ContentType::kTemporary));
    const int64_t persistent_pages = (*bundle)->pool().stats().per_content[temporary].pages_in_use;
    RunResult result = drive((*bundle)->engine(), recorder, specs, configuration.staggered);
    if ((*bundle)->pressure() != nullptr) result.pressure = (*bundle)->pressure()->counts();
    kv::BlockManager& blocks = (*bundle)->block_manager();
    blocks.check_invariants();
    EXPECT_EQ(blocks.num_sequences(), 0);
    EXPECT_EQ(blocks.counts().owned, blocks.num_dummy_blocks())
        << "only the dummy blocks may stay owned";
    // Pool pages: KV pages stay allocated (their blocks are free or cached), graph arena pages
    // stay with the arena and hot adapters in their tier. Once the executor gives back its idle
    // eager memory, only the persistent input and output buffers it started with remain.
    Result<int64_t> released = (*bundle)->executor().release_idle_memory(0);
    EXPECT_TRUE(released.ok()) << released.status();
    const memory::PoolStats pool = (*bundle)->pool().stats();
    EXPECT_EQ(pool.per_content[temporary].pages_in_use, persistent_pages);
    EXPECT_EQ(
        pool.per_content[memory::content_index(memory::ContentType::kActivation)].pages_in_use, 0);
    if (kAdapters) {
      (*bundle)->adapters()->check_invariants();
      EXPECT_EQ((*bundle)->adapters()->stats().held, 0);
    }
    return result;
  }

  static inline std::string* model_path_ = nullptr;
  static inline std::vector<std::string>* adapter_paths_ = nullptr;
};
using ModelRunner = ModelRunnerOf<false>;
using AdapterModelRunner = ModelRunnerOf<true>;

template <typename Runner>
class EngineInvarianceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Runner::set_up();
    specs_ = new std::vector<Spec>(Runner::workload());
    alone_ = new std::vector<std::vector<int32_t>>();
    for (const Spec& spec : *specs_) {
      alone_->push_back(
          Runner::run(Runner::alone(), std::span<const Spec>(&spec, 1)).outputs.at(0));
    }
  }
  static void TearDownTestSuite() {
    delete specs_;
    delete alone_;
    Runner::tear_down();
  }

  void expect_same_outputs(const RunResult& result, const Configuration& configuration) {
    ASSERT_EQ(result.outputs.size(), specs_->size()) << describe(configuration);
    for (size_t index = 0; index < specs_->size(); ++index) {
      EXPECT_EQ(result.outputs[index], (*alone_)[index])
          << describe(configuration) << ": request " << index << " differs from its run alone";
    }
  }

  static inline std::vector<Spec>* specs_ = nullptr;
  static inline std::vector<std::vector<int32_t>>* alone_ = nullptr;
};

TYPED_TEST_SUITE_P(EngineInvarianceTest);

TYPED_TEST_P(EngineInvarianceTest, BatchedWithAmpleMemory) {
  for (bool use_graphs : TypeParam::graph_modes()) {
    for (bool chunked : {true, false}) {
      Configuration configuration;
      configuration.use_graphs = use_graphs;
      configuration.chunked = chunked;
      const RunResult result = TypeParam::run(configuration, *this->specs_);
      EXPECT_EQ(result.stats.preemptions_by_recompute + result.stats.preemptions_by_swap, 0);
      this->expect_same_outputs(result, configuration);
    }
  }
}

TYPED_TEST_P(EngineInvarianceTest, UnderPreemptionByRecompute) {
  for (bool use_graphs : TypeParam::graph_modes()) {
    for (bool chunked : {true, false}) {
      for (bool staggered : TypeParam::staggered_modes()) {
        Configuration configuration;
        configuration.use_graphs = use_graphs;
        configuration.chunked = chunked;
        configuration.staggered = staggered;
        configuration.tight_memory = true;
        const RunResult result = TypeParam::run(configuration, *this->specs_);
        EXPECT_GT(result.stats.preemptions_by_recompute, 0)
            << "the KV budget must force preemption";
        EXPECT_GT(result.stats.prefix_cache_hit_blocks, 0) << "recompute should hit the cache";
        this->expect_same_outputs(result, configuration);
      }
    }
  }
}

TYPED_TEST_P(EngineInvarianceTest, UnderPreemptionBySwap) {
  if (!TypeParam::kSupportsSwap) GTEST_SKIP() << "this runner's steps have no host swap";
  for (bool use_graphs : TypeParam::graph_modes()) {
    for (bool chunked : {true, false}) {
      for (bool scarce_swap : TypeParam::scarce_swap_modes()) {
        Configuration configuration;
        configuration.use_graphs = use_graphs;
        configuration.chunked = chunked;
        configuration.tight_memory = true;
        configuration.preemption = PreemptionMode::kSwap;
        configuration.scarce_swap = scarce_swap;
        const RunResult result = TypeParam::run(configuration, *this->specs_);
        EXPECT_GT(result.stats.preemptions_by_swap, 0) << "the KV budget must force swapping";
        if (scarce_swap) {
          EXPECT_GT(result.stats.preemptions_by_recompute, 0);
        }
        this->expect_same_outputs(result, configuration);
      }
    }
  }
}

// The model engine reacting to memory pressure (evicting cached prefixes and cold adapters,
// stopping admissions, preempting ahead of failed appends) changes no token and loses no
// request.
TYPED_TEST_P(EngineInvarianceTest, UnderMemoryPressureHandling) {
  if constexpr (!TypeParam::kHasPagePool) {
    GTEST_SKIP() << "the toy runner has no page pool to be under pressure";
  } else {
    for (bool use_graphs : TypeParam::graph_modes()) {
      for (PreemptionMode mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
        if (mode == PreemptionMode::kSwap && !TypeParam::kSupportsSwap) continue;
        Configuration configuration;
        configuration.use_graphs = use_graphs;
        configuration.tight_memory = true;
        configuration.preemption = mode;
        configuration.pressure_handling = true;
        const RunResult result = TypeParam::run(configuration, *this->specs_);
        const PressureCounts& pressure = result.pressure;
        const int64_t steps_under_pressure =
            pressure.steps_at_level[1] + pressure.steps_at_level[2] + pressure.steps_at_level[3];
        EXPECT_GT(steps_under_pressure, 0) << describe(configuration);
        this->expect_same_outputs(result, configuration);
      }
    }
  }
}

REGISTER_TYPED_TEST_SUITE_P(EngineInvarianceTest, BatchedWithAmpleMemory,
                            UnderPreemptionByRecompute, UnderPreemptionBySwap,
                            UnderMemoryPressureHandling);

}  // namespace folio::engine::invariance
