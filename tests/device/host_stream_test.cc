// HostStream / HostGraph: eager launches run each item once, capture records without running,
// replay runs the recorded kernels in order, and, the property the graph executor relies on, a
// kernel that reads a value through a pointer sees the value current at replay while one that
// captured the value in its arguments keeps the captured one. An observer sees every kernel
// run, eager or replayed, once, with the tag it was launched under, and none captured.
#include "folio/device/host_stream.h"

#include <atomic>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

namespace folio::device {
namespace {

constexpr int kThreads = 4;

struct CountArguments {
  std::atomic<int>* counts;  // i32 [num_items]
};
void count_items(const CountArguments& arguments, int64_t begin, int64_t end, int) {
  for (int64_t i = begin; i < end; ++i) arguments.counts[i].fetch_add(1, std::memory_order_relaxed);
}

struct AffineArguments {
  int64_t* values;  // i64 [num_items]
  int64_t multiplier;
  int64_t addend;
};
void apply_affine(const AffineArguments& arguments, int64_t begin, int64_t end, int) {
  for (int64_t i = begin; i < end; ++i) {
    arguments.values[i] = arguments.values[i] * arguments.multiplier + arguments.addend + i;
  }
}

// Both counts are read at run time, from the arguments: one through a pointer, one as a copy.
struct ReadCountArguments {
  const int64_t* count_through_pointer;
  int64_t count_by_value;
  int64_t* seen_through_pointer;
  int64_t* seen_by_value;
};
void read_counts(const ReadCountArguments& arguments, int64_t, int64_t, int) {
  *arguments.seen_through_pointer = *arguments.count_through_pointer;
  *arguments.seen_by_value = arguments.count_by_value;
}

TEST(HostStreamTest, EagerLaunchRunsEveryItemExactlyOnce) {
  ThreadPool pool(kThreads);
  HostStream stream(pool);
  constexpr int64_t kItems = 1000;
  std::vector<std::atomic<int>> counts(kItems);
  stream.launch(HostKernel::make<CountArguments, count_items>("count", {counts.data()}, kItems, 7));
  for (int64_t i = 0; i < kItems; ++i) ASSERT_EQ(counts[i].load(), 1) << "item " << i;
  EXPECT_EQ(stream.num_eager_launches(), 1u);
}

TEST(HostStreamTest, CaptureRecordsLaunchesWithoutRunningThem) {
  ThreadPool pool(kThreads);
  HostStream stream(pool);
  std::vector<std::atomic<int>> counts(16);
  stream.begin_capture();
  EXPECT_TRUE(stream.is_capturing());
  stream.launch(HostKernel::make<CountArguments, count_items>("first", {counts.data()}, 16));
  stream.launch(HostKernel::make<CountArguments, count_items>("second", {counts.data()}, 8));
  const HostGraph graph = stream.end_capture();
  EXPECT_FALSE(stream.is_capturing());
  for (const std::atomic<int>& count : counts) EXPECT_EQ(count.load(), 0);
  EXPECT_EQ(stream.num_eager_launches(), 0u);
  ASSERT_EQ(graph.num_kernels(), 2u);
  EXPECT_STREQ(graph.kernels()[0].name, "first");
  EXPECT_EQ(graph.kernels()[1].num_items, 8);
}

TEST(HostStreamTest, ReplayRunsTheRecordedKernelsInOrderEveryTime) {
  ThreadPool pool(kThreads);
  HostStream stream(pool);
  constexpr int64_t kItems = 257;
  std::vector<int64_t> values(kItems, 1);
  stream.begin_capture();
  // Order matters: (v * 2 + 0 + i) then (v * 3 + 1 + i) differs from the other way round.
  stream.launch(
      HostKernel::make<AffineArguments, apply_affine>("double", {values.data(), 2, 0}, kItems, 16));
  stream.launch(
      HostKernel::make<AffineArguments, apply_affine>("triple", {values.data(), 3, 1}, kItems, 16));
  const HostGraph graph = stream.end_capture();
  std::vector<int64_t> expected(kItems, 1);
  for (int replay = 0; replay < 3; ++replay) {
    stream.replay(graph);
    for (int64_t i = 0; i < kItems; ++i) expected[i] = (expected[i] * 2 + i) * 3 + 1 + i;
    ASSERT_EQ(values, expected) << "replay " << replay;
  }
  EXPECT_EQ(stream.num_replayed_kernels(), 6u);
  EXPECT_EQ(stream.num_eager_launches(), 0u);
}

TEST(HostStreamTest, ReplayReadsThroughPointersButKeepsCapturedValues) {
  ThreadPool pool(kThreads);
  HostStream stream(pool);
  int64_t count = 3;
  int64_t seen_through_pointer = -1;
  int64_t seen_by_value = -1;
  stream.begin_capture();
  stream.launch(HostKernel::make<ReadCountArguments, read_counts>(
      "read_counts", {&count, count, &seen_through_pointer, &seen_by_value}, 1));
  const HostGraph graph = stream.end_capture();
  count = 7;
  stream.replay(graph);
  EXPECT_EQ(seen_through_pointer, 7);
  EXPECT_EQ(seen_by_value, 3);
  count = 11;
  stream.replay(graph);
  EXPECT_EQ(seen_through_pointer, 11);
  EXPECT_EQ(seen_by_value, 3);
}

TEST(HostStreamTest, EagerLaunchesAfterCaptureRunAgain) {
  ThreadPool pool(1);
  HostStream stream(pool);
  std::vector<std::atomic<int>> counts(4);
  const HostKernel kernel =
      HostKernel::make<CountArguments, count_items>("count", {counts.data()}, 4);
  stream.begin_capture();
  stream.launch(kernel);
  const HostGraph graph = stream.end_capture();
  stream.launch(kernel);
  stream.replay(graph);
  for (const std::atomic<int>& value : counts) EXPECT_EQ(value.load(), 2);
  EXPECT_EQ(stream.num_eager_launches(), 1u);
  EXPECT_EQ(stream.num_replayed_kernels(), 1u);
}

TEST(HostStreamDeathTest, NestedCaptureAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ThreadPool pool(1);
  HostStream stream(pool);
  stream.begin_capture();
  EXPECT_DEATH(stream.begin_capture(), "already capturing");
}

// Records what a stream reports.
class RecordingObserver final : public HostKernelObserver {
 public:
  struct Report {
    int32_t tag;
    bool first_of_tag;
    KernelTiming timing;
  };
  void on_kernel(const HostKernel& kernel, const KernelTiming& timing) override {
    reports.push_back({kernel.tag, kernel.first_of_tag, timing});
  }
  std::vector<Report> reports;
};

TEST(HostStreamTest, ObserverSeesEveryKernelRunWithItsTagEagerAndReplayed) {
  ThreadPool pool(kThreads);
  HostStream stream(pool);
  RecordingObserver observer;
  stream.set_observer(&observer);
  constexpr int64_t kItems = 1000;
  std::vector<std::atomic<int>> counts(kItems);
  const HostKernel kernel =
      HostKernel::make<CountArguments, count_items>("count", {counts.data()}, kItems, 7);
  stream.set_launch_tag(3);
  stream.launch(kernel);
  stream.launch(kernel);
  stream.set_launch_tag(5);
  stream.begin_capture();
  stream.launch(kernel);
  stream.set_launch_tag(6);
  stream.launch(kernel);
  const HostGraph graph = stream.end_capture();
  EXPECT_EQ(observer.reports.size(), 2u);  // a capture runs, and reports, nothing
  stream.replay(graph);
  stream.replay(graph);
  ASSERT_EQ(observer.reports.size(), 6u);
  const std::vector<int32_t> tags = {3, 3, 5, 6, 5, 6};
  const std::vector<bool> firsts = {true, false, true, true, true, true};
  for (size_t index = 0; index < tags.size(); ++index) {
    const RecordingObserver::Report& report = observer.reports[index];
    EXPECT_EQ(report.tag, tags[index]) << "report " << index;
    EXPECT_EQ(report.first_of_tag, firsts[index]) << "report " << index;
    EXPECT_EQ(report.timing.num_threads, kThreads);
    EXPECT_GT(report.timing.wall_seconds, 0.0);
    EXPECT_GT(report.timing.busy_seconds, 0.0);
    EXPECT_LE(report.timing.busy_seconds, report.timing.wall_seconds * kThreads);
  }
  for (int64_t i = 0; i < kItems; ++i) ASSERT_EQ(counts[i].load(), 6) << "item " << i;

  stream.set_observer(nullptr);
  stream.replay(graph);
  EXPECT_EQ(observer.reports.size(), 6u);
}

}  // namespace
}  // namespace folio::device
