// The invariant that matters most: a request's output does not depend on what it was batched
// with, on preemption (by recompute or by swap), on chunked prefill, or on whether its steps were
// replayed from captured graphs or run eagerly. One suite, run with two step runners:
// - the toy runner (tests/testing/toy_step_runner.h) over a real paged KV cache, whose greedy
//   output has an independent reference, with staggered submission and scarce swap space;
// - the real model: a small generated Llama (q8_0 weights, so batched kernels quantize
//   activations row by row, GQA, two layers) through the whole stack: page pool, paged KV cache,
//   executor (captured graphs or eager), ModelStepRunner, scheduler.
// Each request's reference is its output when run alone (for the model: eagerly, in a fresh
// engine with ample memory and no chunking). Seeded sampled requests must be just as
// reproducible. Every configuration must also end every request exactly once, with no error,
// and leave every KV block FREE or CACHED.
// A third runner is the real model with 20 LoRA adapters: every 21st request runs on the base
// and the others on adapters 1..20, all mixed in one batch (the step graphs carry the adapter
// updates, and each step binds its adapters to the table); alone, each runs in a fresh engine
// with the same adapters registered.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine_invariance_suite.h"
namespace folio::engine::invariance {
namespace {

// The toy runner over a paged KV cache of 8-token blocks.
struct ToyRunner {
  static constexpr bool kSupportsSwap = true;
  static constexpr bool kHasPagePool = false;
  static std::vector<bool> graph_modes() { return {false}; }  // the toy has no graphs
  static std::vector<bool> staggered_modes() { return {false, true}; }
  static std::vector<bool> scarce_swap_modes() { return {false, true}; }

  static void set_up() {}
  static void tear_down() {}

  static std::vector<Spec> workload() {
    uint64_t state = 20240611;
    const std::vector<int32_t> shared_prefix = random_prompt(state, 19, 64);
    std::vector<Spec> specs;
    for (int32_t index = 0; index < kNumRequests; ++index) {
      Spec spec;
      const auto length = static_cast<int32_t>(4 + (state >> 40) % 37);
      spec.prompt = random_prompt(state, length, 64);
      if (index % 3 == 0) {  // a third share a prefix longer than two blocks
        spec.prompt.insert(spec.prompt.begin(), shared_prefix.begin(), shared_prefix.end());
        spec.prompt.resize(std::min<size_t>(spec.prompt.size(), 48));
      }
      spec.max_tokens = static_cast<int32_t>(4 + (state >> 20) % 37);
      spec.priority = static_cast<int32_t>((state >> 50) % 3);
      spec.sampling.temperature = 0.0f;
      if (index % 4 == 1) {  // seeded sampling with every knob
        spec.sampling.temperature = 0.8f;
        spec.sampling.top_k = 20;
        spec.sampling.top_p = 0.9f;
        spec.sampling.min_p = 0.02f;
        spec.sampling.repetition_penalty = 1.2f;
        spec.sampling.presence_penalty = 0.3f;
        spec.sampling.frequency_penalty = 0.2f;
        spec.sampling.seed = 1000 + index;
      }
      specs.push_back(std::move(spec));
    }
    return specs;
  }

  static HarnessOptions base_options() {
    HarnessOptions options;
    options.num_pages = 64;  // 512 blocks: nothing is ever preempted
    options.scheduler.max_num_batched_tokens = 64;
    options.scheduler.max_num_sequences = 64;
    options.scheduler.prefill_chunk_size = 16;
    options.scheduler.max_preemptions = 100000;
    return options;
  }

  // How a request runs alone for its reference.
  static Configuration alone() { return Configuration{}; }

  static RunResult run(const Configuration& configuration, std::span<const Spec> specs) {
    HarnessOptions options = base_options();
    options.scheduler.chunked_prefill = configuration.chunked;
    if (configuration.tight_memory) options.num_pages = 6;  // 48 blocks; the largest needs 11
    if (configuration.preemption == PreemptionMode::kSwap) {
      options.swap_blocks = configuration.scarce_swap ? 12 : 256;
      options.scheduler.preemption_mode = PreemptionMode::kSwap;
    }
    return run_with(options, specs, configuration.staggered);
  }

  static RunResult run_with(const HarnessOptions& options, std::span<const Spec> specs,
                            bool staggered) {
    Recorder recorder;
    EngineHarness harness(options);
    RunResult result = drive(harness.engine(), recorder, specs, staggered);
    harness.expect_all_blocks_free_or_cached();
    return result;
  }
};

struct RunnerNames {
  template <typename Runner>
  static std::string GetName(int) {
    if (std::is_same_v<Runner, ToyRunner>) return "Toy";
    return std::is_same_v<Runner, ModelRunner> ? "Model" : "AdapterModel";
  }
};

using Runners = ::testing::Types<ToyRunner, ModelRunner, AdapterModelRunner>;
INSTANTIATE_TYPED_TEST_SUITE_P(Engine, EngineInvarianceTest, Runners, RunnerNames);

// What only one runner can show.
using ToyEngineInvarianceTest = EngineInvarianceTest<ToyRunner>;
using ModelEngineInvarianceTest = EngineInvarianceTest<ModelRunner>;

TEST_F(ToyEngineInvarianceTest, AloneGreedyOutputsMatchTheIndependentReference) {
  for (size_t index = 0; index < specs_->size(); ++index) {
    const Spec& spec = (*specs_)[index];
    if (!spec.sampling.is_greedy()) continue;
    EXPECT_EQ((*alone_)[index],
              reference_greedy(ToyRunner::base_options(), spec.prompt, spec.max_tokens))
        << "request " << index;
  }
}

TEST_F(ToyEngineInvarianceTest, WithTinyChunksAndBudget) {
  HarnessOptions options = ToyRunner::base_options();
  options.num_pages = 5;
  options.scheduler.prefill_chunk_size = 3;
  options.scheduler.max_num_batched_tokens = 8;
  options.scheduler.max_num_sequences = 8;
  const RunResult result = ToyRunner::run_with(options, *specs_, /*staggered=*/true);
  ASSERT_EQ(result.outputs.size(), specs_->size());
  for (size_t index = 0; index < specs_->size(); ++index) {
    EXPECT_EQ(result.outputs[index], (*alone_)[index])
        << "chunks of 3, budget 8: request " << index << " differs from its run alone";
  }
}

TEST_F(ModelEngineInvarianceTest, AloneOutputsHaveTheRequestedLengths) {
  for (size_t index = 0; index < specs_->size(); ++index) {
    EXPECT_EQ(static_cast<int32_t>((*alone_)[index].size()), (*specs_)[index].max_tokens);
  }
}

// Choices through the real model and executor (forked block tables, copy-on-write of the
// shared last block), eager and with graphs: greedy choices equal the request's run alone, and
// a seeded sampled request's choice 0 equals its n = 1 run.
template <typename Runner>
void expect_choices_match_single_runs(std::span<const Spec> specs,
                                      std::span<const std::vector<int32_t>> alone) {
  int32_t checked_greedy = 0, checked_sampled = 0;
  for (size_t index = 0; index < specs.size(); ++index) {
    const Spec& spec = specs[index];
    // One request of each kind with a prompt longer than a block (8 tokens).
    const bool greedy = spec.sampling.is_greedy();
    if (spec.prompt.size() < 12 || (greedy ? checked_greedy : checked_sampled) > 0) continue;
    (greedy ? checked_greedy : checked_sampled) += 1;
    for (bool use_graphs : Runner::graph_modes()) {
      SCOPED_TRACE(fmt::format("request {} graphs {}", index, use_graphs));
      int64_t most_shared = 0;
      const std::vector<std::vector<int32_t>> outputs =
          Runner::run_choices(spec, 3, use_graphs, &most_shared);
      ASSERT_EQ(outputs.size(), 3u);
      EXPECT_EQ(outputs[0], alone[index]);
      if (greedy) {
        EXPECT_EQ(outputs[1], alone[index]);
        EXPECT_EQ(outputs[2], alone[index]);
      }
      EXPECT_GE(most_shared, static_cast<int64_t>(spec.prompt.size() / 8));
    }
  }
  EXPECT_EQ(checked_greedy, 1);
  EXPECT_EQ(checked_sampled, 1);
}

TEST_F(ModelEngineInvarianceTest, ChoicesShareThePromptAndMatchTheSingleChoiceRun) {
  expect_choices_match_single_runs<ModelRunner>(*specs_, *alone_);
}

using AdapterEngineInvarianceTest = EngineInvarianceTest<AdapterModelRunner>;

TEST_F(AdapterEngineInvarianceTest, ChoicesOfAnAdapterRequestHoldTheAdapterEach) {
  std::vector<Spec> with_adapter;
  std::vector<std::vector<int32_t>> alone;
  for (size_t index = 0; index < specs_->size(); ++index) {
    if ((*specs_)[index].adapter_id == 0) continue;
    with_adapter.push_back((*specs_)[index]);
    alone.push_back((*alone_)[index]);
  }
  expect_choices_match_single_runs<AdapterModelRunner>(with_adapter, alone);
}

// The adapters matter: most adapter requests' outputs differ from the same request on the base.
TEST_F(AdapterEngineInvarianceTest, AdaptersChangeTheOutput) {
  int32_t compared = 0, differing = 0;
  for (size_t index = 0; index < specs_->size() && compared < 12; ++index) {
    Spec spec = (*specs_)[index];
    if (spec.adapter_id == 0 || !spec.sampling.is_greedy()) continue;
    spec.adapter_id = 0;
    const RunResult base =
        AdapterModelRunner::run(AdapterModelRunner::alone(), std::span<const Spec>(&spec, 1));
    ++compared;
    if (base.outputs.at(0) != (*alone_)[index]) ++differing;
  }
  EXPECT_GE(differing, compared * 3 / 4) << differing << " of " << compared << " differ";
}

}  // namespace
}  // namespace folio::engine::invariance
