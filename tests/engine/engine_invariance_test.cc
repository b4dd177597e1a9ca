// The invariant that matters most: a request's output does not depend on what it was batched
// with, on preemption (by recompute or by swap), or on chunked prefill. Greedy requests are
// checked against the independent reference; seeded sampled requests against their own output
// when run alone. Every configuration must also end every request exactly once, with no error,
// and leave every KV block FREE or CACHED.
#include <gtest/gtest.h>

#include "engine_test_util.h"

namespace folio::engine {
namespace {

using testing::EngineHarness;
using testing::HarnessOptions;
using testing::random_prompt;
using testing::Recorder;
using testing::reference_greedy;
using testing::to_request;

constexpr int32_t kNumRequests = 65;  // one request among 64 others

using Spec = testing::RequestSpec;

std::vector<Spec> make_workload() {
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

HarnessOptions base_options() {
  HarnessOptions options;
  options.num_pages = 64;  // 512 blocks: nothing is ever preempted
  options.scheduler.max_num_batched_tokens = 64;
  options.scheduler.max_num_sequences = 64;
  options.scheduler.prefill_chunk_size = 16;
  options.scheduler.max_preemptions = 100000;
  return options;
}

struct RunResult {
  std::vector<std::vector<int32_t>> outputs;
  EngineStats stats;
};

// Submits `specs` (all of them before the first step, or one more per step) and runs to the end,
// checking the engine's invariants after every step.
RunResult run(const HarnessOptions& options, std::span<const Spec> specs, bool staggered) {
  EngineHarness harness(options);
  Recorder recorder;
  std::vector<RequestId> ids;
  size_t submitted = 0;
  auto submit_one = [&] {
    Request request = to_request(specs[submitted++]);
    ids.push_back(*harness.engine().submit(recorder.attach(request)));
  };
  if (!staggered) {
    while (submitted < specs.size()) submit_one();
  }
  while (submitted < specs.size() || harness.engine().has_unfinished_requests()) {
    if (submitted < specs.size()) submit_one();
    harness.engine().step();
    harness.engine().check_invariants();
  }
  recorder.expect_each_finished_once(ids);
  RunResult result;
  for (RequestId id : ids) {
    const Completion completion = recorder.completion(id);
    EXPECT_NE(completion.reason, FinishReason::kError) << completion.error;
    result.outputs.push_back(recorder.stream(id).tokens);
  }
  harness.expect_all_blocks_free_or_cached();
  result.stats = harness.engine().stats();
  return result;
}

class EngineInvarianceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    specs_ = new std::vector<Spec>(make_workload());
    alone_ = new std::vector<std::vector<int32_t>>();
    for (const Spec& spec : *specs_) {
      alone_->push_back(run(base_options(), std::span<const Spec>(&spec, 1), false).outputs[0]);
    }
  }
  static void TearDownTestSuite() {
    delete specs_;
    delete alone_;
  }

  void expect_same_outputs(const RunResult& result, std::string_view configuration) {
    ASSERT_EQ(result.outputs.size(), specs_->size());
    for (size_t index = 0; index < specs_->size(); ++index) {
      EXPECT_EQ(result.outputs[index], (*alone_)[index])
          << configuration << ": request " << index << " differs from its run alone";
    }
  }

  static std::vector<Spec>* specs_;
  static std::vector<std::vector<int32_t>>* alone_;
};

std::vector<Spec>* EngineInvarianceTest::specs_ = nullptr;
std::vector<std::vector<int32_t>>* EngineInvarianceTest::alone_ = nullptr;

TEST_F(EngineInvarianceTest, AloneGreedyOutputsMatchTheIndependentReference) {
  for (size_t index = 0; index < specs_->size(); ++index) {
    const Spec& spec = (*specs_)[index];
    if (!spec.sampling.is_greedy()) continue;
    EXPECT_EQ((*alone_)[index], reference_greedy(base_options(), spec.prompt, spec.max_tokens))
        << "request " << index;
  }
}

TEST_F(EngineInvarianceTest, BatchedWithAmpleMemory) {
  for (bool chunked : {true, false}) {
    HarnessOptions options = base_options();
    options.scheduler.chunked_prefill = chunked;
    const RunResult result = run(options, *specs_, /*staggered=*/false);
    EXPECT_EQ(result.stats.preemptions_by_recompute + result.stats.preemptions_by_swap, 0);
    expect_same_outputs(result, chunked ? "ample memory, chunked" : "ample memory, unchunked");
  }
}

TEST_F(EngineInvarianceTest, UnderPreemptionByRecompute) {
  for (bool chunked : {true, false}) {
    for (bool staggered : {false, true}) {
      HarnessOptions options = base_options();
      options.num_pages = 6;  // 48 blocks of 8 tokens; the largest request needs 11
      options.scheduler.chunked_prefill = chunked;
      const RunResult result = run(options, *specs_, staggered);
      EXPECT_GT(result.stats.preemptions_by_recompute, 0) << "the KV budget must force preemption";
      EXPECT_GT(result.stats.prefix_cache_hit_blocks, 0) << "recompute should hit the cache";
      expect_same_outputs(result, chunked ? "recompute, chunked" : "recompute, unchunked");
    }
  }
}

TEST_F(EngineInvarianceTest, UnderPreemptionBySwap) {
  for (bool chunked : {true, false}) {
    for (int32_t swap_blocks : {256, 12}) {  // ample host memory, and too little (falls back)
      HarnessOptions options = base_options();
      options.num_pages = 6;
      options.swap_blocks = swap_blocks;
      options.scheduler.chunked_prefill = chunked;
      options.scheduler.preemption_mode = PreemptionMode::kSwap;
      const RunResult result = run(options, *specs_, /*staggered=*/false);
      EXPECT_GT(result.stats.preemptions_by_swap, 0) << "the KV budget must force swapping";
      if (swap_blocks == 12) {
        EXPECT_GT(result.stats.preemptions_by_recompute, 0);
      }
      expect_same_outputs(result, chunked ? "swap, chunked" : "swap, unchunked");
    }
  }
}

TEST_F(EngineInvarianceTest, WithTinyChunksAndBudget) {
  HarnessOptions options = base_options();
  options.num_pages = 5;
  options.scheduler.prefill_chunk_size = 3;
  options.scheduler.max_num_batched_tokens = 8;
  options.scheduler.max_num_sequences = 8;
  const RunResult result = run(options, *specs_, /*staggered=*/true);
  expect_same_outputs(result, "chunks of 3, budget 8");
}

}  // namespace
}  // namespace folio::engine
