// The request features OpenAI-style clients rely on, through the engine with the toy model:
// logit bias, logprobs of generated and prompt tokens, token constraints, and n > 1 choices
// sharing the prompt's KV. References are computed independently from the toy model's logits.
#include <gtest/gtest.h>

#include <cmath>

#include "engine_test_util.h"

namespace folio::engine {
namespace {

using testing::EngineHarness;
using testing::greedy_request;
using testing::HarnessOptions;
using testing::Recorder;
using testing::reference_greedy;

std::vector<int32_t> iota_prompt(int32_t length, int32_t start = 1) {
  std::vector<int32_t> prompt;
  for (int32_t index = 0; index < length; ++index) prompt.push_back((start + index * 7) % 64);
  return prompt;
}

TEST(LogitBiasEngineTest, APositiveBiasForcesItsTokenGreedyAndSampled) {
  EngineHarness harness(HarnessOptions{});
  Recorder recorder;
  Request greedy = greedy_request(iota_prompt(9), 12);
  greedy.sampling.logit_bias = {{17, 100.0f}};
  Request sampled = greedy_request(iota_prompt(9), 12);
  sampled.sampling.temperature = 1.0f;
  sampled.sampling.seed = 3;
  sampled.sampling.logit_bias = {{17, 100.0f}};
  const RequestId greedy_id = *harness.engine().submit(recorder.attach(greedy));
  const RequestId sampled_id = *harness.engine().submit(recorder.attach(sampled));
  harness.engine().run_until_idle();
  EXPECT_EQ(recorder.stream(greedy_id).tokens, std::vector<int32_t>(12, 17));
  EXPECT_EQ(recorder.stream(sampled_id).tokens, std::vector<int32_t>(12, 17));
}

TEST(LogitBiasEngineTest, ANegativeBiasBansTheReferenceToken) {
  HarnessOptions options;
  EngineHarness harness(options);
  const std::vector<int32_t> reference = reference_greedy(options, iota_prompt(9), 1);
  Recorder recorder;
  Request request = greedy_request(iota_prompt(9), 1);
  request.sampling.logit_bias = {{reference[0], -100.0f}};
  const RequestId id = *harness.engine().submit(recorder.attach(request));
  harness.engine().run_until_idle();
  // The second best token of the toy model's row.
  std::vector<float> logits(static_cast<size_t>(options.vocab_size));
  testing::ToyStepRunner::logits_for_key(
      testing::ToyStepRunner::reference_key(options.model_seed, 0, iota_prompt(9)), logits);
  logits[static_cast<size_t>(reference[0])] = -INFINITY;
  const auto second =
      static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  EXPECT_EQ(recorder.stream(id).tokens, std::vector<int32_t>{second});
}

TEST(LogitBiasEngineTest, SubmitRejectsABiasOutsideTheVocabulary) {
  EngineHarness harness(HarnessOptions{});
  Request request = greedy_request({1, 2}, 4);
  request.sampling.logit_bias = {{64, 1.0f}};
  const Result<RequestId> result = harness.engine().submit(std::move(request));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("logit_bias"), std::string::npos);
}

}  // namespace
}  // namespace folio::engine
