// The per-op profile (exec/op_profile.h) on the test model: every op the step's graph contains
// is counted exactly once per step in its row, eager and replayed (full graphs and piecewise
// programs, whose attention runs between the pieces); the rows of a step never add up to more
// than the step's measured wall time; and profiling changes no output bit.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "exec_test_util.h"
#include "folio/ir/cost.h"

namespace folio::exec {
namespace {

using testing::OwnedStep;
using testing::StepGenerator;
using testing::TestKvCache;
using testing::TestModelState;

// Ops per profile row in the graph the executor ran its last step with.
std::array<int64_t, kNumProfileRows> expected_calls(const testing::TestModelConfig& config,
                                                    const Executor& executor) {
  const Result<ir::Graph> graph = testing::test_model_factory(config)(executor.last_step_shape());
  EXPECT_TRUE(graph.ok()) << graph.status();
  std::array<int64_t, kNumProfileRows> calls{};
  if (!graph.ok()) return calls;
  for (const ir::Op& op : graph->ops()) {
    ++calls[static_cast<size_t>(profile_row_of(*graph, op))];
  }
  return calls;
}

class OpProfileTest : public ::testing::TestWithParam<ExecutionMode> {
 protected:
  void SetUp() override {
    config_.num_blocks = 160;
    model_ = TestModelState::create(config_, 5);
    ExecutorOptions options = testing::test_options(16, GetParam());
    options.profile = &profile_;
    profiled_ =
        std::move(testing::make_executor(model_, model_.kv, pool_, *arena_.arena, options)).value();
    plain_kv_ = model_.fresh_kv();
    ExecutorOptions plain_options = testing::test_options(16, GetParam());
    plain_options.name = "plain";
    plain_ =
        std::move(testing::make_executor(model_, plain_kv_, pool_, *arena_.arena, plain_options))
            .value();
  }

  // Runs `step` on the profiled executor, checks its profile against its graph, and ends the
  // profile's step; returns the logits.
  std::vector<float> run_profiled(const OwnedStep& step, ProfilePhase phase) {
    const auto start = std::chrono::steady_clock::now();
    Result<ir::StepOutput> output = profiled_->execute(step.view());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_TRUE(output.ok()) << output.status();
    if (!output.ok()) return {};
    const ProfileTimes& rows = profile_.current_step();
    const std::array<int64_t, kNumProfileRows> expected = expected_calls(config_, *profiled_);
    for (int index = 0; index < kNumProfileRows; ++index) {
      const auto row = static_cast<ProfileRow>(index);
      const auto at = static_cast<size_t>(index);
      if (row == ProfileRow::kInputPreparation) {
        EXPECT_EQ(rows.calls[at], 1);
      } else if (row == ProfileRow::kGraphCapture) {
        EXPECT_EQ(rows.calls[at],
                  profiled_->last_step_path() == StepPath::kCapturedAndReplayed ? 1 : 0);
      } else {
        // The IR ops' rows; thread_wait and the engine's rows count no calls.
        EXPECT_EQ(rows.calls[at], expected[at])
            << profile_row_name(row) << ", path " << static_cast<int>(profiled_->last_step_path());
        if (expected[at] > 0) {
          EXPECT_GT(rows.seconds[at], 0.0) << profile_row_name(row);
        }
      }
    }
    EXPECT_GT(rows.seconds[static_cast<size_t>(ProfileRow::kInputPreparation)], 0.0);
    EXPECT_LE(rows.total_seconds(), seconds);
    const std::vector<float> logits(output->logits.begin(), output->logits.end());
    profile_.end_step(phase, seconds);
    return logits;
  }

  std::vector<float> run_plain(const OwnedStep& step) {
    Result<ir::StepOutput> output = plain_->execute(step.view());
    EXPECT_TRUE(output.ok()) << output.status();
    if (!output.ok()) return {};
    return {output->logits.begin(), output->logits.end()};
  }

  testing::TestModelConfig config_;
  ThreadPool pool_{3};
  testing::TestArena arena_ = testing::TestArena::create();
  TestModelState model_;
  TestKvCache plain_kv_;
  OpProfile profile_;
  std::unique_ptr<Executor> profiled_;
  std::unique_ptr<Executor> plain_;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_P(OpProfileTest, CountsEveryOpOnceAndChangesNoOutputBit) {
  StepGenerator generator(testing::GeneratorConfig::for_model(config_, 16), 17);
  int64_t decode_steps = 0, prefill_steps = 0;
  for (int round = 0; round < 6; ++round) {
    // Prefill (piecewise programs in graph mode), then decodes that replay full graphs.
    const std::vector<int32_t> prompts = {5 + round, 3};
    const OwnedStep prefill = generator.step(round % 2, prompts);
    const std::vector<float> profiled = run_profiled(prefill, ProfilePhase::kPrefill);
    EXPECT_TRUE(same_bits(profiled, run_plain(prefill))) << "prefill, round " << round;
    ++prefill_steps;
    for (int decode = 0; decode < 3; ++decode) {
      const OwnedStep step = generator.decode(1 + (round + decode) % 4);
      const std::vector<float> decoded = run_profiled(step, ProfilePhase::kDecode);
      EXPECT_TRUE(same_bits(decoded, run_plain(step))) << "decode, round " << round;
      ++decode_steps;
    }
  }
  if (GetParam() == ExecutionMode::kGraph) {
    EXPECT_GT(profiled_->stats().hits, 0);  // replayed steps were counted, not only captures
  }
  const PhaseProfile& decode = profile_.phase(ProfilePhase::kDecode);
  const PhaseProfile& prefill = profile_.phase(ProfilePhase::kPrefill);
  EXPECT_EQ(decode.steps, decode_steps);
  EXPECT_EQ(prefill.steps, prefill_steps);
  for (const PhaseProfile* phase : {&decode, &prefill}) {
    EXPECT_LE(phase->rows.total_seconds(), phase->step_seconds);
    EXPECT_GE(phase->other_seconds(), 0.0);
    // Every step runs each layer's seven matmuls and the LM head.
    const int64_t layers = config_.model.num_layers;
    EXPECT_EQ(phase->rows.calls[static_cast<size_t>(ProfileRow::kMatmulQkv)],
              3 * layers * phase->steps);
    EXPECT_EQ(phase->rows.calls[static_cast<size_t>(ProfileRow::kMatmulFfnGateUp)],
              2 * layers * phase->steps);
    EXPECT_EQ(phase->rows.calls[static_cast<size_t>(ProfileRow::kMatmulLmHead)], phase->steps);
    EXPECT_EQ(phase->rows.calls[static_cast<size_t>(ProfileRow::kAttention)],
              layers * phase->steps);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, OpProfileTest,
                         ::testing::Values(ExecutionMode::kGraph, ExecutionMode::kEager),
                         [](const ::testing::TestParamInfo<ExecutionMode>& info) {
                           return info.param == ExecutionMode::kGraph ? "Graph" : "Eager";
                         });

TEST(OpProfileRowTest, MatmulsAreNamedByTheirWeights) {
  const Result<ir::Graph> graph = folio::testing::build_llama_test_graph();
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::array<int64_t, kNumProfileRows> matmuls{};
  for (const ir::Op& op : graph->ops()) {
    if (op.kind != ir::OpKind::kMatMul) continue;
    ++matmuls[static_cast<size_t>(profile_row_of(*graph, op))];
  }
  const int64_t layers = model::LlamaShape{}.num_layers;
  EXPECT_EQ(matmuls[static_cast<size_t>(ProfileRow::kMatmulQkv)], 3 * layers);
  EXPECT_EQ(matmuls[static_cast<size_t>(ProfileRow::kMatmulAttentionOutput)], layers);
  EXPECT_EQ(matmuls[static_cast<size_t>(ProfileRow::kMatmulFfnGateUp)], 2 * layers);
  EXPECT_EQ(matmuls[static_cast<size_t>(ProfileRow::kMatmulFfnDown)], layers);
  EXPECT_EQ(matmuls[static_cast<size_t>(ProfileRow::kMatmulLmHead)], 1);
  EXPECT_EQ(matmuls[static_cast<size_t>(ProfileRow::kMatmulOther)], 0);
}

// A decode token streams every weight once except the embedding table, of which it reads the
// one row it gathers (the test model's head is untied).
TEST(WeightBytesReadTest, OneDecodeTokenReadsEveryWeightAndOneEmbeddingRow) {
  testing::TestModelConfig config;
  config.step = ir::StepShape{1, 1, 1, ir::StepPhase::kDecode};
  const Result<ir::Graph> graph = folio::testing::build_llama_test_graph(config);
  ASSERT_TRUE(graph.ok()) << graph.status();
  int64_t expected = 0;
  for (const ir::TensorInfo& tensor : graph->tensors()) {
    if (tensor.residency != ir::Residency::kWeight) continue;
    expected +=
        tensor.name == "token_embd.weight" ? tensor.bytes() / tensor.shape[0] : tensor.bytes();
  }
  EXPECT_EQ(ir::weight_bytes_read(*graph), expected);
  EXPECT_GT(expected, 0);
}

}  // namespace
}  // namespace folio::exec
