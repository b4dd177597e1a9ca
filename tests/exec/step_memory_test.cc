// The executor's memory inside the page pool (issue 14): persistent buffers and eager steps take
// pool pages (and a pool too small for an eager step gives kResourceExhausted with the pool
// unchanged), and release_idle_memory gives graph-arena pages back while physical arena bytes
// stay equal to the largest live capture, with recaptured programs bit for bit equal to eager
// execution.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>

#include "exec_test_util.h"
#include "folio/device/host_virtual_memory.h"

namespace folio::exec {
namespace {

using memory::ContentType;
using testing::OwnedStep;
using testing::StepGenerator;
using testing::TestModelState;

constexpr size_t kPage = 4096;

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

const memory::ContentStats& content(const memory::PoolStats& stats, ContentType type) {
  return stats.per_content[static_cast<size_t>(memory::content_index(type))];
}

// A host pool of 4 KiB pages without thread caches (so page counts compare exactly).
struct HostPool {
  std::unique_ptr<device::VirtualMemory> vm;
  std::unique_ptr<memory::PagePool> pool;

  static HostPool create(int64_t num_pages) {
    HostPool host;
    host.vm = std::move(device::make_host_virtual_memory()).value();
    memory::PagePoolOptions options;
    options.name = "step_memory_test";
    options.page_size = kPage;
    options.num_pages = num_pages;
    options.thread_cache_pages = 0;
    host.pool = std::move(memory::PagePool::create(*host.vm, options)).value();
    return host;
  }
};

// Page counts a failed step must leave as they were.
struct PageCounts {
  int64_t free = 0, pinned = 0, unpinned = 0, temporary = 0, activation = 0;
  friend bool operator==(const PageCounts&, const PageCounts&) = default;

  static PageCounts of(const memory::PagePool& pool) {
    const memory::PoolStats stats = pool.stats();
    return PageCounts{stats.pages_free, stats.pages_pinned, stats.pages_unpinned,
                      content(stats, ContentType::kTemporary).pages_in_use,
                      content(stats, ContentType::kActivation).pages_in_use};
  }
};

class StepMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.num_blocks = 96;
    model_ = TestModelState::create(config_, 11);
  }

  // An eager executor whose own memory comes from `pool`, on a fresh KV cache.
  Result<std::unique_ptr<Executor>> eager_on(memory::PagePool& pool, testing::TestKvCache& kv) {
    return testing::make_executor(model_, kv, threads_, *dedicated_.arena, pool,
                                  testing::test_options(8, ExecutionMode::kEager));
  }

  // A graph-mode executor on the shared test pool and the model's own KV cache: the reference
  // an eager step's bits are compared with.
  std::unique_ptr<Executor> reference_executor() {
    return std::move(testing::make_executor(model_, model_.kv, threads_, *dedicated_.arena,
                                            testing::test_options(8, ExecutionMode::kGraph)))
        .value();
  }

  testing::TestModelConfig config_;
  TestModelState model_;
  ThreadPool threads_{2};
  testing::TestArena dedicated_ = testing::TestArena::create();
};

TEST_F(StepMemoryTest, EagerStepsTakeTheirMemoryFromThePool) {
  HostPool host = HostPool::create(16384);
  testing::TestKvCache kv = model_.fresh_kv();
  std::unique_ptr<Executor> eager = std::move(eager_on(*host.pool, kv)).value();
  // A graph-mode executor on the shared test pool, fed the same steps: the reference.
  std::unique_ptr<Executor> graph = reference_executor();

  // Persistent inputs and outputs: pinned temporary pages, nothing else yet.
  memory::PoolStats stats = host.pool->stats();
  const int64_t persistent_pages = content(stats, ContentType::kTemporary).pages_pinned;
  EXPECT_GT(persistent_pages, 0);
  EXPECT_EQ(stats.pages_pinned, persistent_pages);
  EXPECT_EQ(content(stats, ContentType::kActivation).pages_in_use, 0);

  StepGenerator generator(testing::GeneratorConfig::for_model(config_, 8), 4);
  const std::array<int32_t, 2> prompts = {30, 17};
  const OwnedStep prefill = generator.step(0, prompts);
  Result<ir::StepOutput> eager_output = eager->execute(prefill.view());
  ASSERT_TRUE(eager_output.ok()) << eager_output.status();
  const std::vector<float> eager_logits(eager_output->logits.begin(), eager_output->logits.end());
  Result<ir::StepOutput> graph_output = graph->execute(prefill.view());
  ASSERT_TRUE(graph_output.ok()) << graph_output.status();
  EXPECT_TRUE(same_bits(eager_logits, graph_output->logits));

  // The step's activations: activation pages, kept pinned for the next eager step; its outputs:
  // more pinned temporary pages.
  stats = host.pool->stats();
  const int64_t activation_pages = content(stats, ContentType::kActivation).pages_in_use;
  EXPECT_GT(activation_pages, 0);
  EXPECT_EQ(content(stats, ContentType::kActivation).pages_pinned, activation_pages);
  // Exactly the plan's peak, in whole pages.
  const int64_t planned =
      std::move(eager->step_activation_bytes(prefill.num_tokens(), ir::StepPhase::kPrefill))
          .value();
  EXPECT_EQ(activation_pages,
            (planned + static_cast<int64_t>(kPage) - 1) / static_cast<int64_t>(kPage));
  EXPECT_FALSE(eager->step_activation_bytes(0, ir::StepPhase::kPrefill).ok());
  EXPECT_GT(content(stats, ContentType::kTemporary).pages_pinned, persistent_pages);
  EXPECT_EQ(static_cast<int64_t>(eager->eager_pool_bytes()),
            (stats.pages_pinned - persistent_pages) * static_cast<int64_t>(kPage));
  host.pool->check_invariants();

  // Released as idle, the eager memory goes back to the pool; the next eager step allocates it
  // again and still agrees with replay bit for bit.
  EXPECT_EQ(std::move(eager->release_idle_memory(0)).value(),
            (stats.pages_pinned - persistent_pages) * static_cast<int64_t>(kPage));
  stats = host.pool->stats();
  EXPECT_EQ(content(stats, ContentType::kActivation).pages_in_use, 0);
  EXPECT_EQ(stats.pages_pinned, persistent_pages);
  for (int i = 0; i < 3; ++i) {
    const OwnedStep decode = generator.decode(2);
    eager_output = eager->execute(decode.view());
    ASSERT_TRUE(eager_output.ok()) << eager_output.status();
    const std::vector<float> logits(eager_output->logits.begin(), eager_output->logits.end());
    graph_output = graph->execute(decode.view());
    ASSERT_TRUE(graph_output.ok()) << graph_output.status();
    EXPECT_TRUE(same_bits(logits, graph_output->logits)) << "decode step " << i;
    EXPECT_GT(content(host.pool->stats(), ContentType::kActivation).pages_in_use, 0);
  }
  host.pool->check_invariants();
}

// The KV cache's pages interleave with free ones: no two free pages are adjacent, yet an eager
// step needing many pages gets them (mapped into one virtual range) and computes the same bits.
TEST_F(StepMemoryTest, EagerStepsRunOnAFragmentedPool) {
  HostPool host = HostPool::create(4096);
  testing::TestKvCache kv = model_.fresh_kv();
  std::unique_ptr<Executor> eager = std::move(eager_on(*host.pool, kv)).value();
  std::unique_ptr<Executor> graph = reference_executor();
  std::vector<memory::PageAllocation> others;
  memory::PageAllocationRequest request;
  request.content = ContentType::kKvCache;
  request.owner = 2;
  for (Result<memory::PageAllocation> page = host.pool->allocate(request); page.ok();
       page = host.pool->allocate(request)) {
    others.push_back(std::move(page).value());
  }
  for (size_t i = 0; i < others.size(); i += 2) others[i] = memory::PageAllocation();
  ASSERT_EQ(host.pool->stats().largest_free_extent, 1);

  StepGenerator generator(testing::GeneratorConfig::for_model(config_, 8), 6);
  const std::array<int32_t, 2> prompts = {60, 44};
  const OwnedStep prefill = generator.step(0, prompts);
  Result<ir::StepOutput> eager_output = eager->execute(prefill.view());
  ASSERT_TRUE(eager_output.ok()) << eager_output.status();
  const std::vector<float> eager_logits(eager_output->logits.begin(), eager_output->logits.end());
  Result<ir::StepOutput> graph_output = graph->execute(prefill.view());
  ASSERT_TRUE(graph_output.ok()) << graph_output.status();
  EXPECT_TRUE(same_bits(eager_logits, graph_output->logits));
  EXPECT_GT(content(host.pool->stats(), ContentType::kActivation).pages_in_use, 2);
  host.pool->check_invariants();
  eager.reset();
  host.pool->check_invariants();
}

TEST_F(StepMemoryTest, PoolTooSmallForAnEagerStepIsResourceExhaustedAndChangesNothing) {
  StepGenerator generator(testing::GeneratorConfig::for_model(config_, 8), 9);
  const std::array<int32_t, 1> prompt = {48};
  const OwnedStep step = generator.step(0, prompt);

  // What the step needs, measured on a large pool.
  PageCounts persistent, after_step;
  {
    HostPool host = HostPool::create(16384);
    testing::TestKvCache kv = model_.fresh_kv();
    std::unique_ptr<Executor> eager = std::move(eager_on(*host.pool, kv)).value();
    persistent = PageCounts::of(*host.pool);
    ASSERT_TRUE(eager->execute(step.view()).ok());
    after_step = PageCounts::of(*host.pool);
  }
  const int64_t needed = after_step.temporary + after_step.activation;
  ASSERT_GT(after_step.activation, 0);
  ASSERT_GT(after_step.temporary, persistent.temporary);

  // One page short: the step fails cleanly, again and again, and the pool is as it was.
  {
    HostPool host = HostPool::create(needed - 1);
    testing::TestKvCache kv = model_.fresh_kv();
    std::unique_ptr<Executor> eager = std::move(eager_on(*host.pool, kv)).value();
    const PageCounts before = PageCounts::of(*host.pool);
    EXPECT_EQ(before.temporary, persistent.temporary);
    for (int attempt = 0; attempt < 2; ++attempt) {
      Result<ir::StepOutput> output = eager->execute(step.view());
      ASSERT_FALSE(output.ok());
      EXPECT_EQ(output.status().code(), StatusCode::kResourceExhausted) << output.status();
      EXPECT_NE(output.status().message().find("eager step"), std::string::npos) << output.status();
      EXPECT_EQ(PageCounts::of(*host.pool), before);
      host.pool->check_invariants();
    }
  }
  // Exactly enough: it runs.
  {
    HostPool host = HostPool::create(needed);
    testing::TestKvCache kv = model_.fresh_kv();
    std::unique_ptr<Executor> eager = std::move(eager_on(*host.pool, kv)).value();
    EXPECT_TRUE(eager->execute(step.view()).ok());
  }
  // Not even the persistent buffers fit: creation fails the same way.
  {
    HostPool host = HostPool::create(1);
    testing::TestKvCache kv = model_.fresh_kv();
    Result<std::unique_ptr<Executor>> eager = eager_on(*host.pool, kv);
    ASSERT_FALSE(eager.ok());
    EXPECT_EQ(eager.status().code(), StatusCode::kResourceExhausted) << eager.status();
  }
}

// A graph executor whose arena, persistent buffers and scratch share one pool (the engine's
// configuration), and an eager executor fed the same steps as the reference.
class ReleaseIdleCapturesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.num_blocks = 96;
    config_.max_blocks_per_sequence = 16;  // prompts of 100 tokens
    model_ = TestModelState::create(config_, 12);
    eager_kv_ = model_.fresh_kv();
    arena_ = testing::TestArena::create_on_pool(8192);
    graph_ =
        std::move(testing::make_executor(model_, model_.kv, threads_, *arena_.arena, *arena_.pool,
                                         testing::test_options(8, ExecutionMode::kGraph)))
            .value();
    eager_ = std::move(testing::make_executor(model_, eager_kv_, threads_, *arena_.arena,
                                              testing::test_options(8, ExecutionMode::kEager)))
                 .value();
  }

  // Runs `step` on both executors; true when the logits agree bit for bit.
  bool run_both(const OwnedStep& step) {
    Result<ir::StepOutput> replayed = graph_->execute(step.view());
    EXPECT_TRUE(replayed.ok()) << replayed.status();
    const std::vector<float> graph_logits(replayed->logits.begin(), replayed->logits.end());
    Result<ir::StepOutput> eager = eager_->execute(step.view());
    EXPECT_TRUE(eager.ok()) << eager.status();
    return same_bits(graph_logits, eager->logits);
  }

  // Physical arena bytes = the largest live view (views are whole pages), and the pool's
  // graph-arena pages say the same.
  void expect_arena_at_largest_capture() {
    const ArenaStats stats = arena_.arena->stats();
    EXPECT_EQ(stats.physical_bytes, stats.largest_view_bytes);
    EXPECT_EQ(std::move(arena_.arena->measured_physical_bytes()).value(), stats.physical_bytes);
    size_t largest_program = 0;
    for (const Program* program : graph_->cache().programs()) {
      largest_program = std::max(largest_program, program->view().bytes);
    }
    EXPECT_EQ(stats.largest_view_bytes, largest_program);
    arena_.pool->check_invariants();
  }

  testing::TestModelConfig config_;
  TestModelState model_;
  testing::TestKvCache eager_kv_;
  ThreadPool threads_{2};
  testing::TestArena arena_;
  std::unique_ptr<Executor> graph_;
  std::unique_ptr<Executor> eager_;
};

TEST_F(ReleaseIdleCapturesTest, GivesPagesBackKeepsTheInvariantAndRecapturesBitForBit) {
  StepGenerator generator(testing::GeneratorConfig::for_model(config_, 8), 17);
  const std::array<int32_t, 1> long_prompt = {100};
  // A large prefill bucket first (the arena grows to it), then small decode steps only.
  ASSERT_TRUE(run_both(generator.step(0, long_prompt)));
  const size_t large_physical = arena_.arena->stats().physical_bytes;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(run_both(generator.decode(1)));
  ASSERT_EQ(graph_->cache().size(), 2u);
  expect_arena_at_largest_capture();
  EXPECT_EQ(arena_.arena->stats().physical_bytes, large_physical);

  // Bad input changes nothing.
  Result<int64_t> rejected = graph_->release_idle_memory(-1);
  ASSERT_FALSE(rejected.ok());
  EXPECT_EQ(rejected.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(graph_->cache().size(), 2u);

  // The prefill bucket has been idle for 5 steps, the decode bucket for 0: only the first goes,
  // and the arena shrinks to the decode capture (its view remapped onto a smaller run).
  EXPECT_EQ(std::move(graph_->release_idle_memory(6)).value(), 0);
  EXPECT_EQ(graph_->cache().size(), 2u);
  const int64_t released = std::move(graph_->release_idle_memory(5)).value();
  EXPECT_EQ(graph_->cache().size(), 1u);
  const ArenaStats shrunk = arena_.arena->stats();
  EXPECT_EQ(released, static_cast<int64_t>(large_physical - shrunk.physical_bytes));
  EXPECT_GT(released, 0);
  EXPECT_EQ(shrunk.num_views, 1);
  expect_arena_at_largest_capture();
  EXPECT_EQ(graph_->stats().programs_released, 1);
  EXPECT_EQ(graph_->stats().bytes_released, released);
  EXPECT_EQ(graph_->stats().idle_releases, 1);
  // The live view now maps the pool pages the arena holds (not the run it gave back): bytes
  // written through the view are read at the arena allocation's pages.
  {
    arena_.arena->scribble(99);
    const std::vector<ArenaView> views = arena_.arena->views();
    ASSERT_EQ(views.size(), 1u);
    const memory::PagePool& pool = *arena_.pool;
    std::optional<memory::PageId> arena_page;
    for (int32_t page = 0; page < pool.num_pages() && !arena_page; ++page) {
      const memory::PageInfo info = std::move(pool.page_info(memory::PageId(page))).value();
      if (info.state == memory::PageState::kPinned && info.content == ContentType::kGraphArena) {
        arena_page = info.run_first_page;
      }
    }
    ASSERT_TRUE(arena_page.has_value());
    EXPECT_EQ(std::memcmp(views[0].base, pool.page_address(*arena_page), views[0].bytes), 0);
  }

  // The decode program replays through remapped memory; the prefill bucket is captured again.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(run_both(generator.decode(1)));
    EXPECT_EQ(graph_->last_step_path(), StepPath::kReplayed);
  }
  const std::array<int32_t, 1> another_prompt = {97};
  ASSERT_TRUE(run_both(generator.step(0, another_prompt)));
  EXPECT_EQ(graph_->last_step_path(), StepPath::kCapturedAndReplayed);
  expect_arena_at_largest_capture();
  EXPECT_EQ(arena_.arena->stats().physical_bytes, large_physical);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(run_both(generator.step(1, another_prompt)));

  // Everything idle: the arena holds no page.
  EXPECT_EQ(std::move(graph_->release_idle_memory(0)).value(),
            static_cast<int64_t>(large_physical));
  EXPECT_EQ(graph_->cache().size(), 0u);
  EXPECT_EQ(arena_.arena->stats().physical_bytes, 0u);
  const memory::PoolStats pool = arena_.pool->stats();
  EXPECT_EQ(content(pool, ContentType::kGraphArena).pages_in_use, 0);
  ASSERT_TRUE(run_both(generator.decode(2)));
  EXPECT_EQ(graph_->last_step_path(), StepPath::kCapturedAndReplayed);
  expect_arena_at_largest_capture();
}

}  // namespace
}  // namespace folio::exec
