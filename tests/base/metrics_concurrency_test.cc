// Metrics updated from several threads while others register series and render: no update is
// lost, every render is valid exposition text, counters never go backwards between renders, and
// a gauge function is never called after remove_gauge_function returns. Not a benchmark; run
// under ThreadSanitizer in CI.
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "exposition_validator.h"
#include "folio/base/metrics.h"

namespace folio::metrics {
namespace {

constexpr int kNumWriters = 4;
constexpr int kIterations = 2000;

// The value of each counter sample in one render, keyed by "name{labels}".
std::map<std::string, double> counter_values(const std::vector<testing::ParsedFamily>& families) {
  std::map<std::string, double> values;
  for (const auto& family : families) {
    for (const auto& sample : family.samples) {
      const bool cumulative = family.type == "counter" || sample.name.ends_with("_bucket") ||
                              sample.name.ends_with("_count");
      if (!cumulative) continue;
      std::string key = sample.name;
      for (const auto& [label, value] : sample.labels) key += fmt::format(",{}={}", label, value);
      values[key] = sample.value;
    }
  }
  return values;
}

void write_metrics(Registry& registry, int writer, std::atomic<int>& failures) {
  const Labels shared_labels = {{"shard", std::to_string(writer % 2)}};  // two writers per series
  Counter* requests = registry.counter("requests_total", "Requests.", shared_labels).value();
  Gauge* in_flight = registry.gauge("in_flight", "Requests running.").value();
  Histogram* latency = registry.histogram("latency", "Latency.", {1, 2, 4}, shared_labels).value();
  for (int i = 0; i < kIterations; ++i) {
    if (i % 16 == 0) {
      // Concurrent get-or-create must keep returning the same objects.
      if (registry.counter("requests_total", "Requests.", shared_labels).value() != requests ||
          registry.histogram("latency", "Latency.", {1, 2, 4}, shared_labels).value() != latency) {
        failures.fetch_add(1);
      }
    }
    if (i % 100 == 0) {
      const Labels own = {{"writer", std::to_string(writer)}};
      const Status added =
          registry.gauge_function("writer_alive", "Alive.", own, [] { return 1.0; });
      const Status removed = registry.remove_gauge_function("writer_alive", own);
      if (!added.ok() || !removed.ok()) failures.fetch_add(1);
    }
    in_flight->add(1);
    requests->increment();
    latency->observe(i % 5);  // 0..4: exact sums
    in_flight->add(-1);
  }
}

TEST(MetricsConcurrencyTest, UpdatesFromManyThreadsWhileRenderingLoseNothing) {
  Registry registry;
  std::atomic<int> failures{0};
  std::atomic<int> writers_done{0};
  std::atomic<int> renders{0};
  std::thread renderer([&] {
    std::map<std::string, double> previous;
    while (writers_done.load() < kNumWriters) {
      auto parsed = testing::parse_exposition(registry.render());
      if (!parsed.ok()) {
        ADD_FAILURE() << parsed.status();
        return;
      }
      const std::map<std::string, double> current = counter_values(*parsed);
      for (const auto& [key, value] : previous) {
        auto it = current.find(key);
        if (it == current.end() || it->second < value) {
          ADD_FAILURE() << key << " went from " << value << " backwards";
          return;
        }
      }
      previous = current;
      renders.fetch_add(1);
    }
  });
  std::vector<std::thread> writers;
  for (int writer = 0; writer < kNumWriters; ++writer) {
    writers.emplace_back([&, writer] {
      write_metrics(registry, writer, failures);
      writers_done.fetch_add(1);
    });
  }
  for (std::thread& writer : writers) writer.join();
  renderer.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(renders.load(), 0);

  const Labels shard0 = {{"shard", "0"}};
  EXPECT_EQ(registry.counter("requests_total", "Requests.", shard0).value()->value(),
            2 * kIterations);
  EXPECT_EQ(registry.gauge("in_flight", "Requests running.").value()->value(), 0);
  Histogram* latency = registry.histogram("latency", "Latency.", {1, 2, 4}, shard0).value();
  EXPECT_EQ(latency->count(), 2u * kIterations);
  EXPECT_EQ(latency->sum(), 2 * (kIterations / 5) * (0 + 1 + 2 + 3 + 4));
  // Per writer, i % 5 puts 2/5 of observations <= 1, 3/5 <= 2, all <= 4.
  EXPECT_EQ(latency->cumulative_bucket_counts(),
            (std::vector<uint64_t>{2 * kIterations * 2 / 5, 2 * kIterations * 3 / 5,
                                   2 * kIterations, 2 * kIterations}));
  EXPECT_EQ(registry.render().find("writer_alive"), std::string::npos);
}

// An object that publishes a gauge function and unregisters it in its destructor.
class PoolStatistics {
 public:
  PoolStatistics(Registry& registry, int id, std::atomic<int>& calls_after_removal)
      : registry_(registry),
        labels_{{"pool", std::to_string(id)}},
        calls_after_removal_(calls_after_removal) {
    const Status status = registry_.gauge_function("pool_bytes", "Bytes.", labels_, [this] {
      if (removed_.load(std::memory_order_acquire)) calls_after_removal_.fetch_add(1);
      return static_cast<double>(bytes_.load(std::memory_order_relaxed));
    });
    EXPECT_TRUE(status.ok()) << status;
  }
  ~PoolStatistics() {
    const Status status = registry_.remove_gauge_function("pool_bytes", labels_);
    EXPECT_TRUE(status.ok()) << status;
    removed_.store(true, std::memory_order_release);
  }
  void set_bytes(int64_t bytes) { bytes_.store(bytes, std::memory_order_relaxed); }

 private:
  Registry& registry_;
  const Labels labels_;
  std::atomic<int>& calls_after_removal_;
  std::atomic<int64_t> bytes_{0};
  std::atomic<bool> removed_{false};
};

TEST(MetricsConcurrencyTest, GaugeFunctionIsNeverCalledAfterRemoval) {
  Registry registry;
  std::atomic<int> calls_after_removal{0};
  std::atomic<bool> stop{false};
  std::thread renderer([&] {
    while (!stop.load()) {
      auto parsed = testing::parse_exposition(registry.render());
      if (!parsed.ok()) ADD_FAILURE() << parsed.status();
    }
  });
  std::vector<std::thread> owners;
  for (int owner = 0; owner < 3; ++owner) {
    owners.emplace_back([&, owner] {
      for (int round = 0; round < 300; ++round) {
        auto statistics = std::make_unique<PoolStatistics>(registry, owner, calls_after_removal);
        statistics->set_bytes(round);
      }  // destroyed here: removes itself, then its memory is freed
    });
  }
  for (std::thread& owner : owners) owner.join();
  stop.store(true);
  renderer.join();
  EXPECT_EQ(calls_after_removal.load(), 0);
  EXPECT_EQ(registry.render(), "");
}

}  // namespace
}  // namespace folio::metrics
