// The control plane's recovery calls (protocol revision 3) against a WorkerService on loopback:
// epochs fence stage calls (the refusals and their messages), Fence carries a stage into a new
// epoch, Watch streams beats until the service stops, Shutdown is answered and reaches the
// process's hook, and an abandoned client fails its calls at once.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "pipeline_test_model.h"

namespace folio::dist {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using testing::ModelOnDisk;

// Polls `watch` until `count` beats came or the stream ended; bounded by 30 s.
Status collect_beats(WorkerWatch& watch, size_t count, std::vector<WorkerBeat>& beats) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (beats.size() < count && std::chrono::steady_clock::now() < deadline) {
    FOLIO_RETURN_IF_ERROR(watch.poll(beats));
    std::this_thread::sleep_for(1ms);  // polling period, not synchronization
  }
  return Status();
}

class WorkerFencingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_ = testing::start_worker(model_);
    client_ = testing::connect_to(*service_);
  }

  Status run_step(uint64_t stage_id, uint64_t epoch) {
    return client_->run_stage(stage_id, steps_[0].batch(), {}, result_, epoch);
  }

  ModelOnDisk model_{DType::kF32};
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<WorkerClient> client_;
  std::vector<folio::testing::PipelineStepArrays> steps_ = testing::script_steps();
  StageStepResult result_;
};

TEST_F(WorkerFencingTest, StepsOfAnotherEpochAreRefusedWithBothEpochs) {
  EXPECT_EQ(service_->epoch(), 0u);
  Result<PreparedStage> stage = client_->prepare_stage(
      testing::stage_spec(0, testing::kNumLayers, false), model_.identity.hash, 2);
  ASSERT_TRUE(stage.ok()) << stage.status();
  EXPECT_EQ(stage->epoch, 2u);
  EXPECT_EQ(stage->incarnation, service_->incarnation());
  EXPECT_EQ(service_->epoch(), 2u);

  Status older = run_step(stage->stage_id, 1);
  EXPECT_EQ(older.code(), StatusCode::kFailedPrecondition) << older;
  EXPECT_THAT(std::string(older.message()), HasSubstr("stale epoch 1, this worker is at epoch 2"));
  EXPECT_THAT(std::string(older.message()), HasSubstr(service_->address()));
  Status newer = run_step(stage->stage_id, 3);
  EXPECT_EQ(newer.code(), StatusCode::kFailedPrecondition) << newer;
  EXPECT_THAT(std::string(newer.message()), HasSubstr("epoch 3 is newer than this worker's"));

  ASSERT_TRUE(run_step(stage->stage_id, 2).ok());
  EXPECT_EQ(result_.epoch, 2u);
  EXPECT_EQ(result_.incarnation, service_->incarnation());
  EXPECT_EQ(result_.num_rows, 2);

  // PrepareStage and Fence of an older epoch are refused too.
  Result<PreparedStage> stale_prepare = client_->prepare_stage(
      testing::stage_spec(0, testing::kNumLayers, false), model_.identity.hash, 1);
  EXPECT_EQ(stale_prepare.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(stale_prepare.status().message()),
              HasSubstr("stale epoch 1, this worker is at epoch 2"));
  Result<uint64_t> stale_fence = client_->fence(1, stage->stage_id);
  EXPECT_EQ(stale_fence.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(stale_fence.status().message()),
              HasSubstr("stale epoch 1, this worker is at epoch 2"));
  EXPECT_EQ(service_->epoch(), 2u);
}

TEST_F(WorkerFencingTest, FenceCarriesTheStageIntoTheNewEpochOrLeavesItBehind) {
  Result<PreparedStage> stage = client_->prepare_stage(
      testing::stage_spec(0, testing::kNumLayers, false), model_.identity.hash, 1);
  ASSERT_TRUE(stage.ok()) << stage.status();
  ASSERT_TRUE(run_step(stage->stage_id, 1).ok());
  const std::vector<float> before = result_.logits;

  Result<uint64_t> fenced = client_->fence(4, stage->stage_id);
  ASSERT_TRUE(fenced.ok()) << fenced.status();
  EXPECT_EQ(*fenced, service_->incarnation());
  EXPECT_EQ(service_->epoch(), 4u);
  // The stage, its KV cache included, runs on in epoch 4: the same step again writes the same
  // KV and gives the same logits.
  ASSERT_TRUE(run_step(stage->stage_id, 4).ok());
  EXPECT_EQ(result_.logits, before);
  EXPECT_EQ(run_step(stage->stage_id, 1).code(), StatusCode::kFailedPrecondition);

  // A fence for a stage the worker does not hold is refused and leaves the epoch alone.
  Result<uint64_t> wrong = client_->fence(5, stage->stage_id + 1);
  EXPECT_EQ(wrong.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(wrong.status().message()), HasSubstr("prepare it again"));
  EXPECT_EQ(service_->epoch(), 4u);

  // A fence that keeps no stage leaves the stage in its old epoch: refused until prepared again.
  ASSERT_TRUE(client_->fence(6, 0).ok());
  Status left_behind = run_step(stage->stage_id, 6);
  EXPECT_EQ(left_behind.code(), StatusCode::kFailedPrecondition) << left_behind;
  EXPECT_THAT(std::string(left_behind.message()),
              HasSubstr("was prepared in epoch 4, this worker is at epoch 6"));
}

TEST(WorkerLeaseTest, WatchStreamsBeatsUntilTheServiceStops) {
  const ModelOnDisk model(DType::kF32);
  std::unique_ptr<WorkerService> service = testing::start_worker(model);
  std::unique_ptr<WorkerClient> client = testing::connect_to(*service);
  Result<std::unique_ptr<WorkerWatch>> watch = client->watch(kFirstEpoch, 10ms);
  ASSERT_TRUE(watch.ok()) << watch.status();
  std::vector<WorkerBeat> beats;
  ASSERT_TRUE(collect_beats(**watch, 3, beats).ok());
  ASSERT_GE(beats.size(), 3u);
  for (size_t i = 0; i < beats.size(); ++i) {
    EXPECT_EQ(beats[i].sequence, i + 1);
    EXPECT_EQ(beats[i].incarnation, service->incarnation());
    EXPECT_EQ(beats[i].epoch, 0u);  // nothing prepared or fenced yet
  }
  // Beats carry the epoch the worker is at.
  ASSERT_TRUE(client->fence(7, 0).ok());
  beats.clear();
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while ((beats.empty() || beats.back().epoch != 7) &&
         std::chrono::steady_clock::now() < deadline) {
    ASSERT_TRUE((*watch)->poll(beats).ok());
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_FALSE(beats.empty());
  EXPECT_EQ(beats.back().epoch, 7u);

  service->shutdown(0ms);
  Status ended;
  const auto end_deadline = std::chrono::steady_clock::now() + 30s;
  while (ended.ok() && std::chrono::steady_clock::now() < end_deadline) {
    ended = (*watch)->poll(beats);
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_FALSE(ended.ok());
  EXPECT_THAT(std::string(ended.message()), HasSubstr(service->address()));
}

TEST(WorkerLeaseTest, ShutdownIsAnsweredAndCallsTheProcessHook) {
  std::atomic<int> hook_calls{0};
  WorkerServiceOptions options;
  options.on_shutdown_request = [&] { hook_calls.fetch_add(1); };
  Result<std::unique_ptr<WorkerService>> service = WorkerService::start(options);
  ASSERT_TRUE(service.ok()) << service.status();
  std::unique_ptr<WorkerClient> client = testing::connect_to(**service);
  EXPECT_FALSE((*service)->shutdown_requested());
  ASSERT_TRUE(client->shutdown(3, "superseded (test)").ok());
  EXPECT_TRUE((*service)->shutdown_requested());
  EXPECT_EQ(hook_calls.load(), 1);
  // Once: a second request is answered but the process is already on its way out.
  ASSERT_TRUE(client->shutdown(3, "again").ok());
  EXPECT_EQ(hook_calls.load(), 1);
}

TEST(WorkerLeaseTest, AnAbandonedClientFailsItsCallsAtOnceButCanStillSayShutdown) {
  WorkerServiceOptions options;
  Result<std::unique_ptr<WorkerService>> service = WorkerService::start(options);
  ASSERT_TRUE(service.ok()) << service.status();
  std::unique_ptr<WorkerClient> client = testing::connect_to(**service);
  ASSERT_TRUE(client->ping().ok());
  client->abandon("declared lost by the test");
  EXPECT_TRUE(client->abandoned());
  Result<std::chrono::nanoseconds> ping = client->ping();
  EXPECT_EQ(ping.status().code(), StatusCode::kCancelled);
  EXPECT_THAT(std::string(ping.status().message()), HasSubstr("declared lost by the test"));
  EXPECT_EQ(client->fence(2, 0).status().code(), StatusCode::kCancelled);
  EXPECT_EQ((*service)->epoch(), 0u);
  EXPECT_TRUE(client->shutdown(2, "superseded").ok());
  EXPECT_TRUE((*service)->shutdown_requested());
}

}  // namespace
}  // namespace folio::dist
