// Perplexity (engine/perplexity.h) end to end: the engine's sliding-window perplexity of
// generated models against the independent float64 PyTorch reference
// (tests/data/reference/llama_reference.py, golden files written by regenerate.sh from the same
// models this test generates in memory: same shape, same seed, same bytes, checked by hash);
// the window plan's invariants over random (N, C, S); edge cases and bad input; eager and
// captured graphs agreeing; chunked prefill agreeing with whole windows.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "folio/base/random.h"
#include "folio/engine/perplexity.h"
#include "folio/gguf/gguf_writer.h"

namespace folio::engine {
namespace {

struct ReferenceModel {
  const char* name;
  model::LlamaArchitecture architecture;
  DType dtype;
  bool tie_embeddings;
  uint64_t seed;
  double tolerance;  // largest |engine / reference - 1| of the perplexity
};

// Keep in sync with tests/data/reference/regenerate.sh (and tests/model/llama_forward_test.cc).
// f32 and f16 weights leave only f32 rounding of the logits (measured: 5e-8 relative); q8_0
// quantizes activations to 8 bits (measured: 2.7e-3).
constexpr ReferenceModel kReferenceModels[] = {
    {"llama_f32_gqa", model::LlamaArchitecture::kLlama, DType::kF32, false, 11, 1e-6},
    {"llama_q8_0_gqa", model::LlamaArchitecture::kLlama, DType::kQ8_0, false, 12, 1e-2},
    {"qwen2_f16_tied", model::LlamaArchitecture::kQwen2, DType::kF16, true, 13, 1e-6},
};

struct ReferenceWindows {
  int32_t context = 0;
  int32_t stride = 0;
  int32_t num_windows = 0;
  int64_t num_scored_tokens = 0;
  double mean_nll = 0;
  double perplexity = 0;
};

struct Golden {
  std::string model_hash;
  std::vector<int32_t> tokens;
  std::vector<ReferenceWindows> cases;
};

Golden read_golden(const std::string& name) {
  std::ifstream in(std::string(FOLIO_SOURCE_DIR) + "/tests/data/reference/" + name + ".json");
  EXPECT_TRUE(in.good()) << "missing golden file for " << name;
  const nlohmann::json json = nlohmann::json::parse(in);
  Golden golden;
  golden.model_hash = json["model_fnv1a64"].get<std::string>();
  golden.tokens = json["perplexity"]["tokens"].get<std::vector<int32_t>>();
  for (const auto& entry : json["perplexity"]["windows"]) {
    golden.cases.push_back(ReferenceWindows{
        entry["context"].get<int32_t>(), entry["stride"].get<int32_t>(),
        entry["num_windows"].get<int32_t>(), entry["num_scored_tokens"].get<int64_t>(),
        entry["mean_nll"].get<double>(), entry["perplexity"].get<double>()});
  }
  return golden;
}

struct TestEngine {
  std::unique_ptr<ModelEngine> engine;
  std::string model_hash;
};

// A small engine over the generated model: f32 KV cache (the reference is exact), no
// precapture, room for 64 logit rows per step.
Result<TestEngine> make_engine(const ReferenceModel& reference, bool use_graphs) {
  model::LlamaShape shape;
  shape.architecture = reference.architecture;
  shape.weight_dtype = reference.dtype;
  shape.tie_embeddings = reference.tie_embeddings;
  FOLIO_ASSIGN_OR_RETURN(gguf::GgufWriter writer,
                         model::make_random_llama_writer(shape, reference.seed));
  FOLIO_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, writer.write_to_buffer());
  TestEngine result;
  result.model_hash = fmt::format("{:016x}", fnv1a64(bytes));
  FOLIO_ASSIGN_OR_RETURN(gguf::GgufFile file, gguf::GgufFile::parse_owned(std::move(bytes)));
  FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<model::LlamaModel> model,
                         model::LlamaModel::from_file(std::move(file)));
  ModelEngineOptions options;
  options.num_threads = 2;
  options.memory_budget_bytes = int64_t{64} << 20;
  options.kv_dtype = DType::kF32;
  options.use_graphs = use_graphs;
  options.precapture_seconds = 0;
  options.max_logit_rows = 64;
  options.scheduler.max_num_sequences = 4;
  FOLIO_ASSIGN_OR_RETURN(result.engine, ModelEngine::create(std::move(model), options));
  return result;
}

PerplexityOptions windows(int32_t context, int32_t stride, int32_t chunk_tokens = 0) {
  PerplexityOptions options;
  options.context = context;
  options.stride = stride;
  options.chunk_tokens = chunk_tokens;
  return options;
}

class PerplexityReferenceTest : public ::testing::TestWithParam<std::tuple<ReferenceModel, bool>> {
};

TEST_P(PerplexityReferenceTest, MatchesIndependentReference) {
  const auto& [reference, use_graphs] = GetParam();
  const Golden golden = read_golden(reference.name);
  Result<TestEngine> engine = make_engine(reference, use_graphs);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_EQ(engine->model_hash, golden.model_hash)
      << "the generated model changed; run tests/data/reference/regenerate.sh";
  ASSERT_GE(golden.cases.size(), 4u);
  double worst = 0;
  for (const ReferenceWindows& expected : golden.cases) {
    // Whole windows in one step, and windows cut into chunks of 5 tokens (chunked prefill,
    // chunks asking for no, some or all of their logits).
    for (int32_t chunk : {0, 5}) {
      Result<PerplexityResult> result = compute_perplexity(
          *engine->engine, golden.tokens, windows(expected.context, expected.stride, chunk));
      ASSERT_TRUE(result.ok()) << result.status();
      SCOPED_TRACE(
          fmt::format("context {} stride {} chunk {}", expected.context, expected.stride, chunk));
      EXPECT_EQ(result->num_windows, expected.num_windows);
      EXPECT_EQ(result->num_scored_tokens, expected.num_scored_tokens);
      EXPECT_EQ(result->num_tokens, static_cast<int64_t>(golden.tokens.size()));
      EXPECT_NEAR(result->mean_nll, std::log(result->perplexity), 1e-12);
      const double error = std::abs(result->perplexity / expected.perplexity - 1);
      EXPECT_LE(error, reference.tolerance) << result->perplexity << " vs " << expected.perplexity;
      worst = std::max(worst, error);
    }
  }
  EXPECT_EQ(engine->engine->block_manager().num_sequences(), 0);
  if (use_graphs) {
    EXPECT_GT(engine->engine->executor().stats().hits, 0);
  }
  std::printf("%s (%s): worst relative perplexity error %.3g (tolerance %.1g)\n", reference.name,
              use_graphs ? "graphs" : "eager", worst, reference.tolerance);
}

INSTANTIATE_TEST_SUITE_P(GeneratedModels, PerplexityReferenceTest,
                         ::testing::Combine(::testing::ValuesIn(kReferenceModels),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) +
                                  (std::get<1>(info.param) ? "_graphs" : "_eager");
                         });

// --- The window plan.

TEST(PerplexityWindowsTest, ShortTextIsOneWindowScoringEveryTokenAfterTheFirst) {
  Result<std::vector<PerplexityWindow>> plan = plan_perplexity_windows(10, 16, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(*plan, (std::vector<PerplexityWindow>{{0, 10, 1}}));
  plan = plan_perplexity_windows(16, 16, 8);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(*plan, (std::vector<PerplexityWindow>{{0, 16, 1}}));
  plan = plan_perplexity_windows(2, 2, 1);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(*plan, (std::vector<PerplexityWindow>{{0, 2, 1}}));
}

TEST(PerplexityWindowsTest, OverlappingWindowsScoreOnlyNewTokens) {
  Result<std::vector<PerplexityWindow>> plan = plan_perplexity_windows(30, 16, 8);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(*plan, (std::vector<PerplexityWindow>{{0, 16, 1}, {8, 24, 16}, {16, 30, 24}}));
}

TEST(PerplexityWindowsTest, StrideEqualToContextLeavesEachWindowsFirstTokenUnscored) {
  Result<std::vector<PerplexityWindow>> plan = plan_perplexity_windows(40, 16, 16);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(*plan, (std::vector<PerplexityWindow>{{0, 16, 1}, {16, 32, 17}, {32, 40, 33}}));
  // A last window of one token would score nothing: it is not run.
  plan = plan_perplexity_windows(33, 16, 16);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(*plan, (std::vector<PerplexityWindow>{{0, 16, 1}, {16, 32, 17}}));
}

TEST(PerplexityWindowsTest, BadArgumentsAreRejected) {
  EXPECT_EQ(plan_perplexity_windows(1, 16, 8).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(plan_perplexity_windows(0, 16, 8).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(plan_perplexity_windows(10, 1, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(plan_perplexity_windows(10, 16, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(plan_perplexity_windows(10, 16, 17).status().code(), StatusCode::kInvalidArgument);
}

// Random (N, C, S): windows start at multiples of S and end at min(begin + C, N); scored ranges
// are non-empty, inside their window, disjoint and in order; with S < C they cover [1, N)
// exactly and the last window reaches N; with S == C only each later window's first token is
// left out.
TEST(PerplexityWindowsTest, RandomPlansKeepTheirInvariants) {
  std::mt19937 random(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t n = 2 + static_cast<int64_t>(random() % 200);
    const auto context = static_cast<int32_t>(2 + random() % 64);
    const auto stride = static_cast<int32_t>(1 + random() % static_cast<uint32_t>(context));
    Result<std::vector<PerplexityWindow>> plan = plan_perplexity_windows(n, context, stride);
    ASSERT_TRUE(plan.ok()) << plan.status();
    SCOPED_TRACE(fmt::format("N {} C {} S {}", n, context, stride));
    int64_t scored = 0, previous_end = 0;
    for (size_t w = 0; w < plan->size(); ++w) {
      const PerplexityWindow& window = (*plan)[w];
      ASSERT_EQ(window.begin, static_cast<int64_t>(w) * stride);
      ASSERT_EQ(window.end, std::min(window.begin + context, n));
      ASSERT_EQ(window.first_scored, std::max(window.begin + 1, previous_end));
      ASSERT_LT(window.first_scored, window.end);
      scored += window.end - window.first_scored;
      previous_end = window.end;
    }
    const auto num_windows = static_cast<int64_t>(plan->size());
    if (stride < context) {
      ASSERT_EQ(previous_end, n);
      ASSERT_EQ(scored, n - 1);
    } else {
      ASSERT_EQ(scored, previous_end - num_windows);
      ASSERT_GE(previous_end, n - 1);
    }
  }
}

// --- The engine's evaluation: edge cases, bad input, modes.

class PerplexityEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<TestEngine> engine = make_engine(kReferenceModels[0], /*use_graphs=*/true);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(engine->engine);
    std::mt19937 random(3);
    tokens_.push_back(1);
    while (tokens_.size() < 40) tokens_.push_back(static_cast<int32_t>(3 + random() % 500));
  }

  std::unique_ptr<ModelEngine> engine_;
  std::vector<int32_t> tokens_;
};

TEST_F(PerplexityEngineTest, BadInputIsRejectedAndChangesNothing) {
  const auto expect_invalid = [&](std::span<const int32_t> tokens, PerplexityOptions options) {
    Result<PerplexityResult> result = compute_perplexity(*engine_, tokens, options);
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument) << result.status();
  };
  const std::vector<int32_t> one_token = {1};
  expect_invalid(one_token, windows(16, 8));
  expect_invalid({}, windows(16, 8));
  expect_invalid(tokens_, windows(1, 1));
  expect_invalid(tokens_, windows(257, 8));  // the model's context length is 256
  expect_invalid(tokens_, windows(16, 17));
  expect_invalid(tokens_, windows(16, -1));
  expect_invalid(tokens_, windows(16, 8, -3));
  std::vector<int32_t> outside = tokens_;
  outside[5] = 512;  // vocabulary of 512
  expect_invalid(outside, windows(16, 8));
  EXPECT_EQ(perplexity_tokens(engine_->model().tokenizer(), "").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->block_manager().num_sequences(), 0);
  EXPECT_TRUE(compute_perplexity(*engine_, tokens_, windows(16, 8)).ok());
}

TEST_F(PerplexityEngineTest, DefaultsAreTheModelContextAndHalfOfIt) {
  Result<PerplexityResult> result = compute_perplexity(*engine_, tokens_, PerplexityOptions{});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->context, 256);
  EXPECT_EQ(result->stride, 128);
  EXPECT_EQ(result->num_windows, 1);
  EXPECT_EQ(result->num_scored_tokens, 39);
  EXPECT_EQ(result->num_evaluated_tokens, 39);  // the window's last token feeds nothing
  Result<PerplexityResult> explicit_context = compute_perplexity(*engine_, tokens_, windows(40, 1));
  ASSERT_TRUE(explicit_context.ok());
  EXPECT_EQ(explicit_context->perplexity, result->perplexity);
}

TEST_F(PerplexityEngineTest, CountsAndProgressFollowTheWindows) {
  PerplexityOptions options = windows(16, 16);
  std::vector<PerplexityProgress> reports;
  options.on_window = [&](const PerplexityProgress& progress) { reports.push_back(progress); };
  Result<PerplexityResult> result = compute_perplexity(*engine_, tokens_, options);
  ASSERT_TRUE(result.ok()) << result.status();
  // Windows [0,16), [16,32), [32,40); their first tokens after the first are not scored.
  EXPECT_EQ(result->num_windows, 3);
  EXPECT_EQ(result->num_scored_tokens, 15 + 15 + 7);
  EXPECT_EQ(result->num_evaluated_tokens, 15 + 15 + 7);
  ASSERT_EQ(reports.size(), 3u);
  for (size_t i = 0; i < reports.size(); ++i) {
    EXPECT_EQ(reports[i].windows_done, static_cast<int32_t>(i + 1));
    EXPECT_EQ(reports[i].num_windows, 3);
  }
  EXPECT_EQ(reports.back().tokens_evaluated, result->num_evaluated_tokens);
  EXPECT_GT(result->tokens_per_second(), 0);
}

TEST_F(PerplexityEngineTest, EagerAndGraphsAgree) {
  Result<TestEngine> eager = make_engine(kReferenceModels[0], /*use_graphs=*/false);
  ASSERT_TRUE(eager.ok()) << eager.status();
  for (const auto& [context, stride] : {std::pair{16, 8}, {16, 16}, {7, 3}, {64, 32}}) {
    Result<PerplexityResult> graphs =
        compute_perplexity(*engine_, tokens_, windows(context, stride));
    Result<PerplexityResult> eagerly =
        compute_perplexity(*eager->engine, tokens_, windows(context, stride));
    ASSERT_TRUE(graphs.ok() && eagerly.ok());
    EXPECT_NEAR(graphs->mean_nll, eagerly->mean_nll, 1e-9) << context << "/" << stride;
  }
  EXPECT_GT(engine_->executor().stats().hits, 0);
}

TEST_F(PerplexityEngineTest, TextIsBosThenTheTokensOfTheWholeText) {
  const tokenizer::Tokenizer& tokenizer = engine_->model().tokenizer();
  const std::string text = "the cat sat on the mat <s> and then it slept";
  Result<std::vector<int32_t>> tokens = perplexity_tokens(tokenizer, text);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  tokenizer::EncodeOptions plain;
  plain.add_special = false;
  std::vector<int32_t> expected = {static_cast<int32_t>(*tokenizer.bos())};
  for (tokenizer::TokenId id : tokenizer.encode(text, plain)) expected.push_back(id);
  EXPECT_EQ(*tokens, expected);
  // "<s>" in the text is text, not BOS.
  EXPECT_EQ(std::count(tokens->begin(), tokens->end(), expected[0]), 1);
  Result<PerplexityResult> from_text = compute_text_perplexity(*engine_, text, windows(8, 4));
  Result<PerplexityResult> from_tokens = compute_perplexity(*engine_, expected, windows(8, 4));
  ASSERT_TRUE(from_text.ok() && from_tokens.ok());
  EXPECT_EQ(from_text->perplexity, from_tokens->perplexity);
  EXPECT_EQ(compute_text_perplexity(*engine_, "", windows(8, 4)).status().code(),
            StatusCode::kInvalidArgument);
}

// The engine's prompt logprobs (Request::prompt_logprobs) share perplexity's definition: over a
// prompt longer than a step's logit rows (64), their sum is minus the NLL sum of one window
// covering the whole prompt.
TEST_F(PerplexityEngineTest, PromptLogprobsSumToMinusThePerplexityNll) {
  std::mt19937 random(5);
  std::vector<int32_t> prompt = {1};
  while (prompt.size() < 150) prompt.push_back(static_cast<int32_t>(3 + random() % 500));
  Result<PerplexityResult> perplexity =
      compute_perplexity(*engine_, prompt, windows(static_cast<int32_t>(prompt.size()), 1));
  ASSERT_TRUE(perplexity.ok()) << perplexity.status();
  ASSERT_EQ(perplexity->num_scored_tokens, 149);
  std::vector<TokenLogprobs> entries;
  int32_t num_calls = 0;
  std::optional<Completion> completion;
  Request request;
  request.prompt = prompt;
  request.max_tokens = 0;
  request.prompt_logprobs = true;
  request.on_prompt_logprobs = [&](std::span<const TokenLogprobs> scored) {
    ++num_calls;
    entries.assign(scored.begin(), scored.end());
  };
  request.on_finish = [&](const Completion& done) { completion = done; };
  ASSERT_TRUE(engine_->engine().submit(std::move(request)).ok());
  engine_->engine().run_until_idle();
  ASSERT_TRUE(completion.has_value());
  EXPECT_EQ(completion->reason, FinishReason::kLength) << completion->error;
  ASSERT_EQ(num_calls, 1);
  ASSERT_EQ(entries.size(), 149u);
  double sum = 0;
  for (size_t index = 0; index < entries.size(); ++index) {
    EXPECT_EQ(entries[index].token, prompt[index + 1]);
    sum += entries[index].logprob;
  }
  const double nll_sum = perplexity->mean_nll * static_cast<double>(perplexity->num_scored_tokens);
  EXPECT_NEAR(-sum / nll_sum, 1.0, 1e-6) << sum << " vs " << -nll_sum;
  EXPECT_EQ(engine_->block_manager().num_sequences(), 0);
}

}  // namespace
}  // namespace folio::engine
