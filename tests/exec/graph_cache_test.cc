// Graph cache statistics, their export as metrics, and pre-capture.
#include "folio/exec/graph_cache.h"

#include <gtest/gtest.h>

#include "exec_test_util.h"
#include "folio/device/host_virtual_memory.h"
#include "folio/memory/page_pool.h"

namespace folio::exec {
namespace {

using testing::StepGenerator;
using testing::TestModelState;

bool contains(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

class GraphCacheTest : public ::testing::Test {
 protected:
  std::unique_ptr<Executor> make(ExecutorOptions options) {
    return std::move(testing::make_executor(model_, model_.kv, pool_, *arena_.arena, options))
        .value();
  }

  testing::TestModelConfig config_;
  TestModelState model_ = TestModelState::create(config_, 1);
  ThreadPool pool_{2};
  testing::TestArena arena_ = testing::TestArena::create();
};

TEST_F(GraphCacheTest, StatisticsCountHitsMissesCapturesAndPadding) {
  metrics::Registry registry;
  ExecutorOptions options = testing::test_options(8, ExecutionMode::kGraph);
  options.name = "stats";
  options.metrics = &registry;
  options.bucket_ladder = {1, 2, 4, 8, 16};
  options.max_num_tokens = 64;
  std::unique_ptr<Executor> executor = make(options);
  StepGenerator generator(testing::GeneratorConfig::for_model(config_, 8), 5);
  // decode 3 -> 4 (miss), decode 3 -> 4 (hit), decode 4 -> 4 (hit), prefill 5+6 -> 16 (miss),
  // prefill 30 (above the ladder: eager).
  ASSERT_TRUE(executor->execute(generator.decode(3).view()).ok());
  ASSERT_TRUE(executor->execute(generator.decode(3).view()).ok());
  ASSERT_TRUE(executor->execute(generator.decode(4).view()).ok());
  ASSERT_TRUE(executor->execute(generator.step(0, std::vector<int32_t>{5, 6}).view()).ok());
  ASSERT_TRUE(executor->execute(generator.step(0, std::vector<int32_t>{30}).view()).ok());
  const GraphCacheStats stats = executor->stats();
  EXPECT_EQ(stats.hits, 2);
  EXPECT_EQ(stats.misses, 2);
  EXPECT_EQ(stats.captures, 2);
  EXPECT_EQ(stats.eager_fallbacks, 1);
  EXPECT_EQ(stats.capture_failures, 0);
  EXPECT_GT(stats.capture_seconds, 0.0);
  EXPECT_EQ(stats.real_tokens, 3 + 3 + 4 + 11 + 30);
  EXPECT_EQ(stats.padding_tokens, 1 + 1 + 0 + 5 + 0);
  EXPECT_DOUBLE_EQ(stats.padding_ratio(), 7.0 / 58.0);

  const std::string text = registry.render();
  EXPECT_TRUE(contains(text, "folio_graph_hits_total{executor=\"stats\"} 2\n")) << text;
  EXPECT_TRUE(contains(text, "folio_graph_misses_total{executor=\"stats\"} 2\n"));
  EXPECT_TRUE(contains(text, "folio_graph_captures_total{executor=\"stats\"} 2\n"));
  EXPECT_TRUE(contains(text, "folio_graph_eager_fallbacks_total{executor=\"stats\"} 1\n"));
  EXPECT_TRUE(contains(text, "folio_graph_padding_tokens_total{executor=\"stats\"} 7\n"));
  EXPECT_TRUE(contains(text, "folio_graph_padding_ratio{executor=\"stats\"} " +
                                 metrics::format_value(7.0 / 58.0) + "\n"))
      << text;
  // The gauge function goes with the executor.
  executor.reset();
  EXPECT_FALSE(contains(registry.render(), "folio_graph_padding_ratio"));
}

TEST_F(GraphCacheTest, PrecaptureTakesTheLargestBucketsFirstWithinTheBudget) {
  ExecutorOptions options = testing::test_options(8, ExecutionMode::kGraph);
  options.bucket_ladder = {1, 2, 4, 8, 16, 32};
  options.num_dummy_blocks = 1;
  std::unique_ptr<Executor> executor = make(options);
  const std::array<ir::StepPhase, 2> phases = {ir::StepPhase::kDecode, ir::StepPhase::kPrefill};
  EXPECT_EQ(std::move(executor->precapture(phases, 0.0)).value(), 0);
  EXPECT_EQ(std::move(executor->precapture(phases, 60.0)).value(), 12);
  EXPECT_EQ(executor->cache().size(), 12u);
  EXPECT_EQ(std::move(executor->precapture(phases, 60.0)).value(), 0);  // all cached
  const std::vector<ArenaView> views = arena_.arena->views();
  ASSERT_EQ(views.size(), 12u);
  for (const ArenaView& view : views) EXPECT_LE(view.bytes, views.front().bytes);
  // Precaptured programs serve steps: the first step of a bucket is a hit.
  StepGenerator generator(testing::GeneratorConfig::for_model(config_, 8), 1);
  const ir::StepOutput output = std::move(executor->execute(generator.decode(7).view())).value();
  EXPECT_FALSE(output.logits.empty());
  EXPECT_EQ(executor->last_step_path(), StepPath::kReplayed);
  EXPECT_EQ(executor->stats().misses, 0);
}

TEST_F(GraphCacheTest, ExecutorRejectsLadderPaddingMoreThanTheDummyBlocksHold) {
  ExecutorOptions options = testing::test_options(8, ExecutionMode::kGraph);
  options.bucket_ladder = {64};  // pads up to 63 tokens; one dummy block holds 16
  Result<std::unique_ptr<Executor>> executor =
      testing::make_executor(model_, model_.kv, pool_, *arena_.arena, options);
  EXPECT_EQ(executor.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(executor.status().message().find("padding blocks"), std::string::npos)
      << executor.status();
}

TEST_F(GraphCacheTest, CaptureWithoutArenaMemoryRunsTheStepEagerly) {
  auto vm = std::move(device::make_host_virtual_memory()).value();
  memory::PagePoolOptions pool_options;
  pool_options.page_size = 4096;
  pool_options.num_pages = 4;  // 16 KiB: enough for decode of 1 token, not of 16
  pool_options.thread_cache_pages = 0;
  auto page_pool = std::move(memory::PagePool::create(*vm, pool_options)).value();
  {
    auto arena = MultiShapeArena::create(std::make_unique<PoolArenaMemory>(*page_pool, 1));
    ExecutorOptions options = testing::test_options(16, ExecutionMode::kGraph);
    auto executor =
        std::move(testing::make_executor(model_, model_.kv, pool_, *arena, options)).value();
    StepGenerator generator(testing::GeneratorConfig::for_model(config_, 16), 3);
    const ir::StepOutput small = std::move(executor->execute(generator.decode(1).view())).value();
    EXPECT_FALSE(small.logits.empty());
    EXPECT_EQ(executor->last_step_path(), StepPath::kCapturedAndReplayed);
    const ir::StepOutput large = std::move(executor->execute(generator.decode(16).view())).value();
    EXPECT_FALSE(large.logits.empty());
    EXPECT_EQ(executor->last_step_path(), StepPath::kEagerFallback);
    EXPECT_EQ(executor->stats().capture_failures, 1);
    const ir::StepOutput again = std::move(executor->execute(generator.decode(1).view())).value();
    EXPECT_FALSE(again.logits.empty());
    EXPECT_EQ(executor->last_step_path(), StepPath::kReplayed);
  }
  page_pool->check_invariants();
}

}  // namespace
}  // namespace folio::exec
