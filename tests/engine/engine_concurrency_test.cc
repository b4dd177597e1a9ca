// The engine loop on its own thread while other threads submit, cancel, read statistics and
// render metrics (run under ThreadSanitizer by `ctest --preset tsan`). Not a benchmark.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "engine_test_util.h"
#include "folio/base/random.h"

namespace folio::engine {
namespace {

using testing::EngineHarness;
using testing::greedy_request;
using testing::HarnessOptions;
using testing::random_prompt;
using testing::Recorder;
using testing::reference_greedy;

struct Submission {
  RequestId id;
  std::vector<int32_t> prompt;
  int32_t max_tokens = 0;
};

class SubmissionLog {
 public:
  void add(Submission submission) {
    std::lock_guard lock(mutex_);
    submissions_.push_back(std::move(submission));
  }
  std::optional<RequestId> pick(uint64_t random) const {
    std::lock_guard lock(mutex_);
    if (submissions_.empty()) return std::nullopt;
    return submissions_[random % submissions_.size()].id;
  }
  std::vector<Submission> all() const {
    std::lock_guard lock(mutex_);
    return submissions_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<Submission> submissions_;
};

bool wait_for(const std::function<bool()>& done, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

HarnessOptions concurrent_options() {
  HarnessOptions options;
  options.num_pages = 8;  // 64 blocks: preemption happens
  options.scheduler.max_num_sequences = 16;
  options.scheduler.max_num_batched_tokens = 48;
  options.scheduler.prefill_chunk_size = 16;
  options.scheduler.max_preemptions = 1000000;
  return options;
}

TEST(EngineConcurrencyTest, SubmitAndCancelFromManyThreadsWhileTheLoopRuns) {
  const HarnessOptions options = concurrent_options();
  EngineHarness harness(options);
  Recorder recorder;
  SubmissionLog log;
  harness.engine().start();
  constexpr int kSubmitters = 4;
  constexpr int kPerSubmitter = 50;
  std::atomic<bool> submitting{true};
  std::vector<std::thread> threads;
  for (int thread = 0; thread < kSubmitters; ++thread) {
    threads.emplace_back([&, thread] {
      uint64_t state = 1000 + thread;
      SplitMix64 random(thread);
      for (int index = 0; index < kPerSubmitter; ++index) {
        Request request =
            greedy_request(random_prompt(state, static_cast<int32_t>(1 + random.next() % 30), 64),
                           static_cast<int32_t>(1 + random.next() % 24));
        Submission submission{RequestId(), request.prompt, request.max_tokens};
        submission.id = *harness.engine().submit(recorder.attach(request));
        log.add(std::move(submission));
        if (random.next() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
  }
  std::thread canceller([&] {
    SplitMix64 random(77);
    while (submitting.load(std::memory_order_relaxed)) {
      if (std::optional<RequestId> id = log.pick(random.next())) harness.engine().cancel(*id);
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
  });
  std::thread observer([&] {
    EngineStats last;
    while (submitting.load(std::memory_order_relaxed)) {
      // Each statistic is monotonic on its own (two of them need not be from the same moment).
      const EngineStats stats = harness.engine().stats();
      EXPECT_GE(stats.requests_submitted, last.requests_submitted);
      EXPECT_GE(stats.requests_finished, last.requests_finished);
      EXPECT_GE(stats.generated_tokens, last.generated_tokens);
      last = stats;
      EXPECT_NE(harness.registry().render().find("folio_engine_steps_total"), std::string::npos);
      std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
  });
  for (std::thread& thread : threads) thread.join();
  const int64_t total = int64_t{kSubmitters} * kPerSubmitter;
  const bool drained =
      wait_for([&] { return recorder.num_finished() == total; }, std::chrono::seconds(120));
  submitting.store(false, std::memory_order_relaxed);
  canceller.join();
  observer.join();
  harness.engine().stop();
  ASSERT_TRUE(drained) << recorder.num_finished() << " of " << total << " finished";

  const std::vector<Submission> submissions = log.all();
  std::vector<RequestId> ids;
  for (const Submission& submission : submissions) ids.push_back(submission.id);
  recorder.expect_each_finished_once(ids);
  int cancelled = 0;
  for (const Submission& submission : submissions) {
    const Completion completion = recorder.completion(submission.id);
    ASSERT_NE(completion.reason, FinishReason::kError) << completion.error;
    const std::vector<int32_t> expected =
        reference_greedy(options, submission.prompt, submission.max_tokens);
    const std::vector<int32_t> tokens = recorder.stream(submission.id).tokens;
    if (completion.reason == FinishReason::kCancelled) {
      ++cancelled;
      ASSERT_LE(tokens.size(), expected.size());
      EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), expected.begin()));
    } else {
      EXPECT_EQ(tokens, expected) << "request " << submission.id.value();
    }
  }
  harness.engine().check_invariants();
  harness.expect_all_blocks_free_or_cached();
  EXPECT_EQ(harness.engine().stats().requests_finished, total);
  // Not asserted (timing-dependent): how many cancellations landed before completion.
  (void)cancelled;
}

TEST(EngineConcurrencyTest, StopWhileThreadsSubmitEndsEveryAcceptedRequest) {
  EngineHarness harness(concurrent_options());
  Recorder recorder;
  SubmissionLog log;
  harness.engine().start();
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int thread = 0; thread < 3; ++thread) {
    threads.emplace_back([&, thread] {
      uint64_t state = 50 + thread;
      for (int index = 0; index < 200; ++index) {
        Request request = greedy_request(random_prompt(state, 12, 64), 16);
        Result<RequestId> id = harness.engine().submit(recorder.attach(request));
        if (!id.ok()) {
          EXPECT_EQ(id.status().code(), StatusCode::kFailedPrecondition);
          refused.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        log.add(Submission{*id, {}, 0});
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  harness.engine().stop();
  for (std::thread& thread : threads) thread.join();
  std::vector<RequestId> ids;
  for (const Submission& submission : log.all()) ids.push_back(submission.id);
  recorder.expect_each_finished_once(ids);
  for (RequestId id : ids) {
    const Completion completion = recorder.completion(id);
    if (completion.reason == FinishReason::kError) {
      EXPECT_EQ(completion.error.code(), StatusCode::kUnavailable);
    }
  }
  EXPECT_EQ(static_cast<int>(ids.size()) + refused.load(), 600);
  harness.expect_all_blocks_free_or_cached();
}

}  // namespace
}  // namespace folio::engine
