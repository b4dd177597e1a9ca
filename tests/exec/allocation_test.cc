// Replay allocates nothing: once a bucket is captured (and the executor's scratch has grown),
// a step that hits the cache runs validation, input copies, padding and the replay without one
// heap allocation. This binary replaces the global operator new to count allocations.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "exec_test_util.h"

namespace {

std::atomic<int64_t> g_allocations{0};

void* counted_allocate(size_t bytes, size_t alignment) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  void* pointer =
      alignment <= alignof(std::max_align_t)
          ? std::malloc(bytes == 0 ? 1 : bytes)
          : std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
  if (pointer == nullptr) throw std::bad_alloc();
  return pointer;
}

// Out of line, so the compiler does not pair this free() with a `new` it inlined elsewhere
// (-Wmismatched-new-delete): the replaced operator new does allocate with malloc.
__attribute__((noinline)) void counted_release(void* pointer) {
  std::free(pointer);
}

}  // namespace

void* operator new(size_t bytes) {
  return counted_allocate(bytes, alignof(std::max_align_t));
}
void* operator new[](size_t bytes) {
  return counted_allocate(bytes, alignof(std::max_align_t));
}
void* operator new(size_t bytes, std::align_val_t alignment) {
  return counted_allocate(bytes, static_cast<size_t>(alignment));
}
void* operator new[](size_t bytes, std::align_val_t alignment) {
  return counted_allocate(bytes, static_cast<size_t>(alignment));
}
void operator delete(void* pointer) noexcept {
  counted_release(pointer);
}
void operator delete[](void* pointer) noexcept {
  counted_release(pointer);
}
void operator delete(void* pointer, size_t) noexcept {
  counted_release(pointer);
}
void operator delete[](void* pointer, size_t) noexcept {
  counted_release(pointer);
}
void operator delete(void* pointer, std::align_val_t) noexcept {
  counted_release(pointer);
}
void operator delete[](void* pointer, std::align_val_t) noexcept {
  counted_release(pointer);
}
void operator delete(void* pointer, size_t, std::align_val_t) noexcept {
  counted_release(pointer);
}
void operator delete[](void* pointer, size_t, std::align_val_t) noexcept {
  counted_release(pointer);
}

namespace folio::exec {
namespace {

TEST(AllocationTest, ReplayedStepsAllocateNothing) {
  testing::TestModelConfig config;
  config.num_blocks = 64;
  const testing::TestModelState model = testing::TestModelState::create(config, 1);
  testing::TestKvCache kv = model.fresh_kv();
  ThreadPool pool(2);
  testing::TestArena arena = testing::TestArena::create();
  auto executor = std::move(testing::make_executor(model, kv, pool, *arena.arena,
                                                   testing::test_options(8, ExecutionMode::kGraph)))
                      .value();
  testing::StepGenerator generator(testing::GeneratorConfig::for_model(config, 8), 2);
  // Capture a decode bucket and a prefill bucket.
  ASSERT_TRUE(executor->execute(generator.decode(6).view()).ok());
  ASSERT_TRUE(executor->execute(generator.step(1, std::vector<int32_t>{9}).view()).ok());
  std::vector<testing::OwnedStep> steps;
  for (int i = 0; i < 6; ++i) {
    steps.push_back(i % 2 == 0 ? generator.decode(5 + i / 2)
                               : generator.step(2, std::vector<int32_t>{6 + i}));
  }
  for (const testing::OwnedStep& step : steps) {
    const int64_t before = g_allocations.load();
    Result<ir::StepOutput> output = executor->execute(step.view());
    const int64_t allocations = g_allocations.load() - before;
    ASSERT_TRUE(output.ok()) << output.status();
    EXPECT_EQ(executor->last_step_path(), StepPath::kReplayed);
    EXPECT_EQ(allocations, 0) << "step of " << step.num_tokens() << " tokens";
  }
  // The counter does count: an eager step allocates its activations.
  ExecutorOptions eager_options = testing::test_options(8, ExecutionMode::kEager);
  testing::TestKvCache eager_kv = model.fresh_kv();
  auto eager =
      std::move(testing::make_executor(model, eager_kv, pool, *arena.arena, eager_options)).value();
  const int64_t before = g_allocations.load();
  ASSERT_TRUE(eager->execute(steps[0].view()).ok());
  EXPECT_GT(g_allocations.load() - before, 10);
}

}  // namespace
}  // namespace folio::exec
