// PagePool eviction: when it happens (requests that cannot be met, the high watermark), what it
// takes (unpinned allocations in score order, never pinned ones), what the owner is told, and
// what it answers when nothing can help.
#include <gtest/gtest.h>

#include "folio/memory/page_pool.h"
#include "pool_test_util.h"

namespace folio::memory {
namespace {

using testing::make_pool;
using testing::RecordingListener;
using testing::request;
using testing::small_options;

// No thread caches, and proactive eviction off unless a test turns it on.
PagePoolOptions plain(int64_t num_pages) {
  PagePoolOptions options = small_options(num_pages);
  options.thread_cache_pages = 0;
  options.high_watermark = 1.0;
  options.low_watermark = 1.0;
  return options;
}

TEST(PagePoolEvictionTest, AFullPoolEvictsJustEnoughForARequest) {
  testing::TestPool pool = make_pool(plain(8));
  RecordingListener listener;
  std::vector<PageAllocation> pages;
  for (int i = 0; i < 8; ++i) {
    pages.push_back(
        std::move(*pool->allocate(request(1, ContentType::kKvCache, false, &listener))));
    pool->advance_step();
  }
  Result<PageAllocation> more = pool->allocate(request(1));
  ASSERT_TRUE(more.ok()) << more.status().to_string();
  ASSERT_EQ(listener.count(), 1u);
  EXPECT_EQ(listener.notices()[0].allocation, pages[0].ref()) << "the least recently used goes";
  EXPECT_EQ(pool->stats().evictions, 1);
  pool->check_invariants();
}

TEST(PagePoolEvictionTest, PinnedAllocationsAreNeverEvicted) {
  testing::TestPool pool = make_pool(plain(8));
  RecordingListener listener;
  std::vector<PageAllocation> pinned;
  for (int i = 0; i < 6; ++i) {
    pinned.push_back(
        std::move(*pool->allocate(request(1, ContentType::kTemporary, true, &listener))));
  }
  PageAllocation evictable =
      std::move(*pool->allocate(request(2, ContentType::kKvCache, false, &listener)));
  Result<int64_t> evicted = pool->evict(100);
  ASSERT_TRUE(evicted.ok());
  EXPECT_EQ(*evicted, 2);
  ASSERT_EQ(listener.count(), 1u);
  EXPECT_EQ(listener.notices()[0].allocation, evictable.ref());
  for (const PageAllocation& allocation : pinned) EXPECT_TRUE(allocation.pin().ok());
  pool->check_invariants();
}

TEST(PagePoolEvictionTest, NoCapacityIsResourceExhaustedWithCountsAndEvictsNothing) {
  testing::TestPool pool = make_pool(plain(10));
  RecordingListener listener;
  PageAllocation pinned = std::move(*pool->allocate(request(6, ContentType::kKvCache)));
  PageAllocation evictable =
      std::move(*pool->allocate(request(3, ContentType::kTemporary, false, &listener)));
  Result<PageAllocation> too_big = pool->allocate(request(5));
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
  const std::string_view message = too_big.status().message();
  EXPECT_NE(message.find("5 contiguous pages"), std::string_view::npos) << message;
  EXPECT_NE(message.find("1 free"), std::string_view::npos) << message;
  EXPECT_NE(message.find("3 evictable"), std::string_view::npos) << message;
  EXPECT_NE(message.find("6 pinned"), std::string_view::npos) << message;
  EXPECT_EQ(listener.count(), 0u) << "evicting could not have helped, so nothing may be evicted";
  EXPECT_EQ(pool->stats().failed_allocations, 1);
  pool->check_invariants();
}

TEST(PagePoolEvictionTest, ARangeRequestEvictsUntilAContiguousRunExists) {
  testing::TestPool pool = make_pool(plain(8));
  RecordingListener listener;
  std::vector<PageAllocation> pages;
  for (int i = 0; i < 8; ++i) {
    pages.push_back(
        std::move(*pool->allocate(request(1, ContentType::kTemporary, false, &listener))));
  }
  // Least recently used first: the even pages, then the odd ones. Evicting 0, 2, 4, 6 frees four
  // pages but no two adjacent ones; page 1 completes the run 0..2.
  for (int page : {0, 2, 4, 6, 1, 3, 5, 7}) {
    pool->advance_step();
    ASSERT_TRUE(pages[page].touch().ok());
  }
  Result<PageAllocation> pair = pool->allocate(request(2));
  ASSERT_TRUE(pair.ok()) << pair.status().to_string();
  std::vector<int> evicted;
  for (const EvictionNotice& notice : listener.notices()) {
    evicted.push_back(notice.allocation.first_page().value());
  }
  EXPECT_EQ(evicted, (std::vector<int>{0, 2, 4, 6, 1}));
  EXPECT_EQ(pair->first_page().value(), 0);
  pool->check_invariants();
}

TEST(PagePoolEvictionTest, LowerPriorityContentIsEvictedFirst) {
  testing::TestPool pool = make_pool(plain(5));
  RecordingListener listener;
  std::vector<PageAllocation> pages;
  for (ContentType content :
       {ContentType::kKvCache, ContentType::kGraphArena, ContentType::kAdapterWeights,
        ContentType::kActivation, ContentType::kTemporary}) {
    pages.push_back(std::move(*pool->allocate(request(1, content, false, &listener))));
  }
  for (int i = 0; i < 100; ++i) pool->advance_step();
  ASSERT_EQ(*pool->evict(5), 5);
  const std::vector<EvictionNotice> notices = listener.notices();
  ASSERT_EQ(notices.size(), 5u);
  EXPECT_EQ(notices[0].content, ContentType::kTemporary);
  EXPECT_EQ(notices[1].content, ContentType::kActivation);
  EXPECT_EQ(notices[2].content, ContentType::kAdapterWeights);
  EXPECT_EQ(notices[3].content, ContentType::kGraphArena);
  EXPECT_EQ(notices[4].content, ContentType::kKvCache);
}

TEST(PagePoolEvictionTest, HighWatermarkEvictsDownToLowWatermarkWithHysteresis) {
  PagePoolOptions options = plain(100);
  options.high_watermark = 0.9;
  options.low_watermark = 0.8;
  testing::TestPool pool = make_pool(options);
  RecordingListener listener;
  std::vector<PageAllocation> pages;
  const auto allocate_one = [&] {
    pages.push_back(
        std::move(*pool->allocate(request(1, ContentType::kKvCache, false, &listener))));
    pool->advance_step();
  };
  for (int i = 0; i < 90; ++i) allocate_one();
  EXPECT_EQ(listener.count(), 0u) << "90% is at, not above, the high watermark";
  allocate_one();  // would reach 91%: evict down to 80% first (79 + this one)
  EXPECT_EQ(listener.count(), 11u);
  EXPECT_EQ(pool->stats().pages_free, 20);
  for (int i = 0; i < 10; ++i) allocate_one();  // back up to 90%: no eviction in the band
  EXPECT_EQ(listener.count(), 11u);
  allocate_one();
  EXPECT_EQ(listener.count(), 22u);
  pool->check_invariants();
}

// Told before the pages go: the ref is already stale, the pages not yet reusable.
class InspectingListener : public EvictionListener {
 public:
  PagePool* pool = nullptr;
  Status pin_status;
  Status allocate_status;
  PageState state_seen = PageState::kFree;
  void on_evict(const EvictionNotice& notice) override {
    pin_status = pool->pin(notice.allocation);
    state_seen = pool->page_info(notice.allocation.first_page())->state;
    allocate_status = pool->allocate(request(1)).status();
  }
};

TEST(PagePoolEvictionTest, TheListenerSeesAStaleRefAndPagesNotYetReused) {
  testing::TestPool pool = make_pool(plain(4));
  InspectingListener listener;
  listener.pool = pool.pool.get();
  PageAllocation victim =
      std::move(*pool->allocate(request(2, ContentType::kKvCache, false, &listener, 5)));
  ASSERT_EQ(*pool->evict(1), 2);
  EXPECT_EQ(listener.pin_status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(listener.state_seen, PageState::kReleasing);
  EXPECT_EQ(listener.allocate_status.code(), StatusCode::kFailedPrecondition)
      << "a listener must not allocate from the pool that evicts";
  // The owner's handle is stale now; destroying it must do nothing.
  EXPECT_EQ(victim.pin().code(), StatusCode::kFailedPrecondition);
  victim = PageAllocation();
  pool->check_invariants();
  EXPECT_EQ(pool->stats().pages_free, 4);
}

TEST(PagePoolEvictionTest, UnpinMakesAPinnedAllocationEvictableAgain) {
  testing::TestPool pool = make_pool(plain(4));
  RecordingListener listener;
  PageAllocation page =
      std::move(*pool->allocate(request(1, ContentType::kKvCache, false, &listener)));
  ASSERT_TRUE(page.pin().ok());
  EXPECT_EQ(*pool->evict(1), 0);  // drops the pinned entry from the index lazily
  pool->check_invariants();
  ASSERT_TRUE(page.unpin().ok());
  pool->check_invariants();
  EXPECT_EQ(*pool->evict(1), 1);
  EXPECT_EQ(listener.count(), 1u);
}

TEST(PagePoolEvictionTest, TouchKeepsAnAllocationLonger) {
  testing::TestPool pool = make_pool(plain(3));
  RecordingListener listener;
  std::vector<PageAllocation> pages;
  for (int i = 0; i < 3; ++i) {
    pages.push_back(
        std::move(*pool->allocate(request(1, ContentType::kKvCache, false, &listener))));
    pool->advance_step();
  }
  ASSERT_TRUE(pages[0].touch().ok());
  ASSERT_EQ(*pool->evict(1), 1);
  EXPECT_EQ(listener.notices()[0].allocation, pages[1].ref());
}

}  // namespace
}  // namespace folio::memory
