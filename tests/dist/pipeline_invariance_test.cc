// The engine's batch-invariance suite (tests/engine/engine_invariance_suite.h) with every step
// on a pipeline: the model engine's steps go through a PipelineStepRunner to two WorkerServices
// on loopback, layer 0 on one and layer 1 on the other, over gRPC as `folio serve --workers`
// runs them. A request's tokens must not depend on what it was batched with, on chunked prefill,
// on preemption by recompute (its KV rebuilt on both stages), on memory pressure handling, or on
// graphs; each is compared with its run alone over the same pipeline (that the pipeline gives
// one process's tokens is dist_pipeline_engine_test's). Swap is refused with workers, so its
// cases are skipped.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_invariance_suite.h"
#include "folio/base/random.h"
#include "folio/dist/pipeline_stage.h"
#include "folio/dist/pipeline_step_runner.h"
#include "folio/dist/worker_client.h"
#include "folio/dist/worker_service.h"

namespace folio::engine::invariance {
namespace {

// Two worker services holding the suite's model file, started once per suite; each engine
// prepares its own stages on them (a PrepareStage replaces the stage a worker held).
struct PipelineSteps {
  static constexpr bool kSupportsSwap = false;
  static constexpr int64_t kStagePoolBytes = int64_t{16} << 20;

  static void set_up(const std::string& model_path) {
    std::ifstream file(model_path, std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)),
                                     std::istreambuf_iterator<char>());
    identity_ = new dist::ModelIdentity{.hash = fmt::format("fnv1a64:{:016x}", fnv1a64(bytes)),
                                        .name = "invariance.gguf"};
    services_ = new std::vector<std::unique_ptr<dist::WorkerService>>();
    for (int index = 0; index < 2; ++index) {
      dist::WorkerServiceOptions options;
      options.threads = 1;
      options.model = *identity_;
      options.model_path = model_path;
      Result<std::unique_ptr<dist::WorkerService>> service = dist::WorkerService::start(options);
      ASSERT_TRUE(service.ok()) << service.status();
      services_->push_back(std::move(service).value());
    }
  }
  static void tear_down() {
    delete services_;
    delete identity_;
  }

  static void apply(ModelEngineOptions& options) {
    options.remote_runner =
        [](const RemoteStepSetup& setup) -> Result<std::unique_ptr<StepRunner>> {
      std::vector<std::unique_ptr<dist::WorkerClient>> clients;
      std::vector<dist::PipelineStageSpec> specs;
      for (int64_t layer = 0; layer < 2; ++layer) {
        FOLIO_ASSIGN_OR_RETURN(
            std::unique_ptr<dist::WorkerClient> client,
            dist::WorkerClient::connect((*services_)[static_cast<size_t>(layer)]->address(),
                                        *identity_));
        clients.push_back(std::move(client));
        specs.push_back(dist::pipeline_stage_spec(setup, layer, layer + 1, kStagePoolBytes));
      }
      FOLIO_ASSIGN_OR_RETURN(
          std::unique_ptr<dist::PipelineStepRunner> runner,
          dist::PipelineStepRunner::create(std::move(clients), std::move(specs), identity_->hash));
      return std::unique_ptr<StepRunner>(std::move(runner));
    };
  }

  static inline dist::ModelIdentity* identity_ = nullptr;
  static inline std::vector<std::unique_ptr<dist::WorkerService>>* services_ = nullptr;
};

using PipelineModelRunner = ModelRunnerOf</*kAdapters=*/false, PipelineSteps>;

struct PipelineRunnerNames {
  template <typename Runner>
  static std::string GetName(int) {
    return "PipelineModel";
  }
};

INSTANTIATE_TYPED_TEST_SUITE_P(Pipeline, EngineInvarianceTest,
                               ::testing::Types<PipelineModelRunner>, PipelineRunnerNames);

}  // namespace
}  // namespace folio::engine::invariance
