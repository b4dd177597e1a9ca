// The block manager on the real page pool (host virtual memory): KV pages share the budget with
// other content types, and the pool's eviction takes only unpinned KV pages (CACHED and FREE
// blocks), telling the KV cache first.
#include "folio/kv/pool_page_source.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "folio/device/host_virtual_memory.h"
#include "folio/kv/block_manager.h"
#include "random_workload.h"
#include "testing/kv_test_util.h"
#include "testing/tokens.h"

namespace folio::kv {
namespace {

using folio::testing::tokens;

using testing::KvContents;

constexpr int32_t kBlockSize = 8;
constexpr size_t kPageBytes = 4096;  // 16 tiny blocks of 256 bytes

class PoolPageSourceTest : public ::testing::Test {
 protected:
  void make(int64_t num_pages, double high_watermark = 1.0, double low_watermark = 1.0) {
    auto vm = device::make_host_virtual_memory();
    ASSERT_TRUE(vm.ok()) << vm.status().to_string();
    vm_ = std::move(vm).value();
    memory::PagePoolOptions options;
    options.name = "kv-test";
    options.page_size = kPageBytes;
    options.num_pages = num_pages;
    options.high_watermark = high_watermark;
    options.low_watermark = low_watermark;
    auto pool = memory::PagePool::create(*vm_, options);
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    pool_ = std::move(pool).value();
    source_ = std::make_unique<PoolPageSource>(*pool_, /*owner=*/7);
    swap_ = std::make_unique<HostSwapSpace>(kBlockSize * 32, 64);
    BlockManagerOptions manager_options;
    manager_options.geometry = testing::tiny_geometry(kBlockSize);
    manager_options.max_context_tokens = 512;
    manager_options.watermark = 0.0;
    auto manager = BlockManager::create(manager_options, *source_, copier_, swap_.get());
    ASSERT_TRUE(manager.ok()) << manager.status().to_string();
    manager_ = std::move(manager).value();
  }

  void TearDown() override {
    other_.clear();
    manager_.reset();
    source_.reset();
    if (pool_ != nullptr) pool_->check_invariants();
    pool_.reset();
  }

  void prefill(SeqId seq, std::span<const int32_t> prompt) {
    const auto outcome = manager_->allocate(seq, prompt);
    ASSERT_TRUE(outcome.ok()) << outcome.status().to_string();
    ASSERT_EQ(outcome->admission, Admission::kAdmitted);
    KvContents::write(*manager_, seq, prompt, {}, outcome->num_cached_tokens,
                      static_cast<int32_t>(prompt.size()));
    ASSERT_TRUE(manager_->mark_computed(seq, static_cast<int32_t>(prompt.size())).ok());
  }

  // Another content type's allocation of `pages` pages.
  Status allocate_other(int64_t pages, memory::ContentType content, bool pinned = true) {
    memory::PageAllocationRequest request;
    request.num_pages = pages;
    request.content = content;
    request.pinned = pinned;
    auto allocation = pool_->allocate(request);
    if (!allocation.ok()) return allocation.status();
    other_.push_back(std::move(allocation).value());
    return Status();
  }

  const memory::ContentStats& kv_stats(const memory::PoolStats& stats) const {
    return stats.per_content[memory::content_index(memory::ContentType::kKvCache)];
  }

  std::unique_ptr<device::VirtualMemory> vm_;
  std::unique_ptr<memory::PagePool> pool_;
  std::unique_ptr<PoolPageSource> source_;
  std::unique_ptr<HostSwapSpace> swap_;
  HostKvBlockCopier copier_;
  std::unique_ptr<BlockManager> manager_;
  std::vector<memory::PageAllocation> other_;
};

TEST_F(PoolPageSourceTest, KvPagesAreKvCacheAllocationsPinnedWhileOwned) {
  make(16);
  const KvLayoutNumbers layout = manager_->layout();
  EXPECT_EQ(layout.base, pool_->base());
  EXPECT_EQ(layout.page_bytes, static_cast<int64_t>(kPageBytes));
  EXPECT_EQ(layout.blocks_per_page, 16);
  prefill(SeqId(1), tokens(200));  // 25 blocks: the dummy's page and one more
  memory::PoolStats stats = pool_->stats();
  EXPECT_EQ(kv_stats(stats).pages_pinned, 2);
  EXPECT_TRUE(KvContents::verify(*manager_, SeqId(1), tokens(200), {}, 200));
  // Every block id names bytes inside the pool's pages.
  const std::span<const int32_t> table = *manager_->block_table(SeqId(1));
  for (int32_t block : table) {
    const std::byte* address = layout.block_pointer(block);
    EXPECT_GE(address, pool_->base());
    EXPECT_LT(address, pool_->base() + pool_->num_pages() * kPageBytes);
  }
  ASSERT_TRUE(manager_->free(SeqId(1)).ok());
  stats = pool_->stats();
  EXPECT_EQ(kv_stats(stats).pages_pinned, 1);     // the dummy block's page
  EXPECT_EQ(kv_stats(stats).pages_evictable, 1);  // cached blocks, evictable
  manager_->check_invariants();
  pool_->check_invariants();
}

TEST_F(PoolPageSourceTest, AnotherContentTypeEvictsOnlyCachedKvPages) {
  make(8);
  prefill(SeqId(1), tokens(120, 1));    // running: fills the dummy's page
  prefill(SeqId(2), tokens(128, 500));  // 16 blocks, one page: computed, then freed -> CACHED
  ASSERT_TRUE(manager_->free(SeqId(2)).ok());
  const int64_t cached = manager_->counts().cached;
  ASSERT_EQ(cached, 16);
  const int32_t held_before = source_->num_pages_held();
  // Adapter weights want the whole pool: the pool evicts the unpinned KV pages, never the
  // pinned one.
  const int64_t free_pages = pool_->stats().pages_free + pool_->stats().pages_thread_held;
  for (int64_t page = 0; page < free_pages + held_before - 1; ++page) {
    ASSERT_TRUE(allocate_other(1, memory::ContentType::kAdapterWeights).ok()) << page;
  }
  EXPECT_EQ(source_->num_pages_held(), 1);
  ASSERT_TRUE(manager_->process_evictions().ok());
  EXPECT_EQ(manager_->counts().cached, 0);
  EXPECT_EQ(manager_->prefix_stats().evicted_blocks, cached);
  EXPECT_TRUE(KvContents::verify(*manager_, SeqId(1), tokens(120, 1), {}, 120));
  manager_->check_invariants();
  pool_->check_invariants();
  // The pool is full of pinned pages: one more adapter page is refused, the running sequence
  // is untouched, and a new sequence finds no capacity.
  EXPECT_EQ(allocate_other(1, memory::ContentType::kAdapterWeights).code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(manager_->allocate(SeqId(3), tokens(200, 900))->admission, Admission::kNoCapacityNow);
  EXPECT_TRUE(KvContents::verify(*manager_, SeqId(1), tokens(120, 1), {}, 120));
  manager_->check_invariants();
}

TEST_F(PoolPageSourceTest, KvAllocationEvictsUnpinnedAdapterPagesFirst) {
  make(8);
  // Unpinned adapter weights fill everything but the dummy's page.
  ASSERT_TRUE(allocate_other(7, memory::ContentType::kAdapterWeights, /*pinned=*/false).ok());
  EXPECT_EQ(source_->num_pages_available(), 7) << "evictable adapter pages count as available";
  EXPECT_EQ(manager_->can_allocate(300), Admission::kAdmitted);
  prefill(SeqId(1), tokens(300));  // 38 blocks: the dummy's page is not enough
  EXPECT_EQ(pool_->stats()
                .per_content[memory::content_index(memory::ContentType::kAdapterWeights)]
                .evictions,
            1);
  EXPECT_TRUE(KvContents::verify(*manager_, SeqId(1), tokens(300), {}, 300));
  manager_->check_invariants();
  pool_->check_invariants();
}

TEST_F(PoolPageSourceTest, PoolHysteresisEvictsCachedKvPagesOnItsOwn) {
  make(10, /*high_watermark=*/0.8, /*low_watermark=*/0.5);
  prefill(SeqId(1), tokens(128, 1));  // the dummy's page and one more
  prefill(SeqId(2), tokens(256, 500));
  ASSERT_TRUE(manager_->free(SeqId(2)).ok());
  const int64_t cached = manager_->counts().cached;
  ASSERT_GT(cached, 0);
  // Crossing the high watermark makes the pool evict unpinned allocations down to the low one.
  ASSERT_TRUE(allocate_other(5, memory::ContentType::kGraphArena).ok());
  ASSERT_TRUE(manager_->process_evictions().ok());
  EXPECT_LT(manager_->counts().cached, cached);
  EXPECT_TRUE(KvContents::verify(*manager_, SeqId(1), tokens(128, 1), {}, 128));
  manager_->check_invariants();
  pool_->check_invariants();
}

TEST_F(PoolPageSourceTest, RandomWorkloadOnThePoolUnderOtherOwnersPressure) {
  make(12);
  testing::RandomWorkload workload(*manager_, 31);
  std::vector<memory::PageAllocation> taken;
  for (int operation = 0; operation < 1500; ++operation) {
    if (operation % 40 == 20) {
      if (taken.empty()) {
        for (int count = 0; count < 3; ++count) {
          memory::PageAllocationRequest request;
          request.content = memory::ContentType::kAdapterWeights;
          auto allocation = pool_->allocate(request);
          if (allocation.ok()) taken.push_back(std::move(allocation).value());
        }
      } else {
        taken.clear();
      }
    }
    ASSERT_TRUE(workload.step()) << "operation " << operation;
    ASSERT_TRUE(manager_->process_evictions().ok());
    manager_->check_invariants();
    if (operation % 10 == 0) {
      ASSERT_TRUE(workload.verify_contents()) << "operation " << operation;
      pool_->check_invariants();
    }
  }
  EXPECT_GT(manager_->prefix_stats().hit_blocks, 0);
  EXPECT_GT(kv_stats(pool_->stats()).evictions + manager_->prefix_stats().evicted_blocks, 0);
}

}  // namespace
}  // namespace folio::kv
