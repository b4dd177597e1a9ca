// The page pool's statistics as rendered by the metrics registry.
#include "folio/memory/pool_metrics.h"

#include <gtest/gtest.h>

#include "folio/base/metrics.h"
#include "folio/memory/page_pool.h"
#include "pool_test_util.h"

namespace folio::memory {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos;
}

TEST(PoolMetricsTest, RenderedSeriesFollowThePoolsState) {
  metrics::Registry registry;
  PagePoolOptions options = testing::small_options(8);
  options.name = "kv";
  options.thread_cache_pages = 0;
  options.latency_sample_period = 1;
  options.metrics = &registry;
  testing::TestPool pool = testing::make_pool(options);
  testing::RecordingListener listener;
  PageAllocation kv = std::move(*pool->allocate(testing::request(2, ContentType::kKvCache)));
  PageAllocation scratch =
      std::move(*pool->allocate(testing::request(1, ContentType::kTemporary, false, &listener)));
  ASSERT_EQ(*pool->evict(1), 1);
  ASSERT_FALSE(pool->allocate(testing::request(7)).ok());

  const std::string text = registry.render();
  EXPECT_TRUE(has_line(text, R"(folio_pool_bytes_in_use{content="kv_cache",pool="kv"} 8192)"))
      << text;
  EXPECT_TRUE(has_line(text, R"(folio_pool_bytes_pinned{content="kv_cache",pool="kv"} 8192)"));
  EXPECT_TRUE(has_line(text, R"(folio_pool_pages{pool="kv",state="free"} 6)"));
  EXPECT_TRUE(has_line(text, R"(folio_pool_pages{pool="kv",state="pinned"} 2)"));
  EXPECT_TRUE(has_line(text, R"(folio_pool_utilization{pool="kv"} 0.25)"));
  EXPECT_TRUE(has_line(text, R"(folio_pool_capacity_bytes{pool="kv"} 32768)"));
  EXPECT_TRUE(has_line(text, R"(folio_pool_evictions_total{content="temporary",pool="kv"} 1)"));
  EXPECT_TRUE(
      has_line(text, R"(folio_pool_evicted_bytes_total{content="temporary",pool="kv"} 4096)"));
  EXPECT_TRUE(has_line(text, R"(folio_pool_failed_allocations_total{pool="kv"} 1)"));
  EXPECT_TRUE(has_line(text, R"(folio_pool_allocation_latency_seconds_count{pool="kv"} 2)"))
      << "two allocations succeeded, each sampled";
}

TEST(PoolMetricsTest, TwoLivePoolsMayNotShareANameInOneRegistry) {
  metrics::Registry registry;
  PagePoolOptions options = testing::small_options(4);
  options.metrics = &registry;
  testing::TestPool first = testing::make_pool(options);
  Result<std::unique_ptr<PagePool>> second = PagePool::create(*first.vm, options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists) << second.status().to_string();
  options.name = "other";
  Result<std::unique_ptr<PagePool>> third = PagePool::create(*first.vm, options);
  EXPECT_TRUE(third.ok()) << third.status().to_string();
}

TEST(PoolMetricsTest, ADestroyedPoolLeavesNoGaugeBehind) {
  metrics::Registry registry;
  PagePoolOptions options = testing::small_options(4);
  options.name = "gone";
  options.metrics = &registry;
  {
    testing::TestPool pool = testing::make_pool(options);
    EXPECT_NE(registry.render().find(R"(folio_pool_pages{pool="gone")"), std::string::npos);
  }
  EXPECT_EQ(registry.render().find("folio_pool_pages"), std::string::npos);
  // The name is free again.
  testing::TestPool again = testing::make_pool(options);
  EXPECT_NE(again.pool, nullptr);
}

}  // namespace
}  // namespace folio::memory
