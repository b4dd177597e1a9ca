// The engine over a pipeline (engine::ModelEngineOptions::remote_runner): the engine keeps its
// scheduler, block tables and sampler and hands every step to a runner built from the
// RemoteStepSetup it describes, here two PipelineStages of a generated model chained in this
// process (what PipelineStepRunner does over gRPC, without the wire). Eight requests of mixed
// lengths, greedy and seeded sampling, graphs and eager: the token streams equal those of the
// engine running the model itself. Requests of n = 3 choices (forked sequences whose shared last
// block is copied on write: StepRunner::copy_blocks on every stage) give the same tokens too.
// Over a PipelineStepRunner on loopback worker services, a worker failing the first copy is
// recovered from and the choices' tokens stay the same. Adapters and swap space are refused with
// a remote runner.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine/engine_test_util.h"
#include "folio/dist/pipeline_stage.h"
#include "folio/dist/pipeline_step_runner.h"
#include "folio/dist/worker_service.h"
#include "folio/engine/model_engine.h"
#include "folio/model/llama_model_file.h"

namespace folio::dist {
namespace {

using engine::ModelEngine;
using engine::ModelEngineOptions;
using engine::RequestId;

// Layers [0, 1) and [1, 2) of `model` built from the engine's setup, run one after the other.
class ChainedStagesRunner final : public engine::StepRunner {
 public:
  static inline int64_t steps_run = 0;  // by every instance (the tests run one at a time)

  static Result<std::unique_ptr<engine::StepRunner>> create(const model::LlamaModel& model,
                                                            const engine::RemoteStepSetup& setup) {
    std::unique_ptr<ChainedStagesRunner> runner(new ChainedStagesRunner());
    for (const auto& [first, end] : {std::pair<int64_t, int64_t>{0, 1}, {1, 2}}) {
      const PipelineStageSpec spec =
          pipeline_stage_spec(setup, first, end, /*pool_bytes=*/int64_t{16} << 20);
      FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<PipelineStage> stage,
                             PipelineStage::create(model, spec, 2));
      runner->stages_.push_back(std::move(stage));
    }
    return std::unique_ptr<engine::StepRunner>(std::move(runner));
  }

  Result<ir::StepOutput> run(const ir::StepBatch& step) override {
    ++steps_run;
    FOLIO_ASSIGN_OR_RETURN(const ir::StepOutput first, stages_[0]->run(step, {}));
    hidden_.assign(first.hidden.begin(), first.hidden.end());  // as a wire would
    return stages_[1]->run(step, hidden_);
  }
  Status copy_blocks(std::span<const kv::BlockCopy> copies) override {
    block_copies += static_cast<int64_t>(copies.size());
    for (const std::unique_ptr<PipelineStage>& stage : stages_) {
      FOLIO_RETURN_IF_ERROR(stage->copy_blocks(copies));
    }
    return Status();
  }
  static inline int64_t block_copies = 0;  // by every instance
  int32_t vocab_size() const override { return stages_[1]->vocab_size(); }
  int32_t max_logit_rows() const override {
    const PipelineStageSpec& spec = stages_[1]->spec();
    return spec.max_logit_rows > 0 ? spec.max_logit_rows : spec.max_sequences;
  }

 private:
  ChainedStagesRunner() = default;
  std::vector<std::unique_ptr<PipelineStage>> stages_;
  std::vector<float> hidden_;
};

class PipelineEngineTest : public ::testing::TestWithParam<bool> {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string((std::filesystem::path(::testing::TempDir()) /
                             ("folio_pipeline_engine_model_" + std::to_string(getpid()) + ".gguf"))
                                .string());
    model::LlamaShape shape;  // two layers
    shape.context_length = 128;
    shape.weight_dtype = DType::kQ8_0;
    ASSERT_TRUE(model::write_random_llama_model(*path_, shape, 5).ok());
  }
  static void TearDownTestSuite() {
    std::filesystem::remove(*path_);
    delete path_;
  }

  static ModelEngineOptions options(bool use_graphs) {
    ModelEngineOptions options;
    options.num_threads = 2;
    options.memory_budget_bytes = 8 << 20;
    options.page_bytes = 16 << 10;
    options.block_size = 8;
    options.use_graphs = use_graphs;
    options.precapture_seconds = 0;
    options.scheduler.max_num_batched_tokens = 64;
    options.scheduler.max_num_sequences = 8;
    return options;
  }

  // Eight requests, all submitted before the first step, stepped to the end; with `remote`, the
  // steps run on chained stages built from the engine's RemoteStepSetup.
  // num_choices > 1: every request asks for that many choices; the result lists each request's
  // choices in order.
  // `runner`: set, the remote runner is made by it (over `remote` stages) instead of chained
  // stages.
  static std::vector<std::vector<int32_t>> run(bool use_graphs, bool remote,
                                               int32_t num_choices = 1,
                                               engine::RemoteRunnerFactory runner = {}) {
    Result<std::unique_ptr<model::LlamaModel>> model = model::LlamaModel::open(*path_);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return {};
    // The stages' own copy of the model (a worker opens its file).
    Result<std::unique_ptr<model::LlamaModel>> stage_model = model::LlamaModel::open(*path_);
    EXPECT_TRUE(stage_model.ok()) << stage_model.status();
    ModelEngineOptions engine_options = options(use_graphs);
    int64_t setup_blocks = 0;
    if (remote) {
      engine_options.remote_runner = [&](const engine::RemoteStepSetup& setup) {
        setup_blocks = setup.num_kv_blocks;
        return runner ? runner(setup) : ChainedStagesRunner::create(**stage_model, setup);
      };
    }
    Result<std::unique_ptr<ModelEngine>> bundle =
        ModelEngine::create(std::move(*model), engine_options);
    EXPECT_TRUE(bundle.ok()) << bundle.status();
    if (!bundle.ok()) return {};
    if (remote) {
      EXPECT_GT(setup_blocks, 0);
    }
    engine::Engine& engine = (*bundle)->engine();
    engine::testing::Recorder recorder;
    uint64_t state = 91;
    std::vector<RequestId> ids;
    for (int index = 0; index < 8; ++index) {
      engine::testing::RequestSpec spec;
      spec.prompt = engine::testing::random_prompt(state, 5 + 3 * index, 500);
      for (int32_t& token : spec.prompt) token += 3;
      spec.max_tokens = 6 + index;
      spec.ignore_eos = true;
      spec.sampling.temperature = index % 2 == 0 ? 0.0f : 0.8f;
      spec.sampling.seed = 40 + index;
      engine::Request request = engine::testing::to_request(spec);
      request.num_choices = num_choices;
      Result<RequestId> id = engine.submit(recorder.attach(request));
      EXPECT_TRUE(id.ok()) << id.status();
      if (id.ok()) ids.push_back(*id);
    }
    engine.run_until_idle();
    const std::vector<int32_t> choices(ids.size(), num_choices);
    recorder.expect_each_finished_once(ids, choices);
    std::vector<std::vector<int32_t>> outputs;
    for (RequestId id : ids) {
      for (int32_t choice = 0; choice < num_choices; ++choice) {
        outputs.push_back(recorder.stream(id, choice).tokens);
      }
    }
    bundle->reset();  // before the stages' model goes
    return outputs;
  }

  static inline std::string* path_ = nullptr;
};

TEST_P(PipelineEngineTest, TokensEqualTheEngineRunningTheModelItself) {
  const std::vector<std::vector<int32_t>> local = run(GetParam(), false);
  ChainedStagesRunner::steps_run = 0;
  const std::vector<std::vector<int32_t>> pipelined = run(GetParam(), true);
  EXPECT_GT(ChainedStagesRunner::steps_run, 8);  // every step went through the stages
  ASSERT_EQ(local.size(), 8u);
  for (size_t i = 0; i < local.size(); ++i) EXPECT_EQ(local[i].size(), 6 + i);
  EXPECT_EQ(pipelined, local);
}

TEST_P(PipelineEngineTest, ThreeChoicesCopyBlocksOnTheStagesAndEqualTheModelItself) {
  const std::vector<std::vector<int32_t>> local = run(GetParam(), false, 3);
  ChainedStagesRunner::block_copies = 0;
  const std::vector<std::vector<int32_t>> pipelined = run(GetParam(), true, 3);
  // Each request's choices 1 and 2 (and 0, unless it appends last) copy the shared last block
  // of the prompt, unless the prompt ends on a block boundary.
  EXPECT_GE(ChainedStagesRunner::block_copies, 8);
  ASSERT_EQ(local.size(), 24u);
  for (size_t i = 0; i < local.size(); ++i) EXPECT_EQ(local[i].size(), 6 + i / 3);
  // Seeded choices of one request differ (each choice draws with its own generator), so a copy
  // that went wrong would show in the tokens of some choice.
  EXPECT_NE(local[3], local[4]);
  EXPECT_EQ(pipelined, local);
}

INSTANTIATE_TEST_SUITE_P(GraphsAndEager, PipelineEngineTest, ::testing::Bool());

// Forwards to a PipelineStepRunner; at the first batch of copies, makes the second stage's
// worker fail its next call (which is that copy: copies go first with the next step).
class FailFirstCopyRunner final : public engine::StepRunner {
 public:
  FailFirstCopyRunner(std::unique_ptr<PipelineStepRunner> runner, WorkerService& second)
      : runner_(std::move(runner)), second_(second) {}
  Result<ir::StepOutput> run(const ir::StepBatch& step) override { return runner_->run(step); }
  Status copy_blocks(std::span<const kv::BlockCopy> copies) override {
    if (!injected_) second_.inject_unavailable(1);
    injected_ = true;
    return runner_->copy_blocks(copies);
  }
  int32_t vocab_size() const override { return runner_->vocab_size(); }
  int32_t max_logit_rows() const override { return runner_->max_logit_rows(); }
  Result<engine::RunnerRecovery> recover(const Status& failure) override {
    Result<engine::RunnerRecovery> recovery = runner_->recover(failure);
    if (recovery.ok()) ++recoveries;
    return recovery;
  }
  Status replay(const ir::StepBatch& step, int32_t through_stage) override {
    return runner_->replay(step, through_stage);
  }
  bool available() const override { return runner_->available(); }
  static inline int64_t recoveries = 0;

 private:
  std::unique_ptr<PipelineStepRunner> runner_;
  WorkerService& second_;
  bool injected_ = false;
};

TEST_F(PipelineEngineTest, ThreeChoicesOverWorkersRecoverFromAFailedCopy) {
  const std::vector<std::vector<int32_t>> local = run(false, false, 3);
  std::vector<std::unique_ptr<WorkerService>> services;
  for (int index = 0; index < 2; ++index) {
    WorkerServiceOptions service_options;
    service_options.threads = 2;
    service_options.model = ModelIdentity{.hash = "", .name = "model.gguf"};
    service_options.model_path = *path_;
    Result<std::unique_ptr<WorkerService>> service = WorkerService::start(service_options);
    ASSERT_TRUE(service.ok()) << service.status();
    services.push_back(std::move(service).value());
  }
  FailFirstCopyRunner::recoveries = 0;
  const engine::RemoteRunnerFactory factory =
      [&](const engine::RemoteStepSetup& setup) -> Result<std::unique_ptr<engine::StepRunner>> {
    std::vector<std::unique_ptr<WorkerClient>> clients;
    std::vector<PipelineStageSpec> specs;
    for (int64_t stage = 0; stage < 2; ++stage) {
      FOLIO_ASSIGN_OR_RETURN(
          std::unique_ptr<WorkerClient> client,
          WorkerClient::connect(services[static_cast<size_t>(stage)]->address(), ModelIdentity{}));
      clients.push_back(std::move(client));
      specs.push_back(pipeline_stage_spec(setup, stage, stage + 1, int64_t{16} << 20));
    }
    PipelineRecoveryOptions recovery;
    recovery.lease_interval = std::chrono::milliseconds(100);
    recovery.lease_misses = 20;
    FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<PipelineStepRunner> runner,
                           PipelineStepRunner::create(std::move(clients), specs, "", recovery));
    return std::unique_ptr<engine::StepRunner>(
        std::make_unique<FailFirstCopyRunner>(std::move(runner), *services[1]));
  };
  const std::vector<std::vector<int32_t>> pipelined = run(false, true, 3, factory);
  EXPECT_EQ(FailFirstCopyRunner::recoveries, 1);
  EXPECT_EQ(pipelined, local);
}

TEST_F(PipelineEngineTest, AdaptersAndSwapAreRefusedWithARemoteRunner) {
  for (const bool adapters : {true, false}) {
    Result<std::unique_ptr<model::LlamaModel>> model = model::LlamaModel::open(*path_);
    ASSERT_TRUE(model.ok()) << model.status();
    ModelEngineOptions engine_options = options(false);
    engine_options.adapters = adapters;
    engine_options.swap_bytes = adapters ? 0 : int64_t{1} << 20;
    engine_options.remote_runner =
        [](const engine::RemoteStepSetup&) -> Result<std::unique_ptr<engine::StepRunner>> {
      return internal_error("not reached: the engine refuses before asking for a runner");
    };
    const Status status = ModelEngine::create(std::move(*model), engine_options).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("not relayed to pipeline workers"), std::string_view::npos)
        << status;
  }
}

}  // namespace
}  // namespace folio::dist
