// Multi-threaded stress of the page pool, run under ThreadSanitizer (label `concurrency`). Not a
// benchmark: it looks for races (TSan), lost or duplicated pages (the invariant walk after the
// threads join), pages evicted under a live pin, and bytes of a live allocation overwritten by
// another thread. Fixed seeds; the interleavings differ from run to run.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "folio/memory/page_pool.h"
#include "pool_test_util.h"

namespace folio::memory {
namespace {

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr int kOperationsPerThread = 3000;
#else
constexpr int kOperationsPerThread = 20000;
#endif

uint64_t pattern_of(int thread, uint64_t serial, int64_t page) {
  return (static_cast<uint64_t>(thread) << 48) ^ (serial << 12) ^ static_cast<uint64_t>(page);
}

// Each thread allocates, fills (while pinned), unpins, re-pins and verifies, and frees its own
// allocations; it also pins and unpins other threads' allocations through shared refs, and one
// thread evicts. Whatever the interleaving, a successful pin of one's own allocation must find
// its bytes intact: the pool may evict it only while unpinned, and then the pin fails.
TEST(PagePoolStressTest, ThreadsAllocatePinUnpinFreeAndEvictConcurrently) {
  PagePoolOptions options = testing::small_options(256);
  options.thread_cache_pages = 8;
  options.high_watermark = 0.9;
  options.low_watermark = 0.8;
  testing::TestPool pool = testing::make_pool(options);
  testing::RecordingListener listener;
  std::mutex shared_mutex;
  std::vector<AllocationRef> shared;  // guarded by shared_mutex
  constexpr int kThreads = 4;

  const auto worker = [&](int thread) {
    std::mt19937 random(1000 + thread);
    struct Own {
      AllocationRef ref;
      uint64_t serial;
      bool pinned;
    };
    std::vector<Own> own;
    uint64_t serial = 0;
    const auto fill = [&](const Own& allocation) {
      for (int64_t page = 0; page < allocation.ref.num_pages(); ++page) {
        const uint64_t value = pattern_of(thread, allocation.serial, page);
        std::memcpy(pool->page_address(
                        PageId(allocation.ref.first_page().value() + static_cast<int32_t>(page))),
                    &value, sizeof value);
      }
    };
    const auto verify = [&](const Own& allocation) {
      for (int64_t page = 0; page < allocation.ref.num_pages(); ++page) {
        uint64_t value = 0;
        std::memcpy(&value,
                    pool->page_address(
                        PageId(allocation.ref.first_page().value() + static_cast<int32_t>(page))),
                    sizeof value);
        ASSERT_EQ(value, pattern_of(thread, allocation.serial, page))
            << "a pinned allocation's bytes changed under its owner";
      }
    };
    for (int step = 0; step < kOperationsPerThread; ++step) {
      const uint32_t op = random() % 100;
      if (op < 25 || own.empty()) {
        const int64_t pages = random() % 4 == 0 ? 1 + random() % 12 : 1;
        const auto content = static_cast<ContentType>(random() % kNumContentTypes);
        Result<PageAllocation> allocation =
            pool->allocate(testing::request(pages, content, true, &listener));
        if (!allocation.ok()) {
          ASSERT_EQ(allocation.status().code(), StatusCode::kResourceExhausted);
          continue;
        }
        Own entry{allocation->release(), ++serial, true};
        fill(entry);
        own.push_back(entry);
        if (random() % 4 == 0) {
          std::lock_guard lock(shared_mutex);
          shared.push_back(entry.ref);
          if (shared.size() > 64) shared.erase(shared.begin());
        }
      } else if (op < 45) {  // unpin one's own: evictable from now on
        Own& entry = own[random() % own.size()];
        if (entry.pinned) {
          ASSERT_TRUE(pool->unpin(entry.ref).ok());
          entry.pinned = false;
        }
      } else if (op < 65) {  // pin one's own again: either evicted meanwhile or intact
        const size_t which = random() % own.size();
        Own& entry = own[which];
        if (entry.pinned) {
          verify(entry);
        } else if (pool->pin(entry.ref).ok()) {
          entry.pinned = true;
          verify(entry);
        } else {
          own.erase(own.begin() + static_cast<ptrdiff_t>(which));  // evicted
        }
      } else if (op < 80) {  // free one's own, pinned or not
        const size_t which = random() % own.size();
        const Status freed = pool->free(own[which].ref);
        // Unpinned allocations may have been evicted meanwhile.
        ASSERT_TRUE(freed.ok() || !own[which].pinned) << freed.to_string();
        own.erase(own.begin() + static_cast<ptrdiff_t>(which));
      } else if (op < 95) {  // someone else's allocation: may be stale, must never break
        AllocationRef ref;
        {
          std::lock_guard lock(shared_mutex);
          if (!shared.empty()) ref = shared[random() % shared.size()];
        }
        if (!ref.is_valid()) continue;
        pool->touch(ref).ignore();
        if (pool->pin(ref).ok()) {
          std::this_thread::yield();
          // The owner may have freed it meanwhile (allowed while pinned); then this fails.
          pool->unpin(ref).ignore();
        }
      } else if (thread == 0) {
        pool->advance_step();
        ASSERT_TRUE(pool->evict(1 + random() % 8).ok());
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
    for (const Own& entry : own) pool->free(entry.ref).ignore();
  };

  std::vector<std::thread> threads;
  for (int thread = 0; thread < kThreads; ++thread) threads.emplace_back(worker, thread);
  for (std::thread& thread : threads) thread.join();

  pool->check_invariants();
  const PoolStats stats = pool->stats();
  EXPECT_EQ(stats.pages_free, 256) << "every page back in the free index after the threads exit";
  EXPECT_GT(stats.evictions, 0) << "the test must have exercised eviction";
  EXPECT_EQ(stats.evictions, static_cast<int64_t>(listener.count()));
}

// Several threads pin and unpin the same few evictable allocations while another keeps evicting
// and re-allocating them. The listener checks that no thread held a pin on the allocation it is
// told about: an eviction under a live pin is the bug this looks for.
class PinCounter : public EvictionListener {
 public:
  static constexpr int kMaxAllocations = 1 << 16;
  std::vector<std::atomic<int>> pins = std::vector<std::atomic<int>>(kMaxAllocations);
  std::atomic<int> evictions{0};
  std::atomic<int> evicted_while_pinned{0};
  void on_evict(const EvictionNotice& notice) override {
    if (pins[notice.owner].load(std::memory_order_acquire) != 0) evicted_while_pinned.fetch_add(1);
    evictions.fetch_add(1);
  }
};

TEST(PagePoolStressTest, EvictionNeverTakesAnAllocationUnderALivePin) {
  PagePoolOptions options = testing::small_options(16);
  options.high_watermark = 1.0;
  options.low_watermark = 1.0;
  testing::TestPool pool = testing::make_pool(options);
  PinCounter counter;
  constexpr int kSlots = 8;
  struct Slot {
    std::mutex mutex;
    AllocationRef ref;  // guarded by mutex
    uint64_t id = 0;    // guarded by mutex
  };
  std::vector<Slot> slots(kSlots);
  std::atomic<uint64_t> next_id{1};
  // Gives an evicted slot a new allocation; a live one is left alone (pinners may hold it).
  const auto refill = [&](Slot& slot) {
    std::lock_guard lock(slot.mutex);
    if (slot.ref.is_valid() && pool->touch(slot.ref).ok()) return;
    const uint64_t id = next_id.fetch_add(1);
    if (id >= PinCounter::kMaxAllocations) return;
    Result<PageAllocation> allocation =
        pool->allocate(testing::request(1, ContentType::kKvCache, false, &counter, id));
    if (!allocation.ok()) return;
    slot.ref = allocation->release();
    slot.id = id;
  };
  for (Slot& slot : slots) refill(slot);

  std::atomic<bool> stop{false};
  const auto pinner = [&](int thread) {
    std::mt19937 random(2000 + thread);
    for (int step = 0; step < kOperationsPerThread / 4; ++step) {
      Slot& slot = slots[random() % kSlots];
      AllocationRef ref;
      uint64_t id = 0;
      {
        std::lock_guard lock(slot.mutex);
        ref = slot.ref;
        id = slot.id;
      }
      if (!ref.is_valid() || !pool->pin(ref).ok()) continue;
      // Counted after the pin succeeds and uncounted before the unpin: an eviction can only be
      // legal outside that window. Release pairs with the listener's acquire.
      counter.pins[id].fetch_add(1, std::memory_order_release);
      std::this_thread::yield();
      counter.pins[id].fetch_sub(1, std::memory_order_release);
      ASSERT_TRUE(pool->unpin(ref).ok()) << "nothing frees a slot's allocation while it runs";
    }
  };
  const auto evictor = [&] {
    std::mt19937 random(3000);
    while (!stop.load()) {
      pool->advance_step();
      ASSERT_TRUE(pool->evict(1 + random() % 3).ok());
      Slot& slot = slots[random() % kSlots];
      refill(slot);
    }
  };
  std::thread evicting(evictor);
  std::vector<std::thread> pinners;
  for (int thread = 0; thread < 3; ++thread) pinners.emplace_back(pinner, thread);
  for (std::thread& thread : pinners) thread.join();
  stop.store(true);
  evicting.join();

  EXPECT_EQ(counter.evicted_while_pinned.load(), 0);
  EXPECT_GT(counter.evictions.load(), 0);
  for (Slot& slot : slots) pool->free(slot.ref).ignore();
  pool->check_invariants();
}

}  // namespace
}  // namespace folio::memory
