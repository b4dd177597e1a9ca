// Recovery of the step runner with the engine loop on its own thread (run under ThreadSanitizer
// by `ctest --preset tsan`): health() while a runner call is stuck, an unavailable runner that
// comes back (the loop retries recover()), and faults while other threads submit and read
// health() and statistics. Waits are bounded polls of conditions, never sleeps that stand for
// synchronization; the stuck call is held by a gate the test opens.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "engine_test_util.h"

namespace folio::engine {
namespace {

using testing::EngineHarness;
using testing::FaultInjectingStepRunner;
using testing::greedy_request;
using testing::HarnessOptions;
using testing::iota_prompt;
using testing::Recorder;
using testing::reference_greedy;
using Call = FaultInjectingStepRunner::Call;
using Fault = FaultInjectingStepRunner::Fault;

bool wait_for(const std::function<bool()>& done, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Holds run() until opened: a worker that does not answer.
class Gate {
 public:
  void pass() {
    std::unique_lock lock(mutex_);
    ++arrivals_;
    arrived_.notify_all();
    opened_.wait(lock, [&] { return open_; });
  }
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    opened_.notify_all();
  }
  void close() {
    std::lock_guard lock(mutex_);
    open_ = false;
  }
  // Waits (bounded) until run() has arrived `count` times in all.
  bool wait_arrivals(int64_t count) {
    std::unique_lock lock(mutex_);
    return arrived_.wait_for(lock, std::chrono::seconds(60), [&] { return arrivals_ >= count; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::condition_variable opened_;
  int64_t arrivals_ = 0;
  bool open_ = true;
};

TEST(EngineRecoveryConcurrencyTest, HealthShowsNoProgressWhileARunnerCallIsStuck) {
  HarnessOptions options;
  options.inject_faults = true;
  EngineHarness harness(options);
  Engine& engine = harness.engine();
  Gate gate;
  gate.close();
  harness.fault_runner().set_run_gate([&] { gate.pass(); });
  Recorder recorder;
  engine.start();
  Request request = greedy_request(iota_prompt(9), 5);
  const RequestId id = *engine.submit(recorder.attach(request));
  ASSERT_TRUE(gate.wait_arrivals(1));
  // The loop is inside run(): time passes without progress.
  harness.clock().advance(std::chrono::seconds(7));
  EngineHealth health = engine.health();
  EXPECT_TRUE(health.runner_available);
  EXPECT_TRUE(health.has_work);
  EXPECT_GE(health.seconds_since_progress, 7.0);
  harness.clock().advance(std::chrono::seconds(5));
  EXPECT_GE(engine.health().seconds_since_progress, 12.0);
  gate.open();
  ASSERT_TRUE(wait_for([&] { return recorder.finished(id); }, std::chrono::seconds(60)));
  // The step ends (progress noted at the clock's 12 s) and the loop goes idle: no stall left.
  ASSERT_TRUE(wait_for(
      [&] {
        const EngineHealth after = engine.health();
        return !after.has_work && after.seconds_since_progress == 0.0;
      },
      std::chrono::seconds(60)));
  engine.stop();
  EXPECT_EQ(recorder.stream(id).tokens, reference_greedy(options, iota_prompt(9), 5));
}

TEST(EngineRecoveryConcurrencyTest, TheLoopRetriesAnUnavailableRunnerUntilItServesAgain) {
  HarnessOptions options;
  options.inject_faults = true;
  options.scheduler.max_num_sequences = 2;
  options.recovery_retry_interval = std::chrono::milliseconds(2);
  EngineHarness harness(options);
  Engine& engine = harness.engine();
  FaultInjectingStepRunner& runner = harness.fault_runner();
  runner.set_fault_plan([](Call call, int64_t index, const ir::StepBatch&) {
    std::optional<Fault> fault;
    if (call == Call::kRun && index == 3) {
      fault.emplace();
      fault->loss = RunnerRecovery{RunnerRecovery::LostKv::kStageKv, 0};
    }
    return fault;
  });
  runner.set_recover_fails(true);
  Recorder recorder;
  std::vector<RequestId> ids;
  for (int32_t index = 0; index < 5; ++index) {
    Request request = greedy_request(iota_prompt(6 + index, index), 12);
    ids.push_back(*engine.submit(recorder.attach(request)));
  }
  engine.start();
  ASSERT_TRUE(wait_for([&] { return recorder.num_finished() == 5; }, std::chrono::seconds(60)));
  recorder.expect_each_finished_once(ids);
  for (RequestId id : ids) {
    EXPECT_EQ(recorder.completion(id).error.code(), StatusCode::kUnavailable)
        << recorder.completion(id).error;
  }
  EXPECT_FALSE(engine.health().runner_available);
  Request refused = greedy_request(iota_prompt(4), 3);
  const Result<RequestId> refused_id = engine.submit(recorder.attach(refused));
  ASSERT_FALSE(refused_id.ok());
  EXPECT_EQ(refused_id.status().code(), StatusCode::kUnavailable);
  // The loop keeps asking (every 2 ms).
  ASSERT_TRUE(
      wait_for([&] { return engine.stats().recovery_failures >= 3; }, std::chrono::seconds(60)));

  runner.set_recover_fails(false);  // the workers are back
  ASSERT_TRUE(wait_for([&] { return engine.health().runner_available; }, std::chrono::seconds(60)));
  std::vector<RequestId> later;
  for (int32_t index = 0; index < 4; ++index) {
    Request request = greedy_request(iota_prompt(5 + index, 20 + index), 10);
    Result<RequestId> id = engine.submit(recorder.attach(request));
    ASSERT_TRUE(id.ok()) << id.status();
    later.push_back(*id);
  }
  ASSERT_TRUE(wait_for([&] { return recorder.num_finished() == 9; }, std::chrono::seconds(60)));
  engine.stop();
  for (int32_t index = 0; index < 4; ++index) {
    EXPECT_EQ(recorder.completion(later[index]).reason, FinishReason::kLength);
    EXPECT_EQ(recorder.stream(later[index]).tokens,
              reference_greedy(options, iota_prompt(5 + index, 20 + index), 10));
  }
  EXPECT_EQ(engine.stats().recoveries, 1);
  harness.expect_all_blocks_free_or_cached();
}

TEST(EngineRecoveryConcurrencyTest, FaultsWhileThreadsSubmitAndReadHealth) {
  HarnessOptions options;
  options.inject_faults = true;
  options.num_pages = 8;
  options.scheduler.max_num_sequences = 8;
  options.scheduler.max_num_batched_tokens = 32;
  options.scheduler.prefill_chunk_size = 8;
  options.scheduler.max_preemptions = 1000000;
  options.max_recoveries_per_request = 1000;
  EngineHarness harness(options);
  Engine& engine = harness.engine();
  FaultInjectingStepRunner& runner = harness.fault_runner();
  auto random = std::make_shared<SplitMix64>(99);
  runner.set_fault_plan([random](Call call, int64_t, const ir::StepBatch&) {
    std::optional<Fault> fault;
    if (random->next() % (call == Call::kRun ? 5 : 9) == 0) {
      fault.emplace();
      fault->run_first = random->next() % 2 == 0;
      switch (random->next() % 3) {
        case 0:
          fault->loss = RunnerRecovery{RunnerRecovery::LostKv::kNone, -1};
          break;
        case 1:
          fault->loss = RunnerRecovery{RunnerRecovery::LostKv::kStageKv, 0};
          break;
        default:
          fault->loss = RunnerRecovery{RunnerRecovery::LostKv::kAllKv, -1};
          break;
      }
    }
    return fault;
  });
  Recorder recorder;
  engine.start();
  std::atomic<bool> running{true};
  std::thread reader([&] {
    while (running.load(std::memory_order_relaxed)) {
      const EngineHealth health = engine.health();
      EXPECT_TRUE(health.runner_available);
      EXPECT_GE(health.seconds_since_progress, 0.0);
      (void)engine.stats();
      (void)harness.registry().render();
      std::this_thread::yield();
    }
  });
  constexpr int kSubmitters = 3;
  constexpr int kPerSubmitter = 12;
  std::mutex ids_mutex;
  std::vector<std::pair<RequestId, std::vector<int32_t>>> submitted;
  std::vector<std::thread> submitters;
  for (int thread = 0; thread < kSubmitters; ++thread) {
    submitters.emplace_back([&, thread] {
      for (int index = 0; index < kPerSubmitter; ++index) {
        std::vector<int32_t> prompt = iota_prompt(3 + (index * 5 + thread) % 30, thread + index);
        Request request = greedy_request(prompt, 4 + index % 9);
        Result<RequestId> id = engine.submit(recorder.attach(request));
        ASSERT_TRUE(id.ok()) << id.status();
        std::lock_guard lock(ids_mutex);
        submitted.emplace_back(*id, std::move(prompt));
      }
    });
  }
  for (std::thread& thread : submitters) thread.join();
  const bool all_done =
      wait_for([&] { return recorder.num_finished() == kSubmitters * kPerSubmitter; },
               std::chrono::seconds(120));
  running.store(false, std::memory_order_relaxed);
  reader.join();
  engine.stop();
  ASSERT_TRUE(all_done);
  for (const auto& [id, prompt] : submitted) {
    const Completion completion = recorder.completion(id);
    EXPECT_EQ(completion.reason, FinishReason::kLength) << completion.error;
    EXPECT_EQ(recorder.stream(id).tokens,
              reference_greedy(options, prompt, completion.num_generated_tokens));
  }
  EXPECT_GT(runner.num_faults(), 0);
  EXPECT_EQ(engine.stats().recoveries, runner.num_faults());
  harness.expect_all_blocks_free_or_cached();
}

}  // namespace
}  // namespace folio::engine
