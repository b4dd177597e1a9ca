// PipelineStepRunner's recovery (issue 16) over WorkerServices on loopback: the script's steps
// run through a pipeline; mid-way one stage's service is shut down (its worker is gone), run()
// fails with kUnavailable naming it, recover() prepares the stage on a fresh service in a new
// epoch and reports the KV of stages 0..k lost, the steps already run are replayed through
// stage k, and the failed step runs again: every logits row, before and after, is bit-equal to
// the whole model in one process (an uninterrupted run). Also: a transient failure of a worker
// that is fine (kNone, nothing replayed), no worker to take the lost one's place (an error,
// available() false, then a replacement that works), errors that are not a lost worker.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <ostream>
#include <thread>

#include "folio/dist/pipeline_step_runner.h"
#include "pipeline_test_model.h"

namespace folio::dist {
namespace {

using namespace std::chrono_literals;
using engine::RunnerRecovery;
using testing::expect_bit_equal;
using ::testing::HasSubstr;
using testing::ModelOnDisk;
using Script = folio::testing::PipelineStepScript;

// A pipeline of WorkerServices in this process, with spare services started on demand by its
// replacer (which fails while `refuse_replacements` is set).
class LoopbackPipeline {
 public:
  LoopbackPipeline(const ModelOnDisk& model, std::vector<int64_t> cuts,
                   metrics::Registry* registry = nullptr, PipelineReplanner replan = {})
      : model_(model) {
    std::vector<int64_t> bounds = {0};
    bounds.insert(bounds.end(), cuts.begin(), cuts.end());
    bounds.push_back(testing::kNumLayers);
    std::vector<std::unique_ptr<WorkerClient>> clients;
    std::vector<PipelineStageSpec> specs;
    for (size_t s = 0; s + 1 < bounds.size(); ++s) {
      services_.push_back(testing::start_worker(model));
      clients.push_back(testing::connect_to(*services_.back()));
      specs.push_back(testing::stage_spec(bounds[s], bounds[s + 1], true));
    }
    PipelineRecoveryOptions recovery;
    // Long enough that no survivor misses it on a loaded machine or under ThreadSanitizer (these
    // tests lose workers by shutting their services down, which ends the lease stream at once).
    recovery.lease_interval = 100ms;
    recovery.lease_misses = 20;
    recovery.registry = registry;
    recovery.replan_on_survivors = std::move(replan);
    recovery.replace_worker =
        [this](int32_t stage,
               const std::string& lost_address) -> Result<std::unique_ptr<WorkerClient>> {
      replaced_.emplace_back(stage, lost_address);
      if (refuse_replacements.load()) {
        return unavailable("no spare worker for stage {} (test)", stage);
      }
      spares_.push_back(testing::start_worker(model_));
      return WorkerClient::connect(spares_.back()->address(), model_.identity);
    };
    Result<std::unique_ptr<PipelineStepRunner>> runner =
        PipelineStepRunner::create(std::move(clients), specs, model.identity.hash, recovery);
    FOLIO_CHECK(runner.ok(), "{}", runner.status().to_string());
    runner_ = std::move(runner).value();
  }

  PipelineStepRunner& runner() { return *runner_; }
  WorkerService& service(size_t stage) { return *services_[stage]; }
  const std::vector<std::pair<int32_t, std::string>>& replaced() const { return replaced_; }
  std::atomic<bool> refuse_replacements{false};

 private:
  const ModelOnDisk& model_;
  std::vector<std::unique_ptr<WorkerService>> services_;
  std::vector<std::unique_ptr<WorkerService>> spares_;
  std::vector<std::pair<int32_t, std::string>> replaced_;
  // Last: destroyed first, so no lease or call outlives the services.
  std::unique_ptr<PipelineStepRunner> runner_;
};

struct LossCase {
  const char* name;
  std::vector<int64_t> cuts;
  int32_t victim;       // the stage whose worker goes
  size_t failing_step;  // the step that finds it gone
};

void PrintTo(const LossCase& test, std::ostream* out) {
  *out << test.name;
}

class PipelineRecoveryTest : public ::testing::TestWithParam<LossCase> {};

TEST_P(PipelineRecoveryTest, LostStageIsReplacedAndReplayedAndTheLogitsStayBitEqual) {
  const LossCase& test = GetParam();
  const ModelOnDisk model(DType::kF32);
  const std::vector<std::vector<float>> expected =
      testing::reference_logits(model, testing::stage_spec(0, testing::kNumLayers, true));
  const std::vector<folio::testing::PipelineStepArrays> steps = testing::script_steps();
  LoopbackPipeline pipeline(model, test.cuts);
  PipelineStepRunner& runner = pipeline.runner();
  const std::string lost_address = runner.worker_info(test.victim).address;

  for (size_t index = 0; index < test.failing_step; ++index) {
    expect_bit_equal(runner.run(steps[index].batch()), expected[index], index);
  }
  pipeline.service(static_cast<size_t>(test.victim)).shutdown(0ms);
  const Result<ir::StepOutput> failed = runner.run(steps[test.failing_step].batch());
  ASSERT_EQ(failed.status().code(), StatusCode::kUnavailable) << failed.status();
  EXPECT_THAT(std::string(failed.status().message()),
              HasSubstr(fmt::format("pipeline stage {}", test.victim)));
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr(lost_address));
  // Until recovered, the runner refuses steps (it does not run on a broken pipeline).
  EXPECT_EQ(runner.run(steps[test.failing_step].batch()).status().code(), StatusCode::kUnavailable);

  const Result<RunnerRecovery> recovery = runner.recover(failed.status());
  ASSERT_TRUE(recovery.ok()) << recovery.status();
  EXPECT_EQ(recovery->lost_kv, RunnerRecovery::LostKv::kStageKv);
  EXPECT_EQ(recovery->replay_through_stage, test.victim);
  EXPECT_TRUE(runner.available());
  EXPECT_EQ(runner.epoch(), kFirstEpoch + 1);
  ASSERT_EQ(pipeline.replaced().size(), 1u);
  EXPECT_EQ(pipeline.replaced()[0].first, test.victim);
  EXPECT_EQ(pipeline.replaced()[0].second, lost_address);
  EXPECT_NE(runner.worker_info(test.victim).address, lost_address);
  // The survivors were fenced into the new epoch, keeping their stages.
  for (size_t s = 0; s < test.cuts.size() + 1; ++s) {
    if (static_cast<int32_t>(s) != test.victim) {
      EXPECT_EQ(pipeline.service(s).epoch(), kFirstEpoch + 1) << "stage " << s;
    }
  }

  // The engine's part: rebuild the lost KV from the tokens of the steps that succeeded.
  for (size_t index = 0; index < test.failing_step; ++index) {
    ASSERT_TRUE(runner.replay(steps[index].batch(), recovery->replay_through_stage).ok());
  }
  for (size_t index = test.failing_step; index < steps.size(); ++index) {
    expect_bit_equal(runner.run(steps[index].batch()), expected[index], index);
  }
  const RecoveryCounters counters = runner.recovery_counters();
  EXPECT_EQ(counters.epoch, kFirstEpoch + 1);
  EXPECT_EQ(counters.recoveries, 1);
  EXPECT_EQ(counters.workers_lost, 1);
  EXPECT_EQ(counters.stale_replies, 0);
}

INSTANTIATE_TEST_SUITE_P(Stages, PipelineRecoveryTest,
                         ::testing::Values(LossCase{"pp2_last_stage", {2}, 1, 4},
                                           LossCase{"pp2_first_stage", {2}, 0, 2},
                                           LossCase{"pp3_middle_stage", {1, 3}, 1, 5},
                                           LossCase{"pp3_last_stage", {1, 3}, 2, 3}),
                         [](const ::testing::TestParamInfo<LossCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(PipelineRecoveryErrorsTest, TransientFailureOfAWorkerThatIsFineLosesNothing) {
  const ModelOnDisk model(DType::kF32);
  const std::vector<std::vector<float>> expected =
      testing::reference_logits(model, testing::stage_spec(0, testing::kNumLayers, true));
  const std::vector<folio::testing::PipelineStepArrays> steps = testing::script_steps();
  LoopbackPipeline pipeline(model, {2});
  PipelineStepRunner& runner = pipeline.runner();
  for (size_t index = 0; index < 3; ++index) {
    expect_bit_equal(runner.run(steps[index].batch()), expected[index], index);
  }
  pipeline.service(1).inject_unavailable(1);
  const Result<ir::StepOutput> failed = runner.run(steps[3].batch());
  ASSERT_EQ(failed.status().code(), StatusCode::kUnavailable) << failed.status();
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("pipeline stage 1"));
  const Result<RunnerRecovery> recovery = runner.recover(failed.status());
  ASSERT_TRUE(recovery.ok()) << recovery.status();
  EXPECT_EQ(recovery->lost_kv, RunnerRecovery::LostKv::kNone);
  EXPECT_TRUE(pipeline.replaced().empty());
  EXPECT_EQ(pipeline.service(0).epoch(), kFirstEpoch + 1);
  EXPECT_EQ(pipeline.service(1).epoch(), kFirstEpoch + 1);
  // Nothing replayed: the failed step runs again on the same workers.
  for (size_t index = 3; index < steps.size(); ++index) {
    expect_bit_equal(runner.run(steps[index].batch()), expected[index], index);
  }
  EXPECT_EQ(runner.recovery_counters().workers_lost, 0);
}

TEST(PipelineRecoveryErrorsTest, NoReplacementLeavesTheRunnerUnavailableUntilOneIsFound) {
  const ModelOnDisk model(DType::kF32);
  const std::vector<std::vector<float>> expected =
      testing::reference_logits(model, testing::stage_spec(0, testing::kNumLayers, true));
  const std::vector<folio::testing::PipelineStepArrays> steps = testing::script_steps();
  metrics::Registry registry;
  LoopbackPipeline pipeline(model, {2}, &registry);
  PipelineStepRunner& runner = pipeline.runner();
  for (size_t index = 0; index < 4; ++index) {
    expect_bit_equal(runner.run(steps[index].batch()), expected[index], index);
  }
  pipeline.service(0).shutdown(0ms);
  const Result<ir::StepOutput> failed = runner.run(steps[4].batch());
  ASSERT_EQ(failed.status().code(), StatusCode::kUnavailable) << failed.status();

  pipeline.refuse_replacements = true;
  const Result<RunnerRecovery> refused = runner.recover(failed.status());
  ASSERT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("no spare worker"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("pipeline stage 0"));
  EXPECT_FALSE(runner.available());
  EXPECT_EQ(runner.run(steps[4].batch()).status().code(), StatusCode::kUnavailable);

  pipeline.refuse_replacements = false;
  const Result<RunnerRecovery> recovery = runner.recover(failed.status());
  ASSERT_TRUE(recovery.ok()) << recovery.status();
  EXPECT_TRUE(runner.available());
  EXPECT_EQ(recovery->lost_kv, RunnerRecovery::LostKv::kStageKv);
  EXPECT_EQ(recovery->replay_through_stage, 0);
  EXPECT_EQ(runner.epoch(), kFirstEpoch + 2);
  for (size_t index = 0; index < 4; ++index) {
    ASSERT_TRUE(runner.replay(steps[index].batch(), 0).ok());
  }
  for (size_t index = 4; index < steps.size(); ++index) {
    expect_bit_equal(runner.run(steps[index].batch()), expected[index], index);
  }
  const RecoveryCounters counters = runner.recovery_counters();
  EXPECT_EQ(counters.workers_lost, 1);  // found once, replaced on the second try
  EXPECT_EQ(counters.recoveries, 1);
  const std::string text = registry.render();
  EXPECT_THAT(text, HasSubstr("folio_dist_epoch 3"));
  EXPECT_THAT(text, HasSubstr("folio_dist_workers_lost_total 1"));
  EXPECT_THAT(text, HasSubstr("folio_dist_stale_replies_total "));
  EXPECT_THAT(text, HasSubstr("folio_dist_detection_seconds_count"));
}

TEST(PipelineRecoveryErrorsTest, ErrorsThatAreNotALostWorkerAreNotRecovered) {
  const ModelOnDisk model(DType::kF32);
  LoopbackPipeline pipeline(model, {2});
  const Status invalid = invalid_argument("a malformed step (test)");
  const Result<RunnerRecovery> recovery = pipeline.runner().recover(invalid);
  EXPECT_EQ(recovery.status(), invalid);
  EXPECT_EQ(pipeline.runner().epoch(), kFirstEpoch);
  EXPECT_TRUE(pipeline.runner().available());
  const std::vector<folio::testing::PipelineStepArrays> steps = testing::script_steps();
  EXPECT_EQ(pipeline.runner().replay(steps[0].batch(), 2).code(), StatusCode::kInvalidArgument);
}

// The lease monitor's thread against run() on the engine's: a worker whose service goes away
// while steps run is declared lost by its lease (its stream ends), the flag reaches run() and
// the recovery replaces it. Under ThreadSanitizer this checks the flag's and the client's
// locking.
TEST(PipelineRecoveryErrorsTest, LeaseLostBetweenStepsIsSeenByTheNextStep) {
  const ModelOnDisk model(DType::kF32);
  const std::vector<std::vector<float>> expected =
      testing::reference_logits(model, testing::stage_spec(0, testing::kNumLayers, true));
  const std::vector<folio::testing::PipelineStepArrays> steps = testing::script_steps();
  LoopbackPipeline pipeline(model, {1, 3});
  PipelineStepRunner& runner = pipeline.runner();
  for (size_t index = 0; index < 2; ++index) {
    expect_bit_equal(runner.run(steps[index].batch()), expected[index], index);
  }
  pipeline.service(2).shutdown(0ms);
  // Bounded wait for the monitor's declaration (a look every few ms).
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (runner.recovery_counters().detection_seconds.empty() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(runner.recovery_counters().detection_seconds.size(), 1u);
  const Result<ir::StepOutput> failed = runner.run(steps[2].batch());
  ASSERT_EQ(failed.status().code(), StatusCode::kUnavailable) << failed.status();
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("lease"));
  const Result<RunnerRecovery> recovery = runner.recover(failed.status());
  ASSERT_TRUE(recovery.ok()) << recovery.status();
  EXPECT_EQ(recovery->replay_through_stage, 2);
  for (size_t index = 0; index < 2; ++index) {
    ASSERT_TRUE(runner.replay(steps[index].batch(), 2).ok());
  }
  for (size_t index = 2; index < steps.size(); ++index) {
    expect_bit_equal(runner.run(steps[index].batch()), expected[index], index);
  }
}

// No replacement, but a replanner: the layers are split again over the two survivors of a
// pipeline of three, every stage prepared anew (kAllKv), and after the engine's recompute (here:
// the earlier steps replayed through every stage) the logits are still bit-equal.
TEST(PipelineRecoveryErrorsTest, WithoutAReplacementTheLayersAreReplannedOverTheSurvivors) {
  const ModelOnDisk model(DType::kF32);
  const std::vector<std::vector<float>> expected =
      testing::reference_logits(model, testing::stage_spec(0, testing::kNumLayers, true));
  const std::vector<folio::testing::PipelineStepArrays> steps = testing::script_steps();
  std::vector<std::string> survivors_seen;
  LoopbackPipeline pipeline(
      model, {1, 3}, nullptr,
      [&](const std::vector<WorkerInfo>& survivors) -> Result<std::vector<PipelineStageSpec>> {
        for (const WorkerInfo& survivor : survivors) survivors_seen.push_back(survivor.address);
        return std::vector<PipelineStageSpec>{testing::stage_spec(0, 2, true),
                                              testing::stage_spec(2, 4, true)};
      });
  pipeline.refuse_replacements = true;
  PipelineStepRunner& runner = pipeline.runner();
  const std::string first = runner.worker_info(0).address;
  const std::string last = runner.worker_info(2).address;
  constexpr size_t kFailingStep = 4;
  for (size_t index = 0; index < kFailingStep; ++index) {
    expect_bit_equal(runner.run(steps[index].batch()), expected[index], index);
  }
  pipeline.service(1).shutdown(0ms);
  const Result<ir::StepOutput> failed = runner.run(steps[kFailingStep].batch());
  ASSERT_EQ(failed.status().code(), StatusCode::kUnavailable) << failed.status();
  const Result<RunnerRecovery> recovery = runner.recover(failed.status());
  ASSERT_TRUE(recovery.ok()) << recovery.status();
  EXPECT_EQ(recovery->lost_kv, RunnerRecovery::LostKv::kAllKv);
  EXPECT_TRUE(runner.available());
  EXPECT_EQ(survivors_seen, (std::vector<std::string>{first, last}));
  ASSERT_EQ(runner.stages().size(), 2u);
  EXPECT_EQ(runner.worker_info(0).address, first);
  EXPECT_EQ(runner.worker_info(1).address, last);
  // Every running sequence's tokens computed again, through the whole (new) pipeline.
  for (size_t index = 0; index < kFailingStep; ++index) {
    ASSERT_TRUE(runner.replay(steps[index].batch(), 1).ok());
  }
  for (size_t index = kFailingStep; index < steps.size(); ++index) {
    expect_bit_equal(runner.run(steps[index].batch()), expected[index], index);
  }
  EXPECT_EQ(runner.recovery_counters().workers_lost, 1);
}

}  // namespace
}  // namespace folio::dist
