// The request features OpenAI-style clients rely on, through the engine with the toy model:
// logit bias, logprobs of generated and prompt tokens, token constraints, and n > 1 choices
// sharing the prompt's KV. References are computed independently from the toy model's logits.
#include <gtest/gtest.h>

#include <cmath>

#include "engine_test_util.h"
#include "folio/base/random.h"

namespace folio::engine {
namespace {

using testing::EngineHarness;
using testing::greedy_request;
using testing::HarnessOptions;
using testing::iota_prompt;
using testing::Recorder;
using testing::reference_greedy;

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

// Independent log-softmax in long double, and the top k by a full stable sort.
TokenLogprobs reference_logprobs(std::span<const float> logits, int32_t token, int32_t num_top) {
  long double largest = -INFINITY;
  for (float logit : logits) largest = std::max<long double>(largest, logit);
  long double sum = 0;
  for (float logit : logits) sum += std::exp(static_cast<long double>(logit) - largest);
  const long double normalizer = std::log(sum) + largest;
  TokenLogprobs result;
  result.token = token;
  result.logprob = static_cast<double>(logits[static_cast<size_t>(token)] - normalizer);
  std::vector<int32_t> order(logits.size());
  for (size_t index = 0; index < order.size(); ++index) order[index] = static_cast<int32_t>(index);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  for (int32_t rank = 0; rank < num_top && rank < static_cast<int32_t>(order.size()); ++rank) {
    result.top.push_back(
        TopLogprob{order[rank], static_cast<double>(logits[order[rank]] - normalizer)});
  }
  return result;
}

void expect_logprobs_near(const TokenLogprobs& actual, const TokenLogprobs& expected) {
  EXPECT_EQ(actual.token, expected.token);
  EXPECT_NEAR(actual.logprob, expected.logprob, 1e-12);
  ASSERT_EQ(actual.top.size(), expected.top.size());
  for (size_t rank = 0; rank < expected.top.size(); ++rank) {
    EXPECT_EQ(actual.top[rank].token, expected.top[rank].token) << "rank " << rank;
    EXPECT_NEAR(actual.top[rank].logprob, expected.top[rank].logprob, 1e-12) << "rank " << rank;
  }
}

TEST(TokenLogprobsTest, MatchesAnIndependentLogSoftmaxAndOrdersTiesByLowestId) {
  SplitMix64 random(11);
  std::vector<float> logits(300);
  for (float& logit : logits) logit = static_cast<float>(random.next() >> 40) * 0x1.0p-20f - 8.0f;
  logits[7] = logits[250] = logits[40] = 20.0f;  // a three-way tie at the top
  TokenLogprobs actual;
  for (int32_t num_top : {0, 1, 3, 5, 20}) {
    compute_token_logprobs(logits, 123, num_top, actual);
    expect_logprobs_near(actual, reference_logprobs(logits, 123, num_top));
  }
  ASSERT_EQ(actual.top.size(), 20u);
  EXPECT_EQ(actual.top[0].token, 7);
  EXPECT_EQ(actual.top[1].token, 40);
  EXPECT_EQ(actual.top[2].token, 250);
  // More alternatives asked than the vocabulary has: all of them.
  const std::vector<float> small = {0.0f, 1.0f};
  compute_token_logprobs(small, 0, 20, actual);
  expect_logprobs_near(actual, reference_logprobs(small, 0, 2));
}

TEST(TokenLogprobsTest, NaNAndMinusInfinityHaveProbabilityZero) {
  const std::vector<float> logits = {std::nanf(""), 0.0f, -INFINITY, 0.0f};
  TokenLogprobs actual;
  compute_token_logprobs(logits, 0, 4, actual);
  EXPECT_EQ(actual.logprob, -INFINITY);
  ASSERT_EQ(actual.top.size(), 4u);
  EXPECT_EQ(actual.top[0].token, 1);
  EXPECT_NEAR(actual.top[0].logprob, std::log(0.5), 1e-15);
  EXPECT_EQ(actual.top[1].token, 3);
  EXPECT_EQ(actual.top[2].logprob, -INFINITY);
  EXPECT_EQ(actual.top[3].logprob, -INFINITY);
}

TEST(LogprobsEngineTest, EveryTokenCarriesTheModelsRawLogprobsAndTheSumIsReported) {
  HarnessOptions options;
  EngineHarness harness(options);
  Recorder recorder;
  Request request = greedy_request(iota_prompt(11), 9);
  request.logprobs = 5;
  request.sampling.temperature = 0.7f;
  request.sampling.seed = 42;
  request.sampling.logit_bias = {{3, 2.0f}};  // changes the pick, never the reported logprobs
  request.sampling.presence_penalty = 1.0f;
  Request plain = greedy_request(iota_prompt(11), 9);
  const RequestId id = *harness.engine().submit(recorder.attach(request));
  const RequestId plain_id = *harness.engine().submit(recorder.attach(plain));
  harness.engine().run_until_idle();
  const Recorder::Stream stream = recorder.stream(id);
  ASSERT_EQ(stream.logprobs.size(), stream.tokens.size());
  std::vector<int32_t> context = iota_prompt(11);
  double sum = 0;
  for (size_t index = 0; index < stream.tokens.size(); ++index) {
    SCOPED_TRACE(index);
    expect_logprobs_near(
        stream.logprobs[index],
        reference_logprobs(testing::reference_logits(options, context), stream.tokens[index], 5));
    sum += stream.logprobs[index].logprob;
    context.push_back(stream.tokens[index]);
  }
  ASSERT_TRUE(recorder.completion(id).cumulative_logprob.has_value());
  EXPECT_NEAR(*recorder.completion(id).cumulative_logprob, sum, 1e-9);
  EXPECT_TRUE(recorder.stream(plain_id).logprobs.empty());
  EXPECT_FALSE(recorder.completion(plain_id).cumulative_logprob.has_value());
}

TEST(LogprobsEngineTest, SubmitRejectsMoreThanTwentyTopLogprobs) {
  EngineHarness harness(HarnessOptions{});
  for (int32_t bad : {-1, 21}) {
    Request request = greedy_request({1, 2}, 4);
    request.logprobs = bad;
    const Result<RequestId> result = harness.engine().submit(std::move(request));
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  }
}

struct PromptLogprobsRecord {
  int32_t num_calls = 0;
  int32_t tokens_before_call = -1;  // tokens streamed when the call came
  std::vector<TokenLogprobs> entries;
};

// Records on_prompt_logprobs, and whether it came before the first token (on top of the
// recorder's callbacks, which must be attached first).
void record_prompt_logprobs(Request& request, PromptLogprobsRecord& record) {
  request.on_prompt_logprobs = [&record](std::span<const TokenLogprobs> entries) {
    ++record.num_calls;
    record.entries.assign(entries.begin(), entries.end());
  };
  auto on_token = std::move(request.on_token);
  request.on_token = [&record, on_token](const TokenEvent& event) {
    if (event.index == 0 && record.tokens_before_call < 0) {
      record.tokens_before_call = record.num_calls == 0 ? -2 : 0;  // -2: token came first
    }
    on_token(event);
  };
}

void expect_prompt_logprobs(const HarnessOptions& options, std::span<const int32_t> prompt,
                            int32_t num_top, const std::vector<TokenLogprobs>& entries) {
  ASSERT_EQ(entries.size(), prompt.size() - 1);
  for (size_t index = 1; index < prompt.size(); ++index) {
    SCOPED_TRACE(index);
    expect_logprobs_near(entries[index - 1],
                         reference_logprobs(testing::reference_logits(options, prompt.first(index)),
                                            prompt[index], num_top));
  }
}

TEST(PromptLogprobsTest, EveryPromptTokenIsScoredEvenWhenItsPrefixIsCached) {
  HarnessOptions options;
  options.max_logit_rows = 4;  // forces the prompt's rows into many steps
  options.scheduler.max_num_sequences = 4;
  options.scheduler.max_num_batched_tokens = 64;
  options.scheduler.prefill_chunk_size = 64;
  EngineHarness harness(options);
  const std::vector<int32_t> prompt = iota_prompt(37);
  Recorder recorder;
  // The same prompt first, so its full blocks sit in the prefix cache.
  Request warm = greedy_request(prompt, 2);
  *harness.engine().submit(recorder.attach(warm));
  harness.engine().run_until_idle();
  Request request = greedy_request(prompt, 5);
  request.logprobs = 3;
  request.prompt_logprobs = true;
  PromptLogprobsRecord record;
  recorder.attach(request);
  record_prompt_logprobs(request, record);
  const RequestId id = *harness.engine().submit(std::move(request));
  harness.engine().run_until_idle();
  EXPECT_EQ(record.num_calls, 1);
  EXPECT_EQ(record.tokens_before_call, 0) << "on_prompt_logprobs must come before any token";
  expect_prompt_logprobs(options, prompt, 3, record.entries);
  const Completion completion = recorder.completion(id);
  EXPECT_EQ(completion.reason, FinishReason::kLength) << completion.error;
  EXPECT_EQ(completion.num_cached_prompt_tokens, 0);
  EXPECT_EQ(recorder.stream(id).tokens, reference_greedy(options, prompt, 5));
  harness.expect_all_blocks_free_or_cached();
}

TEST(PromptLogprobsTest, MaxTokensZeroScoresThePromptAndGeneratesNothing) {
  for (bool chunked : {true, false}) {
    HarnessOptions options;
    options.scheduler.chunked_prefill = chunked;
    options.scheduler.max_num_sequences = 2;
    options.scheduler.max_num_batched_tokens = 16;  // below the prompt: chunked regardless
    options.max_logit_rows = 8;
    EngineHarness harness(options);
    const std::vector<int32_t> prompt = iota_prompt(30, 5);
    Recorder recorder;
    Request request = greedy_request(prompt, 0);
    request.prompt_logprobs = true;
    PromptLogprobsRecord record;
    recorder.attach(request);
    record_prompt_logprobs(request, record);
    // A neighbour decoding alongside, so steps mix rows of both.
    Request neighbour = greedy_request(iota_prompt(6, 2), 20);
    const RequestId id = *harness.engine().submit(std::move(request));
    const RequestId neighbour_id = *harness.engine().submit(recorder.attach(neighbour));
    harness.engine().run_until_idle();
    EXPECT_EQ(record.num_calls, 1);
    expect_prompt_logprobs(options, prompt, 0, record.entries);
    const Completion completion = recorder.completion(id);
    EXPECT_EQ(completion.reason, FinishReason::kLength);
    EXPECT_EQ(completion.num_generated_tokens, 0);
    EXPECT_TRUE(recorder.stream(id).tokens.empty());
    EXPECT_EQ(recorder.stream(neighbour_id).tokens,
              reference_greedy(options, iota_prompt(6, 2), 20));
    harness.expect_all_blocks_free_or_cached();
  }
}

TEST(PromptLogprobsTest, AOneTokenPromptGetsAnEmptyCall) {
  EngineHarness harness(HarnessOptions{});
  Recorder recorder;
  Request request = greedy_request({9}, 2);
  request.prompt_logprobs = true;
  PromptLogprobsRecord record;
  recorder.attach(request);
  record_prompt_logprobs(request, record);
  *harness.engine().submit(std::move(request));
  harness.engine().run_until_idle();
  EXPECT_EQ(record.num_calls, 1);
  EXPECT_TRUE(record.entries.empty());
}

TEST(PromptLogprobsTest, APromptOnlyScoredMayFillTheContext) {
  HarnessOptions options;
  options.max_context_tokens = 40;
  EngineHarness harness(options);
  const std::vector<int32_t> prompt = iota_prompt(40, 4);
  EXPECT_FALSE(harness.engine().submit(greedy_request(prompt, 1)).ok());
  Recorder recorder;
  Request request = greedy_request(prompt, 0);
  request.prompt_logprobs = true;
  PromptLogprobsRecord record;
  recorder.attach(request);
  record_prompt_logprobs(request, record);
  const RequestId id = *harness.engine().submit(std::move(request));
  harness.engine().run_until_idle();
  EXPECT_EQ(recorder.completion(id).reason, FinishReason::kLength) << recorder.completion(id).error;
  expect_prompt_logprobs(options, prompt, 0, record.entries);
  harness.expect_all_blocks_free_or_cached();
}

TEST(PromptLogprobsTest, SubmitRejectsMaxTokensZeroWithoutPromptLogprobs) {
  EngineHarness harness(HarnessOptions{});
  const Result<RequestId> result = harness.engine().submit(greedy_request({1, 2}, 0));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
}

// Test-only: allows exactly `allowed`, in order, then must end. With `allow_nothing`, its mask
// leaves no token at all.
class FixedSequenceConstraint final : public TokenConstraint {
 public:
  explicit FixedSequenceConstraint(std::vector<int32_t> allowed, bool allow_nothing = false)
      : allowed_(std::move(allowed)), allow_nothing_(allow_nothing) {}

  void mask_logits(std::span<float> logits) override {
    for (size_t token = 0; token < logits.size(); ++token) {
      if (allow_nothing_ || next_ >= allowed_.size() ||
          static_cast<int32_t>(token) != allowed_[next_]) {
        logits[token] = -INFINITY;
      }
    }
  }
  Status accept(int32_t token) override {
    if (next_ >= allowed_.size() || token != allowed_[next_]) {
      return invalid_argument("token {} is not allowed here", token);
    }
    ++next_;
    return Status();
  }
  bool must_end() const override { return next_ == allowed_.size(); }
  std::unique_ptr<TokenConstraint> clone() const override {
    return std::make_unique<FixedSequenceConstraint>(*this);
  }
  size_t position() const { return next_; }

 private:
  std::vector<int32_t> allowed_;
  bool allow_nothing_ = false;
  size_t next_ = 0;
};

TEST(ConstraintTest, SampledOutputIsAlwaysTheAllowedSequenceThenStops) {
  EngineHarness harness(HarnessOptions{});
  const std::vector<int32_t> allowed = {3, 3, 40, 7, 12, 0, 63};
  Recorder recorder;
  std::vector<RequestId> ids;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    Request request = greedy_request(iota_prompt(6, static_cast<int32_t>(seed)), 30);
    request.sampling.temperature = seed % 4 == 0 ? 0.0f : 1.0f;
    request.sampling.seed = seed;
    request.sampling.presence_penalty = 2.0f;       // repeated tokens stay allowed
    request.sampling.logit_bias = {{40, -100.0f}};  // and so does a banned one the mask keeps
    request.logprobs = 0;
    request.constraint = std::make_unique<FixedSequenceConstraint>(allowed);
    ids.push_back(*harness.engine().submit(recorder.attach(request)));
  }
  harness.engine().run_until_idle();
  recorder.expect_each_finished_once(ids);
  for (RequestId id : ids) {
    SCOPED_TRACE(id.value());
    EXPECT_EQ(recorder.stream(id).tokens, allowed);
    EXPECT_EQ(recorder.stream(id).text, testing::toy_decode(allowed));
    const Completion completion = recorder.completion(id);
    EXPECT_EQ(completion.reason, FinishReason::kStop);
    EXPECT_FALSE(completion.stop_token.has_value());
    // Logprobs stay the model's: finite, not the masked row's 0.
    ASSERT_EQ(recorder.stream(id).logprobs.size(), allowed.size());
    EXPECT_LT(recorder.stream(id).logprobs[0].logprob, -0.01);
  }
  harness.expect_all_blocks_free_or_cached();
}

TEST(ConstraintTest, AMaskWithoutAnyTokenEndsTheRequestWithAnError) {
  EngineHarness harness(HarnessOptions{});
  Recorder recorder;
  Request request = greedy_request(iota_prompt(6), 8);
  request.constraint = std::make_unique<FixedSequenceConstraint>(std::vector<int32_t>{1}, true);
  Request neighbour = greedy_request(iota_prompt(6), 8);
  const RequestId id = *harness.engine().submit(recorder.attach(request));
  const RequestId neighbour_id = *harness.engine().submit(recorder.attach(neighbour));
  harness.engine().run_until_idle();
  const Completion completion = recorder.completion(id);
  EXPECT_EQ(completion.reason, FinishReason::kError);
  EXPECT_NE(completion.error.message().find("constraint"), std::string::npos) << completion.error;
  EXPECT_EQ(recorder.completion(neighbour_id).reason, FinishReason::kLength);
  harness.expect_all_blocks_free_or_cached();
}

TEST(ConstraintTest, CopyingARequestClonesItsConstraint) {
  Request request;
  auto owned = std::make_unique<FixedSequenceConstraint>(std::vector<int32_t>{4, 5});
  ASSERT_TRUE(owned->accept(4).ok());
  request.constraint = std::move(owned);
  const Request copy = request;
  ASSERT_TRUE(copy.constraint);
  EXPECT_NE(copy.constraint.get(), request.constraint.get());
  EXPECT_EQ(static_cast<const FixedSequenceConstraint&>(*copy.constraint).position(), 1u);
  EXPECT_TRUE(copy.constraint->accept(5).ok());
  EXPECT_TRUE(copy.constraint->must_end());
  EXPECT_FALSE(request.constraint->must_end());
}

TEST(ChoicesTest, GreedyChoicesAreIdenticalAndEqualTheReference) {
  HarnessOptions options;
  EngineHarness harness(options);
  Recorder recorder;
  Request request = greedy_request(iota_prompt(21), 14);
  request.num_choices = 3;
  request.logprobs = 2;
  const RequestId id = *harness.engine().submit(recorder.attach(request));
  harness.engine().run_until_idle();
  const RequestId ids[] = {id};
  const int32_t choices[] = {3};
  recorder.expect_each_finished_once(ids, choices);
  const std::vector<int32_t> expected = reference_greedy(options, iota_prompt(21), 14);
  for (int32_t choice = 0; choice < 3; ++choice) {
    SCOPED_TRACE(choice);
    EXPECT_EQ(recorder.stream(id, choice).tokens, expected);
    EXPECT_EQ(recorder.stream(id, choice).text, testing::toy_decode(expected));
    const Completion completion = recorder.completion(id, choice);
    EXPECT_EQ(completion.choice, choice);
    EXPECT_EQ(completion.reason, FinishReason::kLength);
    EXPECT_EQ(completion.num_prompt_tokens, 21);
    ASSERT_TRUE(completion.cumulative_logprob.has_value());
    EXPECT_DOUBLE_EQ(*completion.cumulative_logprob,
                     *recorder.completion(id, 0).cumulative_logprob);
  }
  // The prompt ran once: 21 prefill tokens, then 13 decodes per choice.
  EXPECT_EQ(harness.engine().stats().prefill_tokens, 21);
  EXPECT_EQ(harness.engine().stats().decode_tokens, 3 * 13);
  EXPECT_EQ(harness.engine().stats().requests_submitted, 3);
  EXPECT_EQ(harness.engine().stats().requests_finished, 3);
  harness.expect_all_blocks_free_or_cached();
}

TEST(ChoicesTest, SeededChoiceZeroEqualsTheSingleChoiceRunAndChoicesShareTheirPromptBlocks) {
  HarnessOptions options;
  EngineHarness harness(options);
  Recorder recorder;
  auto sampled = [&](int32_t num_choices) {
    Request request = greedy_request(iota_prompt(21, 3), 24);
    request.sampling.temperature = 1.0f;
    request.sampling.seed = 1234;
    request.sampling.frequency_penalty = 0.5f;
    request.num_choices = num_choices;
    return request;
  };
  Request single = sampled(1);
  const RequestId single_id = *harness.engine().submit(recorder.attach(single));
  harness.engine().run_until_idle();
  Request many = sampled(3);
  const RequestId id = *harness.engine().submit(recorder.attach(many));
  // Once the prompt's prefill completed, the three choices hold its blocks together.
  int64_t most_shared = 0;
  while (harness.engine().has_unfinished_requests()) {
    harness.engine().step();
    harness.engine().check_invariants();
    most_shared = std::max(most_shared, harness.block_manager().counts().shared);
    if (harness.engine().has_unfinished_requests()) {
      EXPECT_EQ(harness.engine().stats().kv_shared_blocks, harness.block_manager().counts().shared);
    }
  }
  EXPECT_GE(most_shared, 2);  // two full prompt blocks at least (block size 8, 21 tokens)
  EXPECT_EQ(recorder.stream(id, 0).tokens, recorder.stream(single_id).tokens);
  EXPECT_NE(recorder.stream(id, 1).tokens, recorder.stream(id, 0).tokens);
  EXPECT_NE(recorder.stream(id, 2).tokens, recorder.stream(id, 1).tokens);
  // Reproducible: the same request again gives the same three choices.
  Request again = sampled(3);
  const RequestId again_id = *harness.engine().submit(recorder.attach(again));
  harness.engine().run_until_idle();
  for (int32_t choice = 0; choice < 3; ++choice) {
    EXPECT_EQ(recorder.stream(again_id, choice).tokens, recorder.stream(id, choice).tokens);
  }
  harness.expect_all_blocks_free_or_cached();
}

TEST(ChoicesTest, CancellingEndsEveryChoiceBeforeAndAfterTheFork) {
  HarnessOptions options;
  options.scheduler.prefill_chunk_size = 4;  // the 30-token prompt takes several steps
  EngineHarness harness(options);
  Recorder recorder;
  Request early = greedy_request(iota_prompt(30), 40);
  early.num_choices = 4;
  Request late = greedy_request(iota_prompt(30, 2), 40);
  late.num_choices = 2;
  const RequestId early_id = *harness.engine().submit(recorder.attach(early));
  const RequestId late_id = *harness.engine().submit(recorder.attach(late));
  harness.engine().step();
  harness.engine().cancel(early_id);  // still prefilling: choices 1-3 never forked
  while (recorder.stream(late_id, 1).tokens.size() < 3) harness.engine().step();
  harness.engine().cancel(late_id);
  harness.engine().run_until_idle();
  const RequestId ids[] = {early_id, late_id};
  const int32_t choices[] = {4, 2};
  recorder.expect_each_finished_once(ids, choices);
  for (int32_t choice = 0; choice < 4; ++choice) {
    EXPECT_EQ(recorder.completion(early_id, choice).reason, FinishReason::kCancelled);
    EXPECT_TRUE(recorder.stream(early_id, choice).tokens.empty());
  }
  for (int32_t choice = 0; choice < 2; ++choice) {
    EXPECT_EQ(recorder.completion(late_id, choice).reason, FinishReason::kCancelled);
  }
  harness.expect_all_blocks_free_or_cached();
}

TEST(ChoicesTest, EachChoiceHasItsOwnConstraint) {
  EngineHarness harness(HarnessOptions{});
  Recorder recorder;
  const std::vector<int32_t> allowed = {9, 8, 7, 9};
  Request request = greedy_request(iota_prompt(10), 20);
  request.sampling.temperature = 1.0f;
  request.num_choices = 5;
  request.constraint = std::make_unique<FixedSequenceConstraint>(allowed);
  const RequestId id = *harness.engine().submit(recorder.attach(request));
  harness.engine().run_until_idle();
  for (int32_t choice = 0; choice < 5; ++choice) {
    EXPECT_EQ(recorder.stream(id, choice).tokens, allowed) << choice;
    EXPECT_EQ(recorder.completion(id, choice).reason, FinishReason::kStop);
  }
}

TEST(ChoicesTest, PromptLogprobsComeOnceForAllChoices) {
  HarnessOptions options;
  EngineHarness harness(options);
  Recorder recorder;
  const std::vector<int32_t> prompt = iota_prompt(12);
  Request request = greedy_request(prompt, 0);
  request.num_choices = 2;
  request.prompt_logprobs = true;
  PromptLogprobsRecord record;
  recorder.attach(request);
  record_prompt_logprobs(request, record);
  const RequestId id = *harness.engine().submit(std::move(request));
  harness.engine().run_until_idle();
  EXPECT_EQ(record.num_calls, 1);
  expect_prompt_logprobs(options, prompt, 0, record.entries);
  const RequestId ids[] = {id};
  const int32_t choices[] = {2};
  recorder.expect_each_finished_once(ids, choices);
  EXPECT_EQ(recorder.completion(id, 1).reason, FinishReason::kLength);
}

TEST(ChoicesTest, SubmitRejectsChoicesBeyondTheRunningLimit) {
  HarnessOptions options;
  options.scheduler.max_num_sequences = 4;
  EngineHarness harness(options);
  for (int32_t bad : {0, 5}) {
    Request request = greedy_request({1, 2}, 4);
    request.num_choices = bad;
    const Result<RequestId> result = harness.engine().submit(std::move(request));
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace folio::engine
