// Copy-on-write KV block copies over the control plane (worker.proto CopyBlocks, protocol
// revision 4): WorkerServices on loopback hold a generated model file, a PipelineStepRunner
// sends each batch of copies to every stage. A forked sequence that reads a copied block must
// give logits bit-equal to one process doing the same copies, and equal to its parent reading
// the original block; a bad batch is refused without needing recovery; a worker failing a copy
// (copies are queued and sent with the next step) fails that step, is recovered from, and the
// copy is sent again.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <tuple>
#include <vector>

#include "folio/dist/pipeline_step_runner.h"
#include "pipeline_test_model.h"

namespace folio::dist {
namespace {

using ::testing::HasSubstr;
using testing::kNumLayers;
using testing::kVocab;
using testing::ModelOnDisk;
using Script = folio::testing::PipelineStepScript;

// Sequence 0 owns blocks 0 and 1, sequence 1 blocks 2 and 3 (testing/pipeline_steps.h).
// `cached` tokens of each sequence precede the step; each segment appends `count` tokens.
folio::testing::PipelineStepArrays step_of(
    const std::vector<std::tuple<int32_t, int32_t, int32_t>>& segments, int32_t first_token) {
  folio::testing::PipelineStepArrays arrays;
  for (const auto& [sequence, cached, count] : segments) {
    arrays.add_segment(sequence, cached, count, first_token, kVocab);
  }
  return arrays;
}

struct Pipeline {
  std::vector<std::unique_ptr<WorkerService>> services;
  std::unique_ptr<PipelineStepRunner> runner;
};

Pipeline start_pipeline(const ModelOnDisk& model, const std::vector<int64_t>& bounds) {
  Pipeline pipeline;
  std::vector<std::unique_ptr<WorkerClient>> clients;
  std::vector<PipelineStageSpec> specs;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    pipeline.services.push_back(testing::start_worker(model));
    clients.push_back(testing::connect_to(*pipeline.services.back()));
    specs.push_back(testing::stage_spec(bounds[s], bounds[s + 1], /*use_graphs=*/true));
  }
  Result<std::unique_ptr<PipelineStepRunner>> runner =
      PipelineStepRunner::create(std::move(clients), specs, model.identity.hash);
  FOLIO_CHECK(runner.ok(), "{}", runner.status().to_string());
  pipeline.runner = std::move(runner).value();
  return pipeline;
}

void expect_bit_equal(const ir::StepOutput& actual, const ir::StepOutput& expected,
                      const char* what) {
  ASSERT_EQ(actual.num_rows, expected.num_rows) << what;
  ASSERT_EQ(actual.logits.size(), expected.logits.size()) << what;
  EXPECT_EQ(std::memcmp(actual.logits.data(), expected.logits.data(), expected.logits.size_bytes()),
            0)
      << what;
}

class PipelineCopyTest : public ::testing::TestWithParam<std::vector<int64_t>> {};

TEST_P(PipelineCopyTest, ForkedSequenceReadsTheCopyLikeOneProcess) {
  const ModelOnDisk model(DType::kF32);
  Pipeline pipeline = start_pipeline(model, GetParam());
  Result<std::unique_ptr<model::LlamaModel>> local = model::LlamaModel::open(model.path);
  ASSERT_TRUE(local.ok()) << local.status();
  Result<std::unique_ptr<PipelineStage>> whole =
      PipelineStage::create(**local, testing::stage_spec(0, kNumLayers, true), 2);
  ASSERT_TRUE(whole.ok()) << whole.status();

  // Sequence 0 prefills 7 tokens into block 0; sequence 1 forks from it: block 0 copied to
  // block 2, its own last block. Then both decode the same token at position 7, and sequence 1
  // alone goes on over its copy.
  const std::vector<folio::testing::PipelineStepArrays> steps = {
      step_of({{0, 0, 7}}, 3), step_of({{0, 7, 1}, {1, 7, 1}}, 29), step_of({{1, 8, 3}}, 101)};
  const std::vector<kv::BlockCopy> fork = {{0, 2}};
  for (size_t index = 0; index < steps.size(); ++index) {
    if (index == 1) {
      ASSERT_TRUE(pipeline.runner->copy_blocks(fork).ok());
      ASSERT_TRUE((*whole)->copy_blocks(fork).ok());
    }
    const ir::StepBatch step = steps[index].batch();
    Result<ir::StepOutput> expected = (*whole)->run(step, {});
    ASSERT_TRUE(expected.ok()) << expected.status();
    const std::vector<float> expected_logits(expected->logits.begin(), expected->logits.end());
    Result<ir::StepOutput> actual = pipeline.runner->run(step);
    ASSERT_TRUE(actual.ok()) << actual.status();
    expect_bit_equal(*actual, *expected, "pipeline against one process");
    if (index == 1) {
      // The fork reads the copy as its parent reads the original: the same row.
      ASSERT_EQ(actual->num_rows, 2);
      EXPECT_EQ(std::memcmp(actual->logits.data(), actual->logits.data() + kVocab,
                            kVocab * sizeof(float)),
                0);
    }
  }
  EXPECT_EQ(pipeline.runner->traffic().block_copies, 1);
}

TEST_P(PipelineCopyTest, WithoutTheCopyTheForkReadsOtherLogits) {
  // The test above could pass if copies were ignored and block 2 happened to hold the prefix:
  // without the copy, the fork's row differs from its parent's.
  const ModelOnDisk model(DType::kF32);
  Pipeline pipeline = start_pipeline(model, GetParam());
  ASSERT_TRUE(pipeline.runner->run(step_of({{0, 0, 7}}, 3).batch()).ok());
  const folio::testing::PipelineStepArrays both = step_of({{0, 7, 1}, {1, 7, 1}}, 29);
  Result<ir::StepOutput> output = pipeline.runner->run(both.batch());
  ASSERT_TRUE(output.ok()) << output.status();
  EXPECT_NE(
      std::memcmp(output->logits.data(), output->logits.data() + kVocab, kVocab * sizeof(float)),
      0);
}

INSTANTIATE_TEST_SUITE_P(Stages, PipelineCopyTest,
                         ::testing::Values(std::vector<int64_t>{0, 2, 4},
                                           std::vector<int64_t>{0, 1, 3, 4}));

TEST(PipelineCopyErrorsTest, BadBatchIsRefusedWithoutRecovery) {
  const ModelOnDisk model(DType::kF32);
  Pipeline pipeline = start_pipeline(model, {0, 2, 4});
  const std::vector<kv::BlockCopy> outside = {{0, static_cast<int32_t>(Script::kNumBlocks)}};
  Status status = pipeline.runner->copy_blocks(outside);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("outside"));
  const std::vector<kv::BlockCopy> chained = {{0, 1}, {1, 2}};
  status = pipeline.runner->copy_blocks(chained);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("both a source and a destination"));
  // Nothing queued, still serving: no recovery needed.
  EXPECT_TRUE(pipeline.runner->run(step_of({{0, 0, 7}}, 3).batch()).ok());
  EXPECT_EQ(pipeline.runner->traffic().block_copies, 0);
}

TEST(PipelineCopyErrorsTest, CopyFailedByAWorkerIsRecoveredAndSentAgain) {
  const ModelOnDisk model(DType::kF32);
  Pipeline pipeline = start_pipeline(model, {0, 2, 4});
  Result<std::unique_ptr<model::LlamaModel>> local = model::LlamaModel::open(model.path);
  ASSERT_TRUE(local.ok()) << local.status();
  Result<std::unique_ptr<PipelineStage>> whole =
      PipelineStage::create(**local, testing::stage_spec(0, kNumLayers, true), 2);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const folio::testing::PipelineStepArrays prefill = step_of({{0, 0, 7}}, 3);
  ASSERT_TRUE(pipeline.runner->run(prefill.batch()).ok());
  ASSERT_TRUE((*whole)->run(prefill.batch(), {}).ok());

  // The copies go with the next step; the second stage's copy fails (the first stage's
  // copied): the step fails as a lost worker's, and the runner refuses until recovered.
  const std::vector<kv::BlockCopy> fork = {{0, 2}};
  ASSERT_TRUE(pipeline.runner->copy_blocks(fork).ok());
  ASSERT_TRUE((*whole)->copy_blocks(fork).ok());
  const folio::testing::PipelineStepArrays both = step_of({{0, 7, 1}, {1, 7, 1}}, 29);
  pipeline.services[1]->inject_unavailable(1);
  Result<ir::StepOutput> failed = pipeline.runner->run(both.batch());
  ASSERT_EQ(failed.status().code(), StatusCode::kUnavailable) << failed.status();
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("pipeline stage 1"));
  EXPECT_EQ(pipeline.runner->traffic().block_copies, 0);
  EXPECT_EQ(pipeline.runner->run(both.batch()).status().code(), StatusCode::kUnavailable);
  // The worker is alive and the same incarnation: nothing lost; the step runs again, and the
  // queued copy goes first to both stages.
  Result<engine::RunnerRecovery> recovery = pipeline.runner->recover(failed.status());
  ASSERT_TRUE(recovery.ok()) << recovery.status();
  EXPECT_EQ(recovery->lost_kv, engine::RunnerRecovery::LostKv::kNone);

  Result<ir::StepOutput> expected = (*whole)->run(both.batch(), {});
  ASSERT_TRUE(expected.ok()) << expected.status();
  Result<ir::StepOutput> actual = pipeline.runner->run(both.batch());
  ASSERT_TRUE(actual.ok()) << actual.status();
  expect_bit_equal(*actual, *expected, "after the recovered copy");
  EXPECT_EQ(pipeline.runner->traffic().block_copies, 1);
}

TEST(PipelineCopyErrorsTest, QueuedCopyGoesBeforeTheReplayOfALostStage) {
  // Sequence 0 prefills block 0 and sequence 1 forks from it (copy 0 -> 2 queued); then
  // sequence 0 ends, so no running sequence holds block 0 and no replay rewrites it. Stage 1's
  // worker goes; its replacement's block 0 is blank. The replay rewrites sequence 1's 7 tokens
  // in block 2: the queued copy must reach the replacement before the replay (after it, it
  // would overwrite block 2 with the blank block 0).
  using namespace std::chrono_literals;
  const ModelOnDisk model(DType::kF32);
  std::vector<std::unique_ptr<WorkerService>> services;
  std::vector<std::unique_ptr<WorkerService>> spares;
  std::vector<std::unique_ptr<WorkerClient>> clients;
  std::vector<PipelineStageSpec> specs;
  for (const auto& [first, end] : {std::pair<int64_t, int64_t>{0, 2}, {2, 4}}) {
    services.push_back(testing::start_worker(model));
    clients.push_back(testing::connect_to(*services.back()));
    specs.push_back(testing::stage_spec(first, end, true));
  }
  PipelineRecoveryOptions recovery;
  recovery.lease_interval = 100ms;
  recovery.lease_misses = 20;
  recovery.replace_worker = [&](int32_t, const std::string&) {
    spares.push_back(testing::start_worker(model));
    return WorkerClient::connect(spares.back()->address(), model.identity);
  };
  Result<std::unique_ptr<PipelineStepRunner>> created =
      PipelineStepRunner::create(std::move(clients), specs, model.identity.hash, recovery);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<PipelineStepRunner> runner = std::move(created).value();
  Result<std::unique_ptr<model::LlamaModel>> local = model::LlamaModel::open(model.path);
  ASSERT_TRUE(local.ok()) << local.status();
  Result<std::unique_ptr<PipelineStage>> whole =
      PipelineStage::create(**local, testing::stage_spec(0, kNumLayers, true), 2);
  ASSERT_TRUE(whole.ok()) << whole.status();

  const folio::testing::PipelineStepArrays prefill = step_of({{0, 0, 7}}, 3);
  ASSERT_TRUE(runner->run(prefill.batch()).ok());
  ASSERT_TRUE((*whole)->run(prefill.batch(), {}).ok());
  const std::vector<kv::BlockCopy> fork = {{0, 2}};
  ASSERT_TRUE(runner->copy_blocks(fork).ok());
  ASSERT_TRUE((*whole)->copy_blocks(fork).ok());
  services[1]->shutdown(0ms);
  const folio::testing::PipelineStepArrays decode = step_of({{1, 7, 1}}, 29);
  Result<ir::StepOutput> failed = runner->run(decode.batch());
  ASSERT_EQ(failed.status().code(), StatusCode::kUnavailable) << failed.status();
  Result<engine::RunnerRecovery> recovered = runner->recover(failed.status());
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  ASSERT_EQ(recovered->lost_kv, engine::RunnerRecovery::LostKv::kStageKv);
  ASSERT_EQ(recovered->replay_through_stage, 1);
  // Sequence 1's computed tokens are sequence 0's prompt (it forked from it).
  ASSERT_TRUE(runner->replay(step_of({{1, 0, 7}}, 3).batch(), 1).ok());
  Result<ir::StepOutput> expected = (*whole)->run(decode.batch(), {});
  ASSERT_TRUE(expected.ok()) << expected.status();
  Result<ir::StepOutput> actual = runner->run(decode.batch());
  ASSERT_TRUE(actual.ok()) << actual.status();
  expect_bit_equal(*actual, *expected, "after the replay");
  runner.reset();  // before the services
}

TEST(PipelineCopyErrorsTest, StaleEpochCopyIsRefusedByTheWorker) {
  const ModelOnDisk model(DType::kF32);
  std::unique_ptr<WorkerService> worker = testing::start_worker(model);
  std::unique_ptr<WorkerClient> client = testing::connect_to(*worker);
  Result<PreparedStage> stage =
      client->prepare_stage(testing::stage_spec(0, kNumLayers, false), model.identity.hash, 2);
  ASSERT_TRUE(stage.ok()) << stage.status();
  const std::vector<kv::BlockCopy> fork = {{0, 2}};
  Result<std::pair<uint64_t, uint64_t>> stale = client->copy_blocks(stage->stage_id, fork, 1);
  EXPECT_EQ(stale.status().code(), StatusCode::kFailedPrecondition) << stale.status();
  EXPECT_THAT(std::string(stale.status().message()), HasSubstr("stale epoch 1"));
  Result<std::pair<uint64_t, uint64_t>> other = client->copy_blocks(stage->stage_id + 1, fork, 2);
  EXPECT_EQ(other.status().code(), StatusCode::kFailedPrecondition) << other.status();
  Result<std::pair<uint64_t, uint64_t>> copied = client->copy_blocks(stage->stage_id, fork, 2);
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(copied->first, 2u);
  EXPECT_EQ(copied->second, worker->incarnation());
}

}  // namespace
}  // namespace folio::dist
