// The per-op profile through the whole engine (ModelEngineOptions::profile): decode steps and
// steps with prefill are told apart, the engine's own rows (step building, sampling) are
// filled, every decode step runs the LM head once, the rows never exceed the steps' wall time,
// and profiling changes no token (greedy and seeded sampling, graphs and eager).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "folio/engine/model_engine.h"
#include "folio/model/llama_model_file.h"

namespace folio::engine {
namespace {

using testing::Recorder;

class EngineProfileTest : public ::testing::TestWithParam<bool> {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string((std::filesystem::path(::testing::TempDir()) /
                             ("folio_profile_model_" + std::to_string(getpid()) + ".gguf"))
                                .string());
    model::LlamaShape shape;
    shape.context_length = 128;
    shape.weight_dtype = DType::kQ8_0;
    ASSERT_TRUE(model::write_random_llama_model(*path_, shape, 3).ok());
  }
  static void TearDownTestSuite() {
    std::filesystem::remove(*path_);
    delete path_;
  }

  struct Run {
    std::vector<std::vector<int32_t>> outputs;
    std::optional<exec::OpProfile> profile;
  };

  // Eight requests, all submitted before the first step, stepped to the end.
  static Run run(bool use_graphs, bool profile) {
    Result<std::unique_ptr<model::LlamaModel>> model = model::LlamaModel::open(*path_);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return {};
    ModelEngineOptions options;
    options.num_threads = 2;
    options.memory_budget_bytes = 8 << 20;
    options.page_bytes = 16 << 10;
    options.block_size = 8;
    options.use_graphs = use_graphs;
    options.precapture_seconds = 0;
    options.scheduler.max_num_batched_tokens = 64;
    options.scheduler.max_num_sequences = 8;
    options.profile = profile;
    Result<std::unique_ptr<ModelEngine>> bundle = ModelEngine::create(std::move(*model), options);
    EXPECT_TRUE(bundle.ok()) << bundle.status();
    if (!bundle.ok()) return {};
    Engine& engine = (*bundle)->engine();
    Recorder recorder;
    uint64_t state = 77;
    std::vector<RequestId> ids;
    for (int index = 0; index < 8; ++index) {
      testing::RequestSpec spec;
      spec.prompt = testing::random_prompt(state, 5 + 3 * index, 500);
      for (int32_t& token : spec.prompt) token += 3;
      spec.max_tokens = 6 + index;
      spec.ignore_eos = true;
      spec.sampling.temperature = index % 2 == 0 ? 0.0f : 0.8f;
      spec.sampling.seed = 40 + index;
      Request request = testing::to_request(spec);
      Result<RequestId> id = engine.submit(recorder.attach(request));
      EXPECT_TRUE(id.ok()) << id.status();
      if (id.ok()) ids.push_back(*id);
    }
    engine.run_until_idle();
    recorder.expect_each_finished_once(ids);
    Run result;
    for (RequestId id : ids) result.outputs.push_back(recorder.stream(id).tokens);
    if ((*bundle)->profile() != nullptr) result.profile = *(*bundle)->profile();
    return result;
  }

  static inline std::string* path_ = nullptr;
};

TEST_P(EngineProfileTest, ProfilesDecodeAndPrefillStepsAndChangesNoToken) {
  const Run plain = run(GetParam(), false);
  const Run profiled = run(GetParam(), true);
  EXPECT_FALSE(plain.profile.has_value());
  ASSERT_TRUE(profiled.profile.has_value());
  EXPECT_EQ(profiled.outputs, plain.outputs);

  const exec::PhaseProfile& decode = profiled.profile->phase(exec::ProfilePhase::kDecode);
  const exec::PhaseProfile& prefill = profiled.profile->phase(exec::ProfilePhase::kPrefill);
  EXPECT_GT(decode.steps, 0);
  EXPECT_GT(prefill.steps, 0);
  for (const exec::PhaseProfile* phase : {&decode, &prefill}) {
    auto seconds = [&](exec::ProfileRow row) {
      return phase->rows.seconds[static_cast<size_t>(row)];
    };
    EXPECT_GT(seconds(exec::ProfileRow::kStepBuilding), 0.0);
    EXPECT_GT(seconds(exec::ProfileRow::kSampling), 0.0);
    EXPECT_GT(seconds(exec::ProfileRow::kInputPreparation), 0.0);
    EXPECT_GT(seconds(exec::ProfileRow::kMatmulFfnDown), 0.0);
    EXPECT_LE(phase->rows.total_seconds(), phase->step_seconds);
    EXPECT_GE(phase->other_seconds(), 0.0);
    // One LM head per step, whatever the batch.
    EXPECT_EQ(phase->rows.calls[static_cast<size_t>(exec::ProfileRow::kMatmulLmHead)],
              phase->steps);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, EngineProfileTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Graphs" : "Eager";
                         });

}  // namespace
}  // namespace folio::engine
