// Randomized single-thread operation sequences (fixed seeds) against an independent model of
// the pool's allocations. After every operation: the pool's own invariant walk
// (check_invariants: each page in exactly one state, counts add up, runs tile the pool), the
// model's view (live ranges never overlap, pinned/evictable counts per content type agree), a
// tag written into every page of every live allocation is still intact (so no two allocations
// ever shared memory), and pinned allocations were never evicted. Rollbacks must restore the
// exact prior state; errors must change nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "folio/memory/page_pool.h"
#include "pool_test_util.h"

namespace folio::memory {
namespace {

struct Config {
  int thread_cache_pages;
  FitPolicy fit;
  double high;
  double low;
  uint32_t seed;
};

class ModelTest : public EvictionListener {
 public:
  explicit ModelTest(const Config& config) : config_(config), random_(config.seed) {
    PagePoolOptions options = testing::small_options(kPages);
    options.thread_cache_pages = config.thread_cache_pages;
    options.fit_policy = config.fit;
    options.high_watermark = config.high;
    options.low_watermark = config.low;
    pool_ = testing::make_pool(options);
  }
  ~ModelTest() {
    for (auto& [id, live] : live_) EXPECT_TRUE(pool_->free(live.ref).ok());
    pool_->check_invariants();
  }

  void run(int steps);

  void on_evict(const EvictionNotice& notice) override {
    auto it = live_.find(notice.owner);
    ASSERT_NE(it, live_.end()) << "evicted an allocation the model does not know";
    EXPECT_EQ(it->second.ref, notice.allocation);
    EXPECT_EQ(it->second.pins, 0u) << "a pinned allocation was evicted";
    EXPECT_FALSE(pool_->pin(notice.allocation).ok()) << "the listener's ref must be stale";
    dead_.push_back(notice.allocation);
    live_.erase(it);
    ++evictions_in_op_;
  }

 private:
  static constexpr int64_t kPages = 96;
  struct Live {
    AllocationRef ref;
    ContentType content;
    uint32_t pins;
  };

  uint64_t tag_of(uint64_t id, int64_t page) const {
    return id * 4096 + static_cast<uint64_t>(page);
  }
  void write_tags(uint64_t id, const AllocationRef& ref);
  void check_model();
  Live* pick();
  void op_allocate();
  void op_two_phase();
  void op_free();
  void op_pin_or_unpin();
  void op_stale();
  void op_evict();

  Config config_;
  std::mt19937 random_;
  testing::TestPool pool_;
  std::map<uint64_t, Live> live_;  // by owner id
  std::vector<AllocationRef> dead_;
  uint64_t next_id_ = 1;
  int evictions_in_op_ = 0;
};

void ModelTest::write_tags(uint64_t id, const AllocationRef& ref) {
  for (int64_t page = 0; page < ref.num_pages(); ++page) {
    const uint64_t tag = tag_of(id, page);
    std::memcpy(pool_->page_address(PageId(ref.first_page().value() + static_cast<int32_t>(page))),
                &tag, sizeof tag);
  }
}

void ModelTest::check_model() {
  pool_->check_invariants();
  std::vector<int> owner(kPages, 0);
  std::array<int64_t, kNumContentTypes> pinned{};
  std::array<int64_t, kNumContentTypes> evictable{};
  for (const auto& [id, live] : live_) {
    const int first = live.ref.first_page().value();
    for (int64_t page = 0; page < live.ref.num_pages(); ++page) {
      ASSERT_EQ(owner[first + page], 0) << "live ranges overlap at page " << first + page;
      owner[first + page] = static_cast<int>(id);
      uint64_t tag = 0;
      std::memcpy(&tag, pool_->page_address(PageId(first + static_cast<int32_t>(page))),
                  sizeof tag);
      ASSERT_EQ(tag, tag_of(id, page)) << "allocation " << id << " lost its bytes";
    }
    (live.pins > 0 ? pinned : evictable)[content_index(live.content)] += live.ref.num_pages();
  }
  const PoolStats stats = pool_->stats();
  for (int content = 0; content < kNumContentTypes; ++content) {
    ASSERT_EQ(stats.per_content[content].pages_pinned, pinned[content]) << "content " << content;
    ASSERT_EQ(stats.per_content[content].pages_evictable, evictable[content]);
  }
  ASSERT_EQ(stats.pages_reserved, 0);
  ASSERT_EQ(stats.pages_free + stats.pages_thread_held + stats.pages_pinned + stats.pages_unpinned,
            kPages);
}

ModelTest::Live* ModelTest::pick() {
  if (live_.empty()) return nullptr;
  auto it = live_.begin();
  std::advance(it, random_() % live_.size());
  return &it->second;
}

void ModelTest::op_allocate() {
  const uint32_t roll = random_() % 20;
  const int64_t pages = roll < 12 ? 1 : roll < 18 ? 2 + random_() % 7 : 9 + random_() % 40;
  const auto content = static_cast<ContentType>(random_() % kNumContentTypes);
  const bool pinned = random_() % 3 == 0;
  // What the model says must happen: success when a free run is long enough already; failure,
  // with nothing evicted, when not even free plus evictable pages add up to the request.
  std::vector<bool> used(kPages, false);
  int64_t evictable = 0;
  for (const auto& [id, live] : live_) {
    for (int64_t page = 0; page < live.ref.num_pages(); ++page) {
      used[live.ref.first_page().value() + page] = true;
    }
    if (live.pins == 0) evictable += live.ref.num_pages();
  }
  int64_t longest = 0;
  int64_t run = 0;
  int64_t free_pages = 0;
  for (bool page_used : used) {
    run = page_used ? 0 : run + 1;
    longest = std::max(longest, run);
    free_pages += page_used ? 0 : 1;
  }
  const uint64_t id = next_id_++;
  Result<PageAllocation> allocation =
      pool_->allocate(testing::request(pages, content, pinned, this, id));
  if (longest >= pages) {
    ASSERT_TRUE(allocation.ok()) << allocation.status().to_string();
  }
  if (free_pages + evictable < pages) {
    ASSERT_EQ(allocation.status().code(), StatusCode::kResourceExhausted);
    ASSERT_EQ(evictions_in_op_, 0);
  }
  if (!allocation.ok()) {
    ASSERT_EQ(allocation.status().code(), StatusCode::kResourceExhausted);
    return;
  }
  const AllocationRef ref = allocation->release();
  live_[id] = Live{ref, content, pinned ? 1u : 0u};
  write_tags(id, ref);
}

void ModelTest::op_two_phase() {
  const int64_t pages = 1 + random_() % 6;
  const uint64_t id = next_id_++;
  const bool pinned = random_() % 2 == 0;
  const auto content = static_cast<ContentType>(random_() % kNumContentTypes);
  const PoolDebugState before = pool_->debug_state();
  Result<PreparedAllocation> prepared =
      pool_->prepare(testing::request(pages, content, pinned, this, id));
  if (!prepared.ok()) {
    ASSERT_EQ(prepared.status().code(), StatusCode::kResourceExhausted);
    return;
  }
  if (random_() % 2 == 0) {
    const bool made_room = prepared->made_room();
    ASSERT_TRUE(pool_->rollback(std::move(*prepared)).ok());
    if (!made_room) {
      ASSERT_EQ(pool_->debug_state(), before) << "rollback changed the pool";
    }
    return;
  }
  std::memset(prepared->data(), 0, static_cast<size_t>(pages) * testing::kSmallPage);
  Result<PageAllocation> committed = pool_->commit(std::move(*prepared));
  ASSERT_TRUE(committed.ok());
  const AllocationRef ref = committed->release();
  live_[id] = Live{ref, content, pinned ? 1u : 0u};
  write_tags(id, ref);
}

void ModelTest::op_free() {
  Live* live = pick();
  if (live == nullptr) return;
  const AllocationRef ref = live->ref;
  ASSERT_TRUE(pool_->free(ref).ok());
  std::erase_if(live_, [&](const auto& entry) { return entry.second.ref == ref; });
  dead_.push_back(ref);
}

void ModelTest::op_pin_or_unpin() {
  Live* live = pick();
  if (live == nullptr) return;
  const uint32_t roll = random_() % 3;
  if (roll == 0) {
    ASSERT_TRUE(pool_->touch(live->ref).ok());
  } else if (roll == 1) {
    ASSERT_TRUE(pool_->pin(live->ref).ok());
    ++live->pins;
  } else if (live->pins > 0) {
    ASSERT_TRUE(pool_->unpin(live->ref).ok());
    --live->pins;
  } else {
    const PoolDebugState before = pool_->debug_state();
    ASSERT_EQ(pool_->unpin(live->ref).code(), StatusCode::kFailedPrecondition);
    ASSERT_EQ(pool_->debug_state(), before) << "unpin below zero changed the pool";
  }
}

void ModelTest::op_stale() {
  if (dead_.empty()) return;
  const AllocationRef ref = dead_[random_() % dead_.size()];
  const PoolDebugState before = pool_->debug_state();
  ASSERT_EQ(pool_->free(ref).code(), StatusCode::kFailedPrecondition);
  ASSERT_EQ(pool_->pin(ref).code(), StatusCode::kFailedPrecondition);
  ASSERT_EQ(pool_->unpin(ref).code(), StatusCode::kFailedPrecondition);
  ASSERT_EQ(pool_->touch(ref).code(), StatusCode::kFailedPrecondition);
  ASSERT_EQ(pool_->debug_state(), before) << "a stale ref changed the pool";
}

void ModelTest::op_evict() {
  int64_t evictable = 0;
  for (const auto& [id, live] : live_) evictable += live.pins == 0 ? live.ref.num_pages() : 0;
  const int64_t want = 1 + random_() % 8;
  Result<int64_t> evicted = pool_->evict(want);
  ASSERT_TRUE(evicted.ok());
  ASSERT_EQ(*evicted >= want, evictable >= want) << "evict stopped early or went on";
}

void ModelTest::run(int steps) {
  for (int step = 0; step < steps; ++step) {
    evictions_in_op_ = 0;
    const uint32_t op = random_() % 100;
    if (op < 30) {
      op_allocate();
    } else if (op < 40) {
      op_two_phase();
    } else if (op < 58) {
      op_free();
    } else if (op < 85) {
      op_pin_or_unpin();
    } else if (op < 92) {
      pool_->advance_step();
    } else if (op < 96) {
      op_stale();
    } else {
      op_evict();
    }
    if (::testing::Test::HasFatalFailure()) {
      ADD_FAILURE() << "seed " << config_.seed << " step " << step;
      return;
    }
    check_model();
    if (::testing::Test::HasFatalFailure()) {
      ADD_FAILURE() << "seed " << config_.seed << " step " << step;
      return;
    }
  }
}

void PrintTo(const Config& config, std::ostream* out) {
  *out << "{cache " << config.thread_cache_pages
       << (config.fit == FitPolicy::kBestFit ? ", best fit" : ", first fit") << ", watermarks "
       << config.high << "/" << config.low << ", seed " << config.seed << "}";
}

class PagePoolRandomTest : public ::testing::TestWithParam<Config> {};

TEST_P(PagePoolRandomTest, OperationSequencesKeepEveryInvariant) {
  ModelTest model(GetParam());
  model.run(1500);
}

INSTANTIATE_TEST_SUITE_P(Configs, PagePoolRandomTest,
                         ::testing::Values(Config{0, FitPolicy::kBestFit, 1.0, 1.0, 101},
                                           Config{0, FitPolicy::kBestFit, 0.9, 0.8, 102},
                                           Config{4, FitPolicy::kBestFit, 0.9, 0.8, 103},
                                           Config{4, FitPolicy::kBestFit, 1.0, 1.0, 104},
                                           Config{0, FitPolicy::kFirstFit, 0.9, 0.8, 105},
                                           Config{4, FitPolicy::kFirstFit, 1.0, 0.7, 106},
                                           Config{16, FitPolicy::kBestFit, 0.9, 0.8, 107},
                                           Config{16, FitPolicy::kFirstFit, 0.85, 0.5, 108}));

}  // namespace
}  // namespace folio::memory
