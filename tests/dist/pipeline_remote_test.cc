// Pipeline stages over the control plane, in one process: WorkerServices on loopback ports hold
// a generated model file; a PipelineStepRunner prepares a stage on each and relays every step
// through them. Logits must be bit-equal to the model run whole in this process, and every
// error before serving (no model, another model, a stage too large for the worker's memory,
// stages that do not chain) must name the worker.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "folio/base/random.h"
#include "folio/dist/pipeline_step_runner.h"
#include "folio/dist/worker_client.h"
#include "folio/dist/worker_service.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/model/llama_model.h"
#include "testing/collective_groups.h"
#include "testing/pipeline_steps.h"

#include "pipeline_test_model.h"

namespace folio::dist {
namespace {

using ::testing::HasSubstr;
using Script = folio::testing::PipelineStepScript;

using testing::connect_to;
using testing::kNumLayers;
using testing::ModelOnDisk;
using testing::stage_spec;
using testing::start_worker;

struct RemoteCase {
  const char* name;
  DType dtype;
  std::vector<int64_t> cuts;
  bool use_graphs;
};

// gtest prints the case by its name (its bytes otherwise).
void PrintTo(const RemoteCase& test, std::ostream* out) {
  *out << test.name;
}

class PipelineRemoteTest : public ::testing::TestWithParam<RemoteCase> {};

TEST_P(PipelineRemoteTest, LogitsAreBitEqualToOneProcess) {
  const RemoteCase& test = GetParam();
  const ModelOnDisk model(test.dtype);
  std::vector<int64_t> bounds = {0};
  bounds.insert(bounds.end(), test.cuts.begin(), test.cuts.end());
  bounds.push_back(kNumLayers);
  std::vector<std::unique_ptr<WorkerService>> services;
  std::vector<std::unique_ptr<WorkerClient>> clients;
  std::vector<PipelineStageSpec> specs;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    services.push_back(start_worker(model));
    clients.push_back(connect_to(*services.back()));
    specs.push_back(stage_spec(bounds[s], bounds[s + 1], test.use_graphs));
  }
  Result<std::unique_ptr<PipelineStepRunner>> runner =
      PipelineStepRunner::create(std::move(clients), specs, model.identity.hash);
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ((*runner)->vocab_size(), 512);
  EXPECT_EQ((*runner)->stages().front().hidden_input_size, 0);
  EXPECT_EQ((*runner)->stages().front().hidden_output_size, 64);

  // The reference: the whole model in this process, one stage of every layer.
  Result<std::unique_ptr<model::LlamaModel>> local = model::LlamaModel::open(model.path);
  ASSERT_TRUE(local.ok()) << local.status();
  Result<std::unique_ptr<PipelineStage>> whole =
      PipelineStage::create(**local, stage_spec(0, kNumLayers, test.use_graphs), 2);
  ASSERT_TRUE(whole.ok()) << whole.status();

  folio::testing::PipelineStepMaker maker(512);
  int32_t rows = 0;
  for (size_t index = 0; index < Script::steps().size(); ++index) {
    const folio::testing::PipelineStepArrays arrays = maker.make(index);
    const ir::StepBatch step = arrays.batch();
    Result<ir::StepOutput> expected = (*whole)->run(step, {});
    ASSERT_TRUE(expected.ok()) << expected.status();
    Result<ir::StepOutput> actual = (*runner)->run(step);
    ASSERT_TRUE(actual.ok()) << actual.status();
    ASSERT_EQ(actual->num_rows, expected->num_rows);
    ASSERT_EQ(actual->logits.size(), expected->logits.size());
    EXPECT_EQ(
        std::memcmp(actual->logits.data(), expected->logits.data(), expected->logits.size_bytes()),
        0)
        << "step " << index;
    rows += actual->num_rows;
  }
  EXPECT_EQ(rows, Script::kTotalLogitRows);
  const PipelineTraffic& traffic = (*runner)->traffic();
  EXPECT_EQ(traffic.steps, static_cast<int64_t>(Script::steps().size()));
  // Each cut carries the f32 residual stream of every token, both ways of the wire.
  const int64_t cuts = static_cast<int64_t>(bounds.size()) - 2;
  EXPECT_GE(traffic.request_bytes + traffic.reply_bytes, 2 * cuts * traffic.tokens * 64 * 4);
}

INSTANTIATE_TEST_SUITE_P(Workers, PipelineRemoteTest,
                         ::testing::Values(RemoteCase{"f32_pp2_graph", DType::kF32, {2}, true},
                                           RemoteCase{"q8_0_pp2_eager", DType::kQ8_0, {2}, false},
                                           RemoteCase{"f16_pp3_graph", DType::kF16, {1, 3}, true}),
                         [](const ::testing::TestParamInfo<RemoteCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(PipelineRemoteErrorsTest, WorkerWithoutModelIsRefusedBeforeServing) {
  const ModelOnDisk model(DType::kF32);
  std::unique_ptr<WorkerService> first = start_worker(model);
  std::unique_ptr<WorkerService> bare = start_worker(model, 0, /*with_model=*/false);
  std::vector<std::unique_ptr<WorkerClient>> clients;
  clients.push_back(connect_to(*first));
  clients.push_back(connect_to(*bare));
  Result<std::unique_ptr<PipelineStepRunner>> runner = PipelineStepRunner::create(
      std::move(clients), {stage_spec(0, 2, true), stage_spec(2, 4, true)}, model.identity.hash);
  ASSERT_EQ(runner.status().code(), StatusCode::kFailedPrecondition) << runner.status();
  EXPECT_THAT(std::string(runner.status().message()), HasSubstr(bare->address()));
  EXPECT_THAT(std::string(runner.status().message()), HasSubstr("holds no model"));
}

TEST(PipelineRemoteErrorsTest, AnotherModelIsRefused) {
  const ModelOnDisk model(DType::kF32);
  const ModelOnDisk other(DType::kF32, 42);
  std::unique_ptr<WorkerService> worker = start_worker(other);
  std::vector<std::unique_ptr<WorkerClient>> clients;
  clients.push_back(connect_to(*worker));
  Result<std::unique_ptr<PipelineStepRunner>> runner = PipelineStepRunner::create(
      std::move(clients), {stage_spec(0, kNumLayers, true)}, model.identity.hash);
  ASSERT_EQ(runner.status().code(), StatusCode::kFailedPrecondition) << runner.status();
  EXPECT_THAT(std::string(runner.status().message()), HasSubstr(other.identity.hash));
  EXPECT_THAT(std::string(runner.status().message()), HasSubstr(model.identity.hash));
}

TEST(PipelineRemoteErrorsTest, StageLargerThanTheWorkersMemoryIsRefused) {
  const ModelOnDisk model(DType::kF32);
  std::unique_ptr<WorkerService> worker = start_worker(model, uint64_t{8} << 20);
  std::vector<std::unique_ptr<WorkerClient>> clients;
  clients.push_back(connect_to(*worker));
  Result<std::unique_ptr<PipelineStepRunner>> runner = PipelineStepRunner::create(
      std::move(clients), {stage_spec(0, kNumLayers, true)}, model.identity.hash);
  ASSERT_EQ(runner.status().code(), StatusCode::kResourceExhausted) << runner.status();
  EXPECT_THAT(std::string(runner.status().message()), HasSubstr(worker->address()));
  EXPECT_THAT(std::string(runner.status().message()), HasSubstr("memory budget"));
}

TEST(PipelineRemoteErrorsTest, StagesThatDoNotCoverTheModelAreRefused) {
  const ModelOnDisk model(DType::kF32);
  std::unique_ptr<WorkerService> worker = start_worker(model);
  std::vector<std::unique_ptr<WorkerClient>> clients;
  clients.push_back(connect_to(*worker));
  // One stage that stops before the last layer returns no logits.
  Result<std::unique_ptr<PipelineStepRunner>> runner =
      PipelineStepRunner::create(std::move(clients), {stage_spec(0, 2, true)}, model.identity.hash);
  ASSERT_EQ(runner.status().code(), StatusCode::kFailedPrecondition) << runner.status();
  EXPECT_THAT(std::string(runner.status().message()), HasSubstr("does not chain"));
}

TEST(PipelineRemoteErrorsTest, StepForAStageTheWorkerNoLongerHoldsIsRefused) {
  const ModelOnDisk model(DType::kF32);
  std::unique_ptr<WorkerService> worker = start_worker(model);
  std::unique_ptr<WorkerClient> client = connect_to(*worker);
  Result<PreparedStage> old_stage =
      client->prepare_stage(stage_spec(0, kNumLayers, false), model.identity.hash);
  ASSERT_TRUE(old_stage.ok()) << old_stage.status();
  Result<PreparedStage> new_stage =
      client->prepare_stage(stage_spec(0, kNumLayers, false), model.identity.hash);
  ASSERT_TRUE(new_stage.ok()) << new_stage.status();
  folio::testing::PipelineStepMaker maker(512);
  const folio::testing::PipelineStepArrays arrays = maker.make(0);
  StageStepResult result;
  Status status = client->run_stage(old_stage->stage_id, arrays.batch(), {}, result);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("prepare it again"));
  EXPECT_TRUE(client->run_stage(new_stage->stage_id, arrays.batch(), {}, result).ok());
  EXPECT_EQ(result.num_rows, 2);
  EXPECT_EQ(result.logits.size(), size_t{2 * 512});
}

}  // namespace
}  // namespace folio::dist
