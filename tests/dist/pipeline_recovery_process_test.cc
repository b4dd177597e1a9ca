// Recovery (issue 16) with real `folio worker` processes (FOLIO_BINARY_PATH): a pipeline of two
// worker processes runs the step script; one is killed (SIGKILL) or stopped (SIGSTOP) mid-run,
// the coordinator notices (the broken stream, or the missed lease: about interval x misses, not
// the step's 30 s deadline), recover() puts a freshly spawned worker process in its place, the
// steps already run are replayed through the lost stage, and every logits row equals the whole
// model's in this process bit for bit. The stopped worker, continued, beats again: its beats are
// counted as stale, it is told to exit and it does (exit status 0). A last test measures the
// lease's detection times over repeated kills and stops and prints their p50 and p99.
#include <signal.h>
#include <sys/wait.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "folio/dist/pipeline_step_runner.h"
#include "folio/dist/worker_lease_monitor.h"
#include "pipeline_test_model.h"
#include "process_pipeline.h"
#include "testing/worker_process.h"

namespace folio::dist {
namespace {

using namespace std::chrono_literals;
using engine::RunnerRecovery;
using folio::testing::WorkerProcess;
using testing::expect_bit_equal;
using ::testing::HasSubstr;
using testing::ModelOnDisk;
using Clock = std::chrono::steady_clock;

using testing::kLeaseInterval;
using testing::kPipelineLeaseMisses;
using testing::ProcessPipeline;
using testing::wait_for;
// The lease of the detection measurement, as production's default.
constexpr int32_t kLeaseMisses = 3;

// Recovers the runner from `failure` (stage 1 lost), replays steps [0, failing_step) through
// stage 1 and runs the rest of the script, bit-equal to `expected`.
void recover_and_finish(PipelineStepRunner& runner, const Status& failure,
                        const std::vector<folio::testing::PipelineStepArrays>& steps,
                        const std::vector<std::vector<float>>& expected, size_t failing_step) {
  const Result<RunnerRecovery> recovery = runner.recover(failure);
  ASSERT_TRUE(recovery.ok()) << recovery.status();
  EXPECT_EQ(recovery->lost_kv, RunnerRecovery::LostKv::kStageKv);
  EXPECT_EQ(recovery->replay_through_stage, 1);
  EXPECT_EQ(runner.epoch(), kFirstEpoch + 1);
  for (size_t index = 0; index < failing_step; ++index) {
    ASSERT_TRUE(runner.replay(steps[index].batch(), recovery->replay_through_stage).ok());
  }
  for (size_t index = failing_step; index < steps.size(); ++index) {
    expect_bit_equal(runner.run(steps[index].batch()), expected[index], index);
  }
}

TEST(PipelineRecoveryProcessTest, KilledWorkerIsReplacedByANewProcessAndTheLogitsStayBitEqual) {
  const ModelOnDisk model(DType::kF32);
  const std::vector<std::vector<float>> expected =
      testing::reference_logits(model, testing::stage_spec(0, testing::kNumLayers, true));
  const std::vector<folio::testing::PipelineStepArrays> steps = testing::script_steps();
  ProcessPipeline pipeline(model);
  PipelineStepRunner& runner = pipeline.runner();
  const std::string lost_address = runner.worker_info(1).address;
  constexpr size_t kFailingStep = 4;
  for (size_t index = 0; index < kFailingStep; ++index) {
    expect_bit_equal(runner.run(steps[index].batch()), expected[index], index);
  }
  pipeline.worker(1).signal(SIGKILL);
  const Clock::time_point killed = Clock::now();
  const int status = pipeline.worker(1).wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  // The lease notices on its own (the stream breaks), before any step asks.
  ASSERT_TRUE(wait_for([&] { return !runner.recovery_counters().detection_seconds.empty(); }));
  const double noticed = std::chrono::duration<double>(Clock::now() - killed).count();
  std::printf("SIGKILL: declared lost %.1f ms after the kill (%.1f ms after its last beat)\n",
              noticed * 1e3, runner.recovery_counters().detection_seconds.front() * 1e3);

  const Result<ir::StepOutput> failed = runner.run(steps[kFailingStep].batch());
  ASSERT_EQ(failed.status().code(), StatusCode::kUnavailable) << failed.status();
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("pipeline stage 1"));
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr(lost_address));
  recover_and_finish(runner, failed.status(), steps, expected, kFailingStep);
  EXPECT_EQ(pipeline.num_processes(), 3u);
  EXPECT_NE(runner.worker_info(1).address, lost_address);
  EXPECT_EQ(runner.recovery_counters().workers_lost, 1);
}

TEST(PipelineRecoveryProcessTest, StoppedWorkerIsGivenUpOnAfterItsLeaseAndToldToExitWhenItWakes) {
  const ModelOnDisk model(DType::kF32);
  const std::vector<std::vector<float>> expected =
      testing::reference_logits(model, testing::stage_spec(0, testing::kNumLayers, true));
  const std::vector<folio::testing::PipelineStepArrays> steps = testing::script_steps();
  ProcessPipeline pipeline(model);
  PipelineStepRunner& runner = pipeline.runner();
  constexpr size_t kFailingStep = 5;
  for (size_t index = 0; index < kFailingStep; ++index) {
    expect_bit_equal(runner.run(steps[index].batch()), expected[index], index);
  }
  WorkerProcess& stopped = pipeline.worker(1);
  stopped.signal(SIGSTOP);
  stopped.wait_until_stopped();
  // The step waits on the stopped stage until the lease monitor gives the worker up and cancels
  // the call: the error says so (not "did not answer RunStage within 30000 ms").
  const Clock::time_point start = Clock::now();
  const Result<ir::StepOutput> failed = runner.run(steps[kFailingStep].batch());
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_EQ(failed.status().code(), StatusCode::kUnavailable) << failed.status();
  EXPECT_THAT(std::string(failed.status().message()),
              HasSubstr(fmt::format("no lease beat for {} intervals of {} ms", kPipelineLeaseMisses,
                                    kLeaseInterval.count())));
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("pipeline stage 1"));
  ASSERT_EQ(runner.recovery_counters().detection_seconds.size(), 1u);
  std::printf(
      "SIGSTOP: the step failed after %.1f ms; declared lost %.1f ms after the last beat "
      "(lease %d x %lld ms)\n",
      waited * 1e3, runner.recovery_counters().detection_seconds.front() * 1e3,
      kPipelineLeaseMisses, static_cast<long long>(kLeaseInterval.count()));

  recover_and_finish(runner, failed.status(), steps, expected, kFailingStep);

  // Continued, the old worker beats again in its old epoch: stale, so it is told to exit.
  stopped.signal(SIGCONT);
  ASSERT_TRUE(wait_for([&] { return runner.recovery_counters().shutdowns_sent >= 1; }))
      << stopped.output();
  EXPECT_GE(runner.recovery_counters().stale_beats, 1);
  EXPECT_TRUE(stopped.read_to_end(60s)) << stopped.output();
  const int status = stopped.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << stopped.output();
  EXPECT_THAT(stopped.output(), HasSubstr("told to exit"));
  // The pipeline runs on, unaffected: the script's last step once more (same KV, same logits).
  expect_bit_equal(runner.run(steps.back().batch()), expected.back(), steps.size() - 1);
}

double percentile(std::vector<double> values, double fraction) {
  std::sort(values.begin(), values.end());
  const auto index = static_cast<size_t>(fraction * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(index, values.size() - 1)];
}

// Not a benchmark with a pass mark: it checks that every kill and stop is declared (the flag is
// set, the time recorded), and prints the times.
TEST(PipelineRecoveryProcessTest, DetectionTimesOverRepeatedKillsAndStops) {
  constexpr int kRounds = 20;
  RecoveryStats stats;
  WorkerLeaseMonitor monitor(1, LeaseOptions{.interval = kLeaseInterval, .misses = kLeaseMisses},
                             stats);
  for (const int signal_number : {SIGKILL, SIGSTOP}) {
    std::vector<double> from_signal;
    const size_t before = stats.snapshot().detection_seconds.size();
    for (int round = 0; round < kRounds; ++round) {
      WorkerProcess worker({"--listen", "127.0.0.1:0"});
      const std::string address = worker.wait_for_listening(60s);
      ASSERT_FALSE(address.empty()) << worker.output();
      Result<std::unique_ptr<WorkerClient>> client = WorkerClient::connect(address, {});
      ASSERT_TRUE(client.ok()) << client.status();
      std::shared_ptr<WorkerClient> shared = std::move(client).value();
      ASSERT_TRUE(shared->ping().ok());
      ASSERT_TRUE(monitor.watch(0, shared, kFirstEpoch).ok());
      // A beat first, so the lease is running when the signal comes.
      ASSERT_TRUE(wait_for([&] { return monitor.beats_received(0) >= 1; }));
      worker.signal(signal_number);
      const Clock::time_point signalled = Clock::now();
      ASSERT_TRUE(wait_for([&] { return monitor.lost(0); }));
      from_signal.push_back(std::chrono::duration<double>(Clock::now() - signalled).count());
      ASSERT_TRUE(shared->abandoned());
    }  // SIGKILL and reaped here (a stopped one too)
    std::vector<double> from_beat = stats.snapshot().detection_seconds;
    from_beat.erase(from_beat.begin(), from_beat.begin() + static_cast<ptrdiff_t>(before));
    ASSERT_EQ(from_beat.size(), static_cast<size_t>(kRounds));
    std::printf(
        "%s x %d (lease %d x %lld ms): from the signal p50 %.1f ms p99 %.1f ms; from the "
        "last beat p50 %.1f ms p99 %.1f ms\n",
        signal_number == SIGKILL ? "SIGKILL" : "SIGSTOP", kRounds, kLeaseMisses,
        static_cast<long long>(kLeaseInterval.count()), percentile(from_signal, 0.5) * 1e3,
        percentile(from_signal, 0.99) * 1e3, percentile(from_beat, 0.5) * 1e3,
        percentile(from_beat, 0.99) * 1e3);
  }
}

}  // namespace
}  // namespace folio::dist
