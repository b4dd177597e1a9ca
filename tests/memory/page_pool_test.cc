// PagePool behaviour: options, storage layout, allocation, handles and their errors, two-phase
// allocation, statistics, thread caches. Eviction is in page_pool_eviction_test.cc.
#include "folio/memory/page_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <thread>

#include "pool_test_util.h"

namespace folio::memory {
namespace {

using testing::make_pool;
using testing::request;
using testing::small_options;

PagePoolOptions without_caches(int64_t num_pages) {
  PagePoolOptions options = small_options(num_pages);
  options.thread_cache_pages = 0;
  return options;
}

TEST(PagePoolOptionsTest, BadOptionsAreInvalidArgumentsNamingTheOption) {
  Result<std::unique_ptr<device::VirtualMemory>> vm = device::make_host_virtual_memory();
  ASSERT_TRUE(vm.ok());
  const auto rejected = [&](PagePoolOptions options, std::string_view words) {
    Result<std::unique_ptr<PagePool>> pool = PagePool::create(**vm, options);
    ASSERT_FALSE(pool.ok());
    EXPECT_EQ(pool.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(pool.status().message().find(words), std::string_view::npos)
        << pool.status().to_string();
  };
  PagePoolOptions options = small_options(8);
  options.page_size = 3000;
  rejected(options, "power of two");
  options.page_size = size_t{8} << 20;
  rejected(options, "4 MiB");
  options.page_size = 2048;
  rejected(options, "4 KiB");
  options = small_options(0);
  rejected(options, "num_pages");
  options = small_options(8);
  options.reserved_pages = 4;
  rejected(options, "reserved_pages");
  options = small_options(8);
  options.low_watermark = 0.95;
  rejected(options, "watermarks");
  options = small_options(8);
  options.thread_cache_pages = -1;
  rejected(options, "thread_cache_pages");
  options = small_options(8);
  options.eviction_weights.size = -1;
  rejected(options, "weights");
}

TEST(PagePoolTest, PagesLiveAtBasePlusIndexTimesPageSizeInOneMappedRange) {
  PagePoolOptions options = small_options(16);
  options.reserved_pages = 64;
  testing::TestPool pool = make_pool(options);
  EXPECT_EQ(pool->num_pages(), 16);
  EXPECT_EQ(pool->page_size(), testing::kSmallPage);
  EXPECT_EQ(pool->address_range().size, 64 * testing::kSmallPage);
  EXPECT_EQ(pool->physical_memory().size, 16 * testing::kSmallPage);
  for (int page = 0; page < 16; ++page) {
    EXPECT_EQ(pool->page_address(PageId(page)), pool->base() + page * testing::kSmallPage);
    EXPECT_EQ(pool->physical_offset(PageId(page)), page * testing::kSmallPage);
  }
  // Every page of the budget is backed: write all of it and read it back.
  Result<PageAllocation> all = pool->allocate(request(16));
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  EXPECT_EQ(all->data(), pool->base());
  std::memset(all->data(), 0x5a, all->size_bytes());
  EXPECT_EQ(static_cast<unsigned char>(all->data()[16 * testing::kSmallPage - 1]), 0x5a);
}

TEST(PagePoolTest, BudgetSmallerThanTheReservedRangeIsTheLimit) {
  PagePoolOptions options = without_caches(8);
  options.reserved_pages = 32;
  testing::TestPool pool = make_pool(options);
  Result<PageAllocation> all = pool->allocate(request(8));
  ASSERT_TRUE(all.ok());
  Result<PageAllocation> more = pool->allocate(request(1));
  EXPECT_EQ(more.status().code(), StatusCode::kResourceExhausted);
}

TEST(PagePoolTest, RangesAreContiguousDisjointAndComeBackWhenFreed) {
  testing::TestPool pool = make_pool(without_caches(64));
  std::vector<PageAllocation> allocations;
  std::set<int> used;
  for (int pages : {1, 3, 8, 2, 16, 5}) {
    Result<PageAllocation> allocation = pool->allocate(request(pages));
    ASSERT_TRUE(allocation.ok()) << allocation.status().to_string();
    EXPECT_EQ(allocation->num_pages(), pages);
    for (int page = 0; page < pages; ++page) {
      EXPECT_TRUE(used.insert(allocation->first_page().value() + page).second) << "overlap";
    }
    allocations.push_back(std::move(*allocation));
    pool->check_invariants();
  }
  allocations.clear();
  pool->check_invariants();
  const PoolStats stats = pool->stats();
  EXPECT_EQ(stats.pages_free, 64);
  EXPECT_EQ(stats.largest_free_extent, 64) << "freed runs must merge back into one extent";
}

TEST(PagePoolTest, BestFitFillsTheTightestHole) {
  testing::TestPool pool = make_pool(without_caches(32));
  // Layout: [a:4][b:5][c:2][d:3][e:18], then free b and d: holes of 5 and 3.
  std::vector<PageAllocation> runs;
  for (int pages : {4, 5, 2, 3, 18}) runs.push_back(std::move(*pool->allocate(request(pages))));
  ASSERT_TRUE(runs[1].free().ok());
  ASSERT_TRUE(runs[3].free().ok());
  Result<PageAllocation> three = pool->allocate(request(3));
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(three->first_page().value(), 11);
  pool->check_invariants();
}

TEST(PagePoolTest, DoubleFreeIsAnErrorAndChangesNothing) {
  testing::TestPool pool = make_pool(small_options(16));
  Result<PageAllocation> allocation = pool->allocate(request(2));
  ASSERT_TRUE(allocation.ok());
  const AllocationRef ref = allocation->release();
  ASSERT_TRUE(pool->free(ref).ok());
  const PoolDebugState before = pool->debug_state();
  const Status again = pool->free(ref);
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.message().find("freed or evicted"), std::string_view::npos) << again.to_string();
  EXPECT_EQ(pool->debug_state(), before);
  pool->check_invariants();
}

TEST(PagePoolTest, StaleRefIsRejectedAfterItsPagesAreAllocatedAgain) {
  testing::TestPool pool = make_pool(without_caches(4));
  Result<PageAllocation> first = pool->allocate(request(1, ContentType::kKvCache, false));
  ASSERT_TRUE(first.ok());
  const AllocationRef stale = first->ref();
  ASSERT_TRUE(first->free().ok());
  Result<PageAllocation> second = pool->allocate(request(1, ContentType::kKvCache, false));
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->first_page(), stale.first_page()) << "the test needs the page reused";
  EXPECT_NE(second->ref().generation(), stale.generation());
  const PoolDebugState before = pool->debug_state();
  EXPECT_EQ(pool->pin(stale).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->unpin(stale).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->touch(stale).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->free(stale).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->debug_state(), before) << "a stale ref must not touch the new allocation";
}

TEST(PagePoolTest, StaleRefToAPageNowInsideAnotherRunIsRejected) {
  testing::TestPool pool = make_pool(without_caches(8));
  Result<PageAllocation> low = pool->allocate(request(2));
  Result<PageAllocation> high = pool->allocate(request(2));
  ASSERT_TRUE(low.ok() && high.ok());
  const AllocationRef stale = high->ref();  // head at page 2
  ASSERT_TRUE(low->free().ok());
  ASSERT_TRUE(high->free().ok());
  Result<PageAllocation> covering = pool->allocate(request(6));  // pages 0..5: page 2 is inside
  ASSERT_TRUE(covering.ok());
  EXPECT_EQ(pool->pin(stale).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->free(stale).code(), StatusCode::kFailedPrecondition);
  pool->check_invariants();
}

TEST(PagePoolTest, UnpinBelowZeroIsAnErrorAndChangesNothing) {
  testing::TestPool pool = make_pool(small_options(8));
  Result<PageAllocation> allocation = pool->allocate(request(1));
  ASSERT_TRUE(allocation.ok());
  ASSERT_TRUE(allocation->unpin().ok());
  const PoolDebugState before = pool->debug_state();
  const Status below = allocation->unpin();
  EXPECT_EQ(below.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(below.message().find("not pinned"), std::string_view::npos) << below.to_string();
  EXPECT_EQ(pool->debug_state(), before);
}

TEST(PagePoolTest, RefsFromAnotherPoolAndEmptyRefsAreRejected) {
  testing::TestPool first = make_pool(small_options(8));
  testing::TestPool second = make_pool(small_options(8));
  Result<PageAllocation> allocation = first->allocate(request(1));
  ASSERT_TRUE(allocation.ok());
  EXPECT_EQ(second->pin(allocation->ref()).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(second->free(allocation->ref()).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(first->free(AllocationRef()).code(), StatusCode::kInvalidArgument);
  second->check_invariants();
}

TEST(PagePoolTest, BadRequestsAreInvalidArguments) {
  testing::TestPool pool = make_pool(small_options(8));
  EXPECT_EQ(pool->allocate(request(0)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->allocate(request(9)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->prepare(request(-1)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->evict(-1).status().code(), StatusCode::kInvalidArgument);
  pool->check_invariants();
}

TEST(PagePoolTest, PinsCountAndFreeingAPinnedAllocationMakesItsPinsStale) {
  testing::TestPool pool = make_pool(small_options(8));
  Result<PageAllocation> allocation = pool->allocate(request(2, ContentType::kKvCache));
  ASSERT_TRUE(allocation.ok());
  Result<PinGuard> guard = allocation->pin_guard();
  ASSERT_TRUE(guard.ok());
  Result<PageInfo> info = pool->page_info(PageId(1));
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, PageState::kPinned);
  EXPECT_EQ(info->pin_count, 2u);
  EXPECT_EQ(info->run_first_page, allocation->first_page());
  ASSERT_TRUE(allocation->free().ok());
  EXPECT_EQ(guard->release().code(), StatusCode::kFailedPrecondition);
  pool->check_invariants();
  EXPECT_EQ(pool->stats().per_content[content_index(ContentType::kKvCache)].pages_in_use, 0);
}

TEST(PagePoolTest, PinGuardUnpinsWhenDestroyed) {
  testing::TestPool pool = make_pool(small_options(8));
  Result<PageAllocation> allocation = pool->allocate(request(1, ContentType::kTemporary, false));
  ASSERT_TRUE(allocation.ok());
  {
    Result<PinGuard> guard = allocation->pin_guard();
    ASSERT_TRUE(guard.ok());
    EXPECT_EQ(pool->stats().pages_pinned, 1);
  }
  EXPECT_EQ(pool->stats().pages_pinned, 0);
  EXPECT_EQ(pool->stats().pages_unpinned, 1);
  pool->check_invariants();
}

TEST(PagePoolTest, PageInfoIsTheMetadataTableRow) {
  testing::TestPool pool = make_pool(without_caches(16));
  pool->advance_step();
  pool->advance_step();
  Result<PageAllocation> allocation =
      pool->allocate(request(4, ContentType::kAdapterWeights, false, nullptr, 77));
  ASSERT_TRUE(allocation.ok());
  pool->advance_step();
  ASSERT_TRUE(allocation->touch().ok());
  Result<PageInfo> interior = pool->page_info(PageId(2));
  ASSERT_TRUE(interior.ok());
  EXPECT_EQ(interior->state, PageState::kUnpinned);
  EXPECT_EQ(interior->content, ContentType::kAdapterWeights);
  EXPECT_EQ(interior->owner, 77u);
  EXPECT_EQ(interior->last_use, 3u);
  EXPECT_EQ(interior->run_pages, 4);
  Result<PageInfo> free_page = pool->page_info(PageId(9));
  ASSERT_TRUE(free_page.ok());
  EXPECT_EQ(free_page->state, PageState::kFree);
  EXPECT_EQ(free_page->run_first_page.value(), 4);
  EXPECT_EQ(free_page->run_pages, 12);
  EXPECT_EQ(pool->page_info(PageId(16)).status().code(), StatusCode::kOutOfRange);
}

TEST(PagePoolTest, StatsSplitPagesByStateAndContentType) {
  testing::TestPool pool = make_pool(without_caches(32));
  Result<PageAllocation> kv = pool->allocate(request(4, ContentType::kKvCache));
  Result<PageAllocation> adapter = pool->allocate(request(3, ContentType::kAdapterWeights, false));
  Result<PreparedAllocation> arena = pool->prepare(request(5, ContentType::kGraphArena));
  ASSERT_TRUE(kv.ok() && adapter.ok() && arena.ok());
  const PoolStats stats = pool->stats();
  EXPECT_EQ(stats.pages_pinned, 4);
  EXPECT_EQ(stats.pages_unpinned, 3);
  EXPECT_EQ(stats.pages_reserved, 5);
  EXPECT_EQ(stats.pages_free, 20);
  EXPECT_EQ(stats.per_content[content_index(ContentType::kKvCache)].pages_pinned, 4);
  EXPECT_EQ(stats.per_content[content_index(ContentType::kAdapterWeights)].pages_evictable, 3);
  EXPECT_DOUBLE_EQ(stats.utilization, 12.0 / 32.0);
  EXPECT_EQ(stats.allocations, 2);
}

TEST(PagePoolTest, AllocationLatencyIsSampled) {
  PagePoolOptions options = small_options(8);
  options.latency_sample_period = 1;
  testing::TestPool pool = make_pool(options);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(pool->allocate(request(1)).ok());
  const LatencyHistogramSnapshot latency = pool->stats().allocation_latency;
  EXPECT_EQ(latency.samples, 5);
  int64_t counted = 0;
  for (int64_t count : latency.counts) counted += count;
  EXPECT_EQ(counted, 5);
}

TEST(PagePoolTwoPhaseTest, CommitPublishesWhatWasWrittenWhilePrepared) {
  testing::TestPool pool = make_pool(small_options(8));
  Result<PreparedAllocation> prepared = pool->prepare(request(2, ContentType::kAdapterWeights));
  ASSERT_TRUE(prepared.ok());
  std::memset(prepared->data(), 7, 2 * testing::kSmallPage);
  EXPECT_EQ(pool->stats().pages_reserved, 2);
  Result<PageAllocation> committed = pool->commit(std::move(*prepared));
  ASSERT_TRUE(committed.ok());
  EXPECT_EQ(committed->data()[testing::kSmallPage + 5], std::byte{7});
  EXPECT_EQ(pool->stats().pages_reserved, 0);
  EXPECT_EQ(pool->stats().pages_pinned, 2);
  EXPECT_EQ(pool->commit(std::move(*prepared)).status().code(), StatusCode::kFailedPrecondition);
  pool->check_invariants();
}

TEST(PagePoolTwoPhaseTest, RollbackRestoresTheExactPriorState) {
  for (int cache_pages : {0, 16}) {
    PagePoolOptions options = small_options(32);
    options.thread_cache_pages = cache_pages;
    testing::TestPool pool = make_pool(options);
    // Some history first, so that there are holes, cached pages and evictable allocations.
    std::vector<PageAllocation> keep;
    for (int pages : {1, 2, 1, 3, 1, 1}) keep.push_back(std::move(*pool->allocate(request(pages))));
    ASSERT_TRUE(keep[1].free().ok());
    ASSERT_TRUE(keep[4].free().ok());
    ASSERT_TRUE(keep[3].unpin().ok());
    for (int pages : {1, 2, 4}) {
      const PoolDebugState before = pool->debug_state();
      Result<PreparedAllocation> prepared = pool->prepare(request(pages));
      ASSERT_TRUE(prepared.ok());
      ASSERT_FALSE(prepared->made_room());
      EXPECT_NE(pool->debug_state(), before);
      ASSERT_TRUE(pool->rollback(std::move(*prepared)).ok());
      EXPECT_EQ(pool->debug_state(), before) << pages << " pages, cache " << cache_pages;
      pool->check_invariants();
    }
  }
}

TEST(PagePoolTwoPhaseTest, DestroyingAPendingPreparationRollsItBack) {
  testing::TestPool pool = make_pool(small_options(8));
  { Result<PreparedAllocation> prepared = pool->prepare(request(3)); }
  EXPECT_EQ(pool->stats().pages_reserved, 0);
  EXPECT_EQ(pool->stats().pages_free + pool->stats().pages_thread_held, 8);
  pool->check_invariants();
}

TEST(PagePoolThreadCacheTest, SinglePagesFreedByAThreadStayInItsCacheUntilItExits) {
  testing::TestPool pool = make_pool(small_options(64));
  std::thread worker([&] {
    std::vector<PageAllocation> pages;
    for (int i = 0; i < 10; ++i) pages.push_back(std::move(*pool->allocate(request(1))));
    pages.clear();
    EXPECT_GT(pool->stats().pages_thread_held, 0);
    pool->check_invariants();
  });
  worker.join();
  EXPECT_EQ(pool->stats().pages_thread_held, 0) << "thread exit must give cached pages back";
  EXPECT_EQ(pool->stats().pages_free, 64);
  pool->check_invariants();
}

TEST(PagePoolThreadCacheTest, ARangeRequestDrainsOtherThreadsCaches) {
  PagePoolOptions options = small_options(32);
  options.thread_cache_pages = 32;
  testing::TestPool pool = make_pool(options);
  std::mutex mutex;
  std::condition_variable changed;
  bool cached = false;
  bool done = false;
  std::thread worker([&] {
    std::vector<PageAllocation> pages;
    for (int i = 0; i < 20; ++i) pages.push_back(std::move(*pool->allocate(request(1))));
    pages.clear();  // most of the pool now sits in this thread's cache
    std::unique_lock lock(mutex);
    cached = true;
    changed.notify_all();
    changed.wait(lock, [&] { return done; });
  });
  {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return cached; });
  }
  Result<PageAllocation> range = pool->allocate(request(30));
  EXPECT_TRUE(range.ok()) << range.status().to_string();
  EXPECT_GE(pool->stats().thread_cache_drains, 1);
  range = PageAllocation();
  {
    std::lock_guard lock(mutex);
    done = true;
    changed.notify_all();
  }
  worker.join();
  pool->check_invariants();
}

TEST(PagePoolThreadCacheTest, APoolDestroyedBeforeAThreadExitsIsForgottenByTheThread) {
  testing::TestPool pool = make_pool(small_options(16));
  std::mutex mutex;
  std::condition_variable changed;
  int stage = 0;
  std::thread worker([&] {
    { PageAllocation page = std::move(*pool->allocate(request(1))); }
    std::unique_lock lock(mutex);
    stage = 1;
    changed.notify_all();
    changed.wait(lock, [&] { return stage == 2; });
    // The pool is gone; this thread's exit must not touch it.
  });
  {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return stage == 1; });
  }
  pool.pool.reset();
  {
    std::lock_guard lock(mutex);
    stage = 2;
    changed.notify_all();
  }
  worker.join();
}

TEST(PagePoolDeathTest, DestroyingAPoolWithLiveAllocationsAborts) {
  EXPECT_DEATH(
      {
        testing::TestPool pool = make_pool(small_options(8));
        AllocationRef leaked = pool->allocate(request(2))->release();
        (void)leaked;
        pool.pool.reset();
      },
      "destroyed with pages still allocated");
}

}  // namespace
}  // namespace folio::memory
