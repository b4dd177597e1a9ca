// The multi-shape arena: views share physical memory, physical bytes stay at the largest
// capture across a sweep of buckets (measured by the operating system for dedicated memory, by
// the page pool's own accounting for pool pages), the per-capture baseline grows with the sum,
// every address bound at capture stays valid after later captures, and running out of arena
// memory makes a step run eagerly without disturbing existing programs.
#include "folio/exec/multi_shape_arena.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "exec_test_util.h"
#include "folio/device/host_virtual_memory.h"
#include "folio/memory/page_pool.h"

namespace folio::exec {
namespace {

using testing::OwnedStep;
using testing::StepGenerator;
using testing::TestModelState;

std::unique_ptr<device::VirtualMemory> host_vm() {
  return std::move(device::make_host_virtual_memory()).value();
}

std::unique_ptr<memory::PagePool> test_pool(device::VirtualMemory& vm, int64_t num_pages) {
  memory::PagePoolOptions options;
  options.name = "arena_test";
  options.page_size = 4096;
  options.num_pages = num_pages;
  options.thread_cache_pages = 0;
  return std::move(memory::PagePool::create(vm, options)).value();
}

TEST(MultiShapeArenaTest, SharedViewsMapTheSamePhysicalBytes) {
  auto vm = host_vm();
  auto arena = MultiShapeArena::create(std::make_unique<DedicatedArenaMemory>(*vm));
  const size_t page = vm->granularity();
  const ArenaView small = std::move(arena->create_view(3 * page - 100)).value();
  const ArenaView large = std::move(arena->create_view(7 * page)).value();
  const ArenaView medium = std::move(arena->create_view(5 * page)).value();
  EXPECT_EQ(small.bytes, 3 * page);
  EXPECT_NE(small.base, large.base);
  std::memset(large.base, 0x5a, large.bytes);
  const char message[] = "written through the smallest view";
  std::memcpy(small.base + page + 17, message, sizeof(message));
  EXPECT_EQ(std::memcmp(large.base + page + 17, message, sizeof(message)), 0);
  EXPECT_EQ(std::memcmp(medium.base + page + 17, message, sizeof(message)), 0);
  EXPECT_EQ(static_cast<unsigned char>(medium.base[5 * page - 1]), 0x5a);
  const ArenaStats stats = arena->stats();
  EXPECT_EQ(stats.num_views, 3);
  EXPECT_EQ(stats.physical_bytes, 7 * page);
  EXPECT_EQ(stats.virtual_bytes, 15 * page);
  EXPECT_EQ(std::move(arena->measured_physical_bytes()).value(), 7 * page);
}

TEST(MultiShapeArenaTest, PrivateViewsHaveMemoryOfTheirOwn) {
  auto vm = host_vm();
  auto arena = MultiShapeArena::create(std::make_unique<DedicatedArenaMemory>(*vm),
                                       ArenaSharing::kPrivatePerView);
  const size_t page = vm->granularity();
  const ArenaView first = std::move(arena->create_view(2 * page)).value();
  const ArenaView second = std::move(arena->create_view(3 * page)).value();
  std::memset(first.base, 1, first.bytes);
  std::memset(second.base, 2, second.bytes);
  EXPECT_EQ(first.base[0], std::byte{1});
  EXPECT_EQ(std::move(arena->measured_physical_bytes()).value(), 5 * page);
}

TEST(MultiShapeArenaTest, PoolPagesBackTheArenaAndAreCountedAsGraphArena) {
  auto vm = host_vm();
  auto pool = test_pool(*vm, 64);
  const size_t pool_file_bytes = std::move(vm->resident_bytes(pool->physical_memory())).value();
  auto arena = MultiShapeArena::create(std::make_unique<PoolArenaMemory>(*pool, 1));
  const ArenaView a = std::move(arena->create_view(5 * 4096)).value();
  const ArenaView b = std::move(arena->create_view(9 * 4096)).value();
  std::memcpy(a.base + 4096, "pool", 4);
  EXPECT_EQ(std::memcmp(b.base + 4096, "pool", 4), 0);
  const memory::PoolStats stats = pool->stats();
  EXPECT_EQ(stats.per_content[memory::content_index(memory::ContentType::kGraphArena)].pages_pinned,
            9);
  EXPECT_EQ(std::move(arena->measured_physical_bytes()).value(), 9u * 4096);
  // Nothing was allocated behind the pool's back: its memory file is as large as before.
  EXPECT_EQ(std::move(vm->resident_bytes(pool->physical_memory())).value(), pool_file_bytes);
  // The KV cache takes most of the one budget; a view larger than what is left is an error that
  // leaves existing views alone.
  memory::PageAllocationRequest kv_pages;
  kv_pages.num_pages = 40;
  kv_pages.content = memory::ContentType::kKvCache;
  memory::PageAllocation kv = std::move(pool->allocate(kv_pages)).value();
  EXPECT_EQ(arena->create_view(30 * 4096).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(std::memcmp(a.base + 4096, "pool", 4), 0);
  EXPECT_EQ(arena->stats().num_views, 2);
  pool->check_invariants();
}

// Captures the decode programs of buckets 256 down to 128 tokens in steps of 16 and returns the
// planned bytes of each.
std::vector<size_t> capture_sweep(MultiShapeArena& arena, bool ascending) {
  testing::TestModelConfig config;
  config.num_blocks = 64;
  TestModelState model = TestModelState::create(config, 3);
  ThreadPool pool(2);
  ExecutorOptions options = testing::test_options(16, ExecutionMode::kGraph);
  options.bucket_ladder.clear();
  for (int32_t size = 128; size <= 256; size += 16) options.bucket_ladder.push_back(size);
  options.num_dummy_blocks = 16;  // single-bucket ladders below pad up to 255 tokens
  if (ascending) {
    // Ascending capture through steps of growing size instead of precapture's largest first.
    options.bucket_ladder = {128};
  }
  std::vector<size_t> planned;
  auto executor = std::move(testing::make_executor(model, model.kv, pool, arena, options)).value();
  const std::array<ir::StepPhase, 1> decode = {ir::StepPhase::kDecode};
  EXPECT_EQ(std::move(executor->precapture(decode, 60.0)).value(),
            static_cast<int32_t>(options.bucket_ladder.size()));
  if (ascending) {
    for (int32_t size = 144; size <= 256; size += 16) {
      ExecutorOptions larger = options;
      larger.bucket_ladder = {size};
      auto next = std::move(testing::make_executor(model, model.kv, pool, arena, larger)).value();
      EXPECT_EQ(std::move(next->precapture(decode, 60.0)).value(), 1);
      planned.push_back(static_cast<size_t>(next->cache().programs()[0]->planned_bytes()));
    }
  }
  for (const Program* program : executor->cache().programs()) {
    planned.push_back(static_cast<size_t>(program->planned_bytes()));
  }
  return planned;
}

TEST(MultiShapeArenaTest, SweepOfBucketsKeepsPhysicalBytesAtTheLargestCapture) {
  auto vm = host_vm();
  auto shared = MultiShapeArena::create(std::make_unique<DedicatedArenaMemory>(*vm));
  auto baseline = MultiShapeArena::create(std::make_unique<DedicatedArenaMemory>(*vm),
                                          ArenaSharing::kPrivatePerView);
  const std::vector<size_t> planned = capture_sweep(*shared, false);
  ASSERT_EQ(planned.size(), 9u);
  ASSERT_EQ(capture_sweep(*baseline, false), planned);
  const size_t page = vm->granularity();
  const size_t largest = *std::max_element(planned.begin(), planned.end());
  const size_t sum = std::accumulate(planned.begin(), planned.end(), size_t{0});
  const size_t shared_bytes = std::move(shared->measured_physical_bytes()).value();
  const size_t baseline_bytes = std::move(baseline->measured_physical_bytes()).value();
  // fstat blocks of the arena's memfds: the largest capture, within one page.
  EXPECT_GE(shared_bytes, largest);
  EXPECT_LE(shared_bytes, largest + page);
  // One private arena per capture: the sum.
  EXPECT_GE(baseline_bytes, sum);
  EXPECT_LE(baseline_bytes, sum + planned.size() * page);
  EXPECT_EQ(shared->stats().num_views, 9);
  EXPECT_GE(shared->stats().virtual_bytes, sum);
}

TEST(MultiShapeArenaTest, AscendingSweepGrowsPhysicalMemoryOnlyToTheLargest) {
  auto vm = host_vm();
  auto arena = MultiShapeArena::create(std::make_unique<DedicatedArenaMemory>(*vm));
  const std::vector<size_t> planned = capture_sweep(*arena, true);
  ASSERT_EQ(planned.size(), 9u);
  const size_t largest = *std::max_element(planned.begin(), planned.end());
  const size_t measured = std::move(arena->measured_physical_bytes()).value();
  EXPECT_GE(measured, largest);
  EXPECT_LE(measured, largest + vm->granularity());
}

TEST(MultiShapeArenaTest, SweepOnPoolPagesCountsTheLargestCaptureOnly) {
  auto vm = host_vm();
  auto pool = test_pool(*vm, 4096);
  std::vector<size_t> planned;
  size_t pool_pages = 0;
  {
    auto arena = MultiShapeArena::create(std::make_unique<PoolArenaMemory>(*pool, 7));
    planned = capture_sweep(*arena, false);
    pool_pages = static_cast<size_t>(
        pool->stats()
            .per_content[memory::content_index(memory::ContentType::kGraphArena)]
            .pages_in_use);
  }
  const size_t largest = *std::max_element(planned.begin(), planned.end());
  EXPECT_GE(pool_pages * 4096, largest);
  EXPECT_LE(pool_pages * 4096, largest + 4096);
  // The arena's pages go back to the pool with it.
  EXPECT_EQ(pool->stats()
                .per_content[memory::content_index(memory::ContentType::kGraphArena)]
                .pages_in_use,
            0);
}

}  // namespace
}  // namespace folio::exec
