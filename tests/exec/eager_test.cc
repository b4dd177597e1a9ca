// Eager execution against an independent double-precision interpreter of the same IR, and the
// errors of binding a graph the CPU kernels cannot run.
#include <gtest/gtest.h>

#include <cmath>

#include "exec_test_util.h"
#include "folio/exec/prepared_graph.h"
#include "folio/ir/builder.h"
#include "reference_interpreter.h"

namespace folio::exec {
namespace {

using testing::OwnedStep;
using testing::StepGenerator;
using testing::TestModelState;

struct EagerCase {
  const char* name;
  DType weight_dtype;
  DType kv_dtype;
  model::LlamaArchitecture architecture;  // kQwen2: NeoX RoPE and Q/K/V biases
  double tolerance;                       // relative to the largest |logit|
};

class EagerReferenceTest : public ::testing::TestWithParam<EagerCase> {};

// Eager logits of a sequence of prefill, mixed and decode steps (padded to buckets) match the
// interpreter run on the exact, unpadded shapes.
TEST_P(EagerReferenceTest, MatchesIndependentInterpreterOverSteps) {
  const EagerCase& param = GetParam();
  testing::TestModelConfig config;
  config.model.weight_dtype = param.weight_dtype;
  config.model.architecture = param.architecture;
  config.kv_dtype = param.kv_dtype;
  TestModelState model = TestModelState::create(config, 7);
  ThreadPool pool(3);
  testing::TestArena arena = testing::TestArena::create();
  Result<std::unique_ptr<Executor>> executor = testing::make_executor(
      model, model.kv, pool, *arena.arena, testing::test_options(8, ExecutionMode::kEager));
  ASSERT_TRUE(executor.ok()) << executor.status();
  testing::ReferenceInterpreter reference(*model.weights);
  StepGenerator generator(testing::GeneratorConfig::for_model(config, 8), 11);

  const std::vector<std::vector<int32_t>> prefills = {{5, 17}, {3}, {}, {9}, {}, {}};
  const std::vector<int32_t> decodes = {0, 2, 3, 2, 4, 4};
  for (size_t i = 0; i < prefills.size(); ++i) {
    const OwnedStep step = generator.step(decodes[i], prefills[i]);
    Result<ir::StepOutput> output = (*executor)->execute(step.view());
    ASSERT_TRUE(output.ok()) << output.status();
    testing::TestModelConfig exact = config;
    exact.step = ir::StepShape{step.num_tokens(), static_cast<int32_t>(step.seq_lens.size()),
                               static_cast<int32_t>(step.logit_indices.size()),
                               ir::StepPhase::kPrefill};  // ir::Phase::kMixed
    Result<ir::Graph> graph = folio::testing::build_llama_test_graph(exact);
    ASSERT_TRUE(graph.ok()) << graph.status();
    Result<std::vector<double>> expected = reference.run(*graph, step.view());
    ASSERT_TRUE(expected.ok()) << expected.status();
    ASSERT_EQ(output->logits.size(), expected->size());
    double largest = 1.0, worst = 0.0;
    for (size_t j = 0; j < expected->size(); ++j) {
      largest = std::max(largest, std::abs((*expected)[j]));
      worst = std::max(worst, std::abs((*expected)[j] - output->logits[j]));
    }
    EXPECT_LE(worst, param.tolerance * largest) << "step " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, EagerReferenceTest,
    ::testing::Values(
        EagerCase{"f32", DType::kF32, DType::kF32, model::LlamaArchitecture::kLlama, 1e-5},
        EagerCase{"f16_neox_bias", DType::kF16, DType::kF32, model::LlamaArchitecture::kQwen2,
                  1e-5},
        EagerCase{"f32_f16cache", DType::kF32, DType::kF16, model::LlamaArchitecture::kLlama, 1e-3},
        EagerCase{"q8_0", DType::kQ8_0, DType::kF32, model::LlamaArchitecture::kLlama, 3e-2}),
    [](const ::testing::TestParamInfo<EagerCase>& info) { return std::string(info.param.name); });

// The interpreter is not trivially lenient: a wrong token id changes the comparison.
TEST(EagerReferenceTest, InterpreterDetectsAWrongInput) {
  testing::TestModelConfig config;
  TestModelState model = TestModelState::create(config, 7);
  ThreadPool pool(2);
  testing::TestArena arena = testing::TestArena::create();
  Result<std::unique_ptr<Executor>> executor = testing::make_executor(
      model, model.kv, pool, *arena.arena, testing::test_options(8, ExecutionMode::kEager));
  ASSERT_TRUE(executor.ok()) << executor.status();
  StepGenerator generator(testing::GeneratorConfig::for_model(config, 8), 3);
  OwnedStep step = generator.step(0, std::vector<int32_t>{4});
  Result<ir::StepOutput> output = (*executor)->execute(step.view());
  ASSERT_TRUE(output.ok()) << output.status();
  step.token_ids.back() =
      (step.token_ids.back() + 1) % static_cast<int32_t>(config.model.vocab_size);
  config.step = ir::StepShape{4, 1, 1, ir::StepPhase::kPrefill};
  Result<ir::Graph> graph = folio::testing::build_llama_test_graph(config);
  ASSERT_TRUE(graph.ok());
  testing::ReferenceInterpreter reference(*model.weights);
  Result<std::vector<double>> expected = reference.run(*graph, step.view());
  ASSERT_TRUE(expected.ok());
  double worst = 0;
  for (size_t j = 0; j < expected->size(); ++j) {
    worst = std::max(worst, std::abs((*expected)[j] - output->logits[j]));
  }
  EXPECT_GT(worst, 1e-3);
}

class PrepareErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = TestModelState::create(config_, 1);
    StepLimits limits;
    limits.max_tokens = 16;
    limits.max_sequences = 4;
    limits.max_logit_rows = 4;
    limits.max_blocks_per_sequence = config_.max_blocks_per_sequence;
    limits.num_kv_blocks = config_.num_blocks;
    limits.block_size = config_.block_size;
    limits.vocab_size = config_.model.vocab_size;
    limits.num_dummy_blocks = 1;
    inputs_ = std::move(PersistentInputs::create(limits, testing::shared_step_pool())).value();
  }
  Status prepare(ir::Graph graph, const KvCacheBinding& kv) {
    const PrepareContext context{*model_.weights, kv, *inputs_, {}, 2, nullptr, nullptr};
    return PreparedGraph::prepare(std::move(graph), context).status();
  }
  Status prepare(ir::Graph graph) { return prepare(std::move(graph), model_.kv.binding); }

  testing::TestModelConfig config_;
  TestModelState model_;
  std::unique_ptr<PersistentInputs> inputs_;
};

TEST_F(PrepareErrorTest, TheTestModelPrepares) {
  EXPECT_TRUE(prepare(std::move(folio::testing::build_llama_test_graph(config_)).value()).ok());
}

TEST_F(PrepareErrorTest, WeightOfAnotherDtypeIsNamed) {
  testing::TestModelConfig other = config_;
  other.model.weight_dtype = DType::kF16;  // the source holds f32 weights
  const Status status = prepare(std::move(folio::testing::build_llama_test_graph(other)).value());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("token_embd.weight"), std::string::npos) << status;
}

TEST_F(PrepareErrorTest, MissingWeightIsNotFound) {
  testing::TestModelConfig other = config_;
  other.model.architecture = model::LlamaArchitecture::kQwen2;  // the source has no biases
  const Status status = prepare(std::move(folio::testing::build_llama_test_graph(other)).value());
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_NE(status.message().find("attn_q.bias"), std::string::npos) << status;
}

TEST_F(PrepareErrorTest, KvCacheOfAnotherShapeIsRejected) {
  KvCacheBinding kv = model_.kv.binding;
  kv.num_blocks = config_.num_blocks / 2;
  const Status status =
      prepare(std::move(folio::testing::build_llama_test_graph(config_)).value(), kv);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("k_cache"), std::string::npos) << status;
}

TEST_F(PrepareErrorTest, InputLargerThanItsPersistentBufferIsRejected) {
  testing::TestModelConfig other = config_;
  other.step.num_tokens = 32;  // the persistent buffers hold 16 tokens
  const Status status = prepare(std::move(folio::testing::build_llama_test_graph(other)).value());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("token_ids"), std::string::npos) << status;
}

TEST_F(PrepareErrorTest, OpWithoutCpuKernelIsNamed) {
  ir::GraphBuilder builder(ir::Phase::kDecode);
  const ir::TensorId ids = *builder.input("token_ids", DType::kI32, {4});
  const ir::TensorId table =
      *builder.weight("token_embd.weight", DType::kF32, {config_.model.vocab_size, 64});
  const ir::TensorId hidden = *builder.embedding(ids, table, "embed");
  const ir::TensorId activated = *builder.silu(hidden, "act");
  ASSERT_TRUE(builder.mark_output(activated).ok());
  const Status status = prepare(std::move(builder.finish()).value());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("silu 'act'"), std::string::npos) << status;
}

TEST_F(PrepareErrorTest, UnknownInputNameIsRejected) {
  ir::GraphBuilder builder(ir::Phase::kDecode);
  const ir::TensorId ids = *builder.input("tokens", DType::kI32, {4});
  const ir::TensorId table =
      *builder.weight("token_embd.weight", DType::kF32, {config_.model.vocab_size, 64});
  const ir::TensorId hidden = *builder.embedding(ids, table, "embed");
  ASSERT_TRUE(builder.mark_output(hidden).ok());
  const Status status = prepare(std::move(builder.finish()).value());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("'tokens' is not a persistent input"), std::string::npos)
      << status;
}

}  // namespace
}  // namespace folio::exec
