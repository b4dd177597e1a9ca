// Captured programs against eager execution, bit for bit: randomized decode batches (full
// graphs) and mixed prefill + decode steps (piecewise programs), padding, new KV blocks in the
// middle of sequences, and lengths that differ from the ones seen at capture.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "exec_test_util.h"
#include "testing/lengths_captured_by_value.h"

namespace folio::exec {
namespace {

using testing::OwnedStep;
using testing::StepGenerator;
using testing::TestKvCache;
using testing::TestModelState;

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// A graph-mode executor and an eager one over the same weights, each with its own KV cache,
// fed the same steps.
class ReplayTest : public ::testing::Test {
 protected:
  void SetUp() override { configure({}); }

  void configure(const ExecutorOptions& overrides) {
    config_.num_blocks = 160;
    model_ = TestModelState::create(config_, 5);
    eager_kv_ = model_.fresh_kv();
    ExecutorOptions graph_options = testing::test_options(16, ExecutionMode::kGraph);
    graph_options.attention_capture_hook = overrides.attention_capture_hook;
    graph_options.metrics = overrides.metrics;
    graph_options.name = overrides.name;
    graph_ =
        std::move(testing::make_executor(model_, model_.kv, pool_, *arena_.arena, graph_options))
            .value();
    eager_ = std::move(testing::make_executor(model_, eager_kv_, pool_, *arena_.arena,
                                              testing::test_options(16, ExecutionMode::kEager)))
                 .value();
  }

  // Moves both executors to an arena on page-pool pages (the engine's configuration).
  void use_pool_arena() {
    graph_.reset();
    eager_.reset();
    arena_ = testing::TestArena::create_on_pool(2048);
    configure({});
  }

  // Runs `step` on both; true when the logits agree bit for bit.
  bool run_both(const OwnedStep& step, StepPath* path = nullptr) {
    Result<ir::StepOutput> replayed = graph_->execute(step.view());
    EXPECT_TRUE(replayed.ok()) << replayed.status();
    const std::vector<float> graph_logits(replayed->logits.begin(), replayed->logits.end());
    if (path != nullptr) *path = graph_->last_step_path();
    Result<ir::StepOutput> eager = eager_->execute(step.view());
    EXPECT_TRUE(eager.ok()) << eager.status();
    EXPECT_EQ(eager_->last_step_shape(), graph_->last_step_shape());
    return same_bits(graph_logits, eager->logits);
  }

  bool same_kv_caches() const {
    return model_.kv.memory.size() == eager_kv_.memory.size() &&
           std::memcmp(model_.kv.memory.data(), eager_kv_.memory.data(), eager_kv_.memory.size()) ==
               0;
  }

  testing::TestModelConfig config_;
  ThreadPool pool_{3};
  // The fault a test may inject; outlives the executors whose programs read its copies.
  folio::testing::LengthsCapturedByValue lengths_captured_by_value_;
  testing::TestArena arena_ = testing::TestArena::create();
  TestModelState model_;
  TestKvCache eager_kv_;
  std::unique_ptr<Executor> graph_;
  std::unique_ptr<Executor> eager_;
};

// Randomized decode batches, each counting how many steps replayed a bucket with context
// lengths other than those it was captured with; returns the number of mismatching steps.
struct DecodeScenario {
  int mismatches = 0;
  int replays_with_other_lengths = 0;
  int64_t blocks_added_mid_sequence = 0;
};

DecodeScenario run_decode_scenario(const Executor& graph, StepGenerator& generator,
                                   const std::function<bool(const OwnedStep&, StepPath*)>& run) {
  DecodeScenario scenario;
  std::map<int32_t, std::vector<int32_t>> lengths_at_capture;  // by padded size
  for (int i = 0; i < 60; ++i) {
    if (generator.num_live() > 12) generator.finish(static_cast<int32_t>(generator.random()() % 4));
    const auto batch = static_cast<int32_t>(1 + generator.random()() % 12);
    const OwnedStep step = generator.decode(batch);
    StepPath path = StepPath::kEager;
    if (!run(step, &path)) ++scenario.mismatches;
    const int32_t padded = graph.shape_for(step.num_tokens(), ir::StepPhase::kDecode).num_tokens;
    if (path == StepPath::kCapturedAndReplayed) lengths_at_capture[padded] = step.seq_lens;
    if (path == StepPath::kReplayed && lengths_at_capture[padded] != step.seq_lens) {
      ++scenario.replays_with_other_lengths;
    }
  }
  scenario.blocks_added_mid_sequence = generator.blocks_added_mid_sequence();
  return scenario;
}

TEST_F(ReplayTest, DecodeReplayEqualsEagerBitForBitOverRandomizedBatches) {
  StepGenerator generator(testing::GeneratorConfig::for_model(config_, 16), 21);
  const DecodeScenario scenario = run_decode_scenario(
      *graph_, generator,
      [this](const OwnedStep& step, StepPath* path) { return run_both(step, path); });
  EXPECT_EQ(scenario.mismatches, 0);
  EXPECT_TRUE(same_kv_caches());
  // The scenario exercised what it claims to.
  EXPECT_GT(scenario.replays_with_other_lengths, 20);
  EXPECT_GT(scenario.blocks_added_mid_sequence, 5);
  const GraphCacheStats stats = graph_->stats();
  EXPECT_GT(stats.hits, 40);
  EXPECT_GT(stats.padding_tokens, 0);
  EXPECT_EQ(stats.captures, stats.misses);
}

// The fault the test above exists for: attention reading context lengths captured by value.
// The same scenario must then disagree with eager execution.
TEST_F(ReplayTest, LengthsCapturedByValueBreakReplayAfterLengthsChange) {
  ExecutorOptions faulty;
  faulty.attention_capture_hook = &lengths_captured_by_value_;
  configure(faulty);
  StepGenerator generator(testing::GeneratorConfig::for_model(config_, 16), 21);
  const DecodeScenario scenario = run_decode_scenario(
      *graph_, generator,
      [this](const OwnedStep& step, StepPath* path) { return run_both(step, path); });
  EXPECT_GT(scenario.mismatches, 20);
  EXPECT_GT(lengths_captured_by_value_.num_redirected(), 0);
}

TEST_F(ReplayTest, DecodeReplayLaunchesNothingEagerly) {
  StepGenerator generator(testing::GeneratorConfig::for_model(config_, 16), 3);
  ASSERT_TRUE(run_both(generator.decode(5)));  // capture
  const size_t eager_launches = graph_->stream().num_eager_launches();
  const size_t replayed = graph_->stream().num_replayed_kernels();
  StepPath path = StepPath::kEager;
  ASSERT_TRUE(run_both(generator.decode(6), &path));  // same bucket (8)
  EXPECT_EQ(path, StepPath::kReplayed);
  EXPECT_EQ(graph_->stream().num_eager_launches(), eager_launches);
  EXPECT_GT(graph_->stream().num_replayed_kernels(), replayed);
}

TEST_F(ReplayTest, PiecewiseEqualsEagerForMixedPrefillAndDecodeSteps) {
  StepGenerator generator(testing::GeneratorConfig::for_model(config_, 16), 8);
  int mismatches = 0, replays = 0;
  for (int i = 0; i < 30; ++i) {
    if (generator.num_live() > 10) generator.finish(3);
    std::vector<int32_t> prefills;
    const auto num_prefills = static_cast<int>(1 + generator.random()() % 3);
    for (int p = 0; p < num_prefills; ++p) {
      prefills.push_back(static_cast<int32_t>(2 + generator.random()() % 20));
    }
    const auto live = static_cast<uint64_t>(generator.num_live());
    const auto decodes =
        static_cast<int32_t>(live == 0 ? 0 : generator.random()() % std::min<uint64_t>(live, 5));
    StepPath path = StepPath::kEager;
    if (!run_both(generator.step(decodes, prefills), &path)) ++mismatches;
    replays += path == StepPath::kReplayed ? 1 : 0;
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(replays, 5);
  EXPECT_TRUE(same_kv_caches());
  for (const Program* program : graph_->cache().programs()) {
    ASSERT_EQ(program->kind(), ProgramKind::kPiecewise);
    // graph, attention, graph, attention, graph: one runner per layer, pieces around them.
    EXPECT_EQ(program->num_attention_runners(), config_.model.num_layers);
    EXPECT_EQ(program->num_pieces(), config_.model.num_layers + 1);
    const auto instructions = program->instructions();
    for (size_t i = 0; i < instructions.size(); ++i) {
      EXPECT_EQ(instructions[i].kind, i % 2 == 0 ? Program::InstructionKind::kGraph
                                                 : Program::InstructionKind::kAttention);
    }
  }
}

TEST_F(ReplayTest, PiecewiseReplayLaunchesOnlyAttentionEagerly) {
  StepGenerator generator(testing::GeneratorConfig::for_model(config_, 16), 4);
  ASSERT_TRUE(run_both(generator.step(0, std::vector<int32_t>{7, 5})));  // capture bucket 16
  const size_t eager_launches = graph_->stream().num_eager_launches();
  StepPath path = StepPath::kEager;
  ASSERT_TRUE(run_both(generator.step(2, std::vector<int32_t>{9}), &path));  // 11 -> 16
  EXPECT_EQ(path, StepPath::kReplayed);
  EXPECT_EQ(graph_->stream().num_eager_launches() - eager_launches,
            static_cast<size_t>(config_.model.num_layers));
}

TEST_F(ReplayTest, GarbageInTheArenaBetweenReplaysChangesNoOutput) {
  use_pool_arena();
  StepGenerator generator(testing::GeneratorConfig::for_model(config_, 16), 13);
  int mismatches = 0;
  for (int i = 0; i < 24; ++i) {
    arena_.arena->scribble(1000 + static_cast<uint64_t>(i));
    const OwnedStep step = i % 3 == 0 ? generator.step(std::min(generator.num_live(), 2),
                                                       std::vector<int32_t>{3 + i % 7})
                                      : generator.decode(1 + i % 9);
    if (!run_both(step)) ++mismatches;
    if (generator.num_live() > 12) generator.finish(4);
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(graph_->stats().hits, 5);
  EXPECT_TRUE(same_kv_caches());
}

TEST_F(ReplayTest, MalformedStepIsAnErrorAndChangesNothing) {
  StepGenerator generator(testing::GeneratorConfig::for_model(config_, 16), 17);
  ASSERT_TRUE(run_both(generator.step(0, std::vector<int32_t>{6, 6})));
  OwnedStep bad = generator.decode(2);
  const OwnedStep good = bad;
  bad.slot_mapping[1] = bad.slot_mapping[0];  // two tokens, one slot
  Result<ir::StepOutput> rejected = graph_->execute(bad.view());
  EXPECT_EQ(rejected.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(rejected.status().message().find("slot"), std::string::npos) << rejected.status();
  bad = good;
  bad.token_ids[0] = static_cast<int32_t>(config_.model.vocab_size);
  EXPECT_EQ(graph_->execute(bad.view()).status().code(), StatusCode::kInvalidArgument);
  bad = good;
  bad.seq_lens[0] += 1;  // positions no longer end at the context length
  EXPECT_EQ(graph_->execute(bad.view()).status().code(), StatusCode::kInvalidArgument);
  const GraphCacheStats before = graph_->stats();
  EXPECT_TRUE(run_both(good));
  EXPECT_TRUE(same_kv_caches());
  EXPECT_EQ(graph_->stats().real_tokens, before.real_tokens + good.num_tokens());
}

TEST_F(ReplayTest, AddressesBoundAtCaptureStayValidAfterLaterCaptures) {
  StepGenerator generator(testing::GeneratorConfig::for_model(config_, 16), 29);
  ASSERT_TRUE(run_both(generator.decode(3)));  // captures decode bucket 4
  const Program* first = graph_->cache().find(BucketKey{4, ir::StepPhase::kDecode});
  ASSERT_NE(first, nullptr);
  const ArenaView first_view = first->view();
  const std::vector<std::byte*> bound(first->addresses().begin(), first->addresses().end());
  // Later captures, larger (the physical arena grows) and smaller, of both phases.
  ASSERT_TRUE(run_both(generator.step(2, std::vector<int32_t>{60, 40})));  // prefill, 112
  ASSERT_TRUE(run_both(generator.decode(16)));
  ASSERT_TRUE(run_both(generator.decode(2)));
  ASSERT_TRUE(run_both(generator.step(1, std::vector<int32_t>{5})));
  ASSERT_GE(graph_->cache().size(), 5u);

  // The first program's bindings are unchanged, and its activations lie in its own view.
  EXPECT_EQ(bound, std::vector<std::byte*>(first->addresses().begin(), first->addresses().end()));
  for (const ir::TensorInfo& tensor : first->graph().graph().tensors()) {
    if (tensor.residency != ir::Residency::kActivation) continue;
    std::byte* address = bound[static_cast<size_t>(tensor.id.value())];
    EXPECT_GE(address, first_view.base) << tensor.name;
    EXPECT_LE(address + tensor.bytes(), first_view.base + first_view.bytes) << tensor.name;
  }
  // Views never overlap.
  std::vector<ArenaView> views = arena_.arena->views();
  std::sort(views.begin(), views.end(),
            [](const ArenaView& a, const ArenaView& b) { return a.base < b.base; });
  for (size_t i = 1; i < views.size(); ++i) {
    EXPECT_LE(views[i - 1].base + views[i - 1].bytes, views[i].base);
  }
  // The first view still maps the shared physical arena: bytes written through it are read
  // through the largest view at the same offset.
  const ArenaView largest =
      *std::max_element(views.begin(), views.end(),
                        [](const ArenaView& a, const ArenaView& b) { return a.bytes < b.bytes; });
  ASSERT_GT(largest.bytes, first_view.bytes);
  const uint64_t marker = 0x0123456789abcdefu;
  std::memcpy(first_view.base + first_view.bytes - sizeof(marker), &marker, sizeof(marker));
  EXPECT_EQ(std::memcmp(largest.base + first_view.bytes - sizeof(marker), &marker, sizeof(marker)),
            0);
  // And the first program still replays correctly.
  StepPath path = StepPath::kEager;
  EXPECT_TRUE(run_both(generator.decode(4), &path));
  EXPECT_EQ(path, StepPath::kReplayed);
}

TEST(ExecutorTest, StepsAboveTheLargestBucketRunEagerly) {
  testing::TestModelConfig config;
  TestModelState model = TestModelState::create(config, 2);
  TestKvCache eager_kv = model.fresh_kv();
  ThreadPool pool(2);
  testing::TestArena arena = testing::TestArena::create();
  ExecutorOptions options = testing::test_options(8, ExecutionMode::kGraph);
  options.bucket_ladder = {1, 2, 4, 8};
  options.max_num_tokens = 32;
  auto graph =
      std::move(testing::make_executor(model, model.kv, pool, *arena.arena, options)).value();
  options.mode = ExecutionMode::kEager;
  auto eager =
      std::move(testing::make_executor(model, eager_kv, pool, *arena.arena, options)).value();
  StepGenerator generator(testing::GeneratorConfig::for_model(config, 8), 9);
  const OwnedStep step = generator.step(0, std::vector<int32_t>{12, 8});
  Result<ir::StepOutput> fallback = graph->execute(step.view());
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_EQ(graph->last_step_path(), StepPath::kEagerFallback);
  EXPECT_EQ(graph->last_step_shape().num_tokens, 20);  // unpadded
  const std::vector<float> logits(fallback->logits.begin(), fallback->logits.end());
  EXPECT_TRUE(same_bits(logits, std::move(eager->execute(step.view())).value().logits));
  EXPECT_EQ(graph->stats().eager_fallbacks, 1);
  EXPECT_EQ(graph->stats().captures, 0);
  const OwnedStep too_large = generator.step(0, std::vector<int32_t>{33});
  EXPECT_EQ(graph->execute(too_large.view()).status().code(), StatusCode::kInvalidArgument);
}

// Rows of real tokens do not depend on the padding around them (f16 weights: every kernel's
// row result is independent of the row count).
TEST(ExecutorTest, PaddingDoesNotChangeRealLogits) {
  testing::TestModelConfig config;
  config.model.weight_dtype = DType::kF16;
  TestModelState model = TestModelState::create(config, 4);
  TestKvCache exact_kv = model.fresh_kv();
  ThreadPool pool(2);
  testing::TestArena arena = testing::TestArena::create();
  ExecutorOptions padded_options = testing::test_options(8, ExecutionMode::kGraph);
  padded_options.bucket_ladder = {8, 16, 32};
  ExecutorOptions exact_options = testing::test_options(8, ExecutionMode::kEager);
  exact_options.bucket_ladder.clear();  // every size a bucket: no padding
  for (int32_t size = 1; size <= 32; ++size) exact_options.bucket_ladder.push_back(size);
  auto padded =
      std::move(testing::make_executor(model, model.kv, pool, *arena.arena, padded_options))
          .value();
  auto exact =
      std::move(testing::make_executor(model, exact_kv, pool, *arena.arena, exact_options)).value();
  StepGenerator generator(testing::GeneratorConfig::for_model(config, 8), 6);
  for (int i = 0; i < 10; ++i) {
    const OwnedStep step = i % 2 == 0 ? generator.step(std::min(generator.num_live(), 3),
                                                       std::vector<int32_t>{1 + 3 * i})
                                      : generator.decode(1 + i % 8);
    Result<ir::StepOutput> a = padded->execute(step.view());
    ASSERT_TRUE(a.ok()) << a.status();
    const std::vector<float> padded_logits(a->logits.begin(), a->logits.end());
    Result<ir::StepOutput> b = exact->execute(step.view());
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(exact->last_step_shape().num_tokens, step.num_tokens());
    EXPECT_TRUE(same_bits(padded_logits, b->logits)) << "step " << i;
  }
}

}  // namespace
}  // namespace folio::exec
