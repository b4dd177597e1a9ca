// Engine behaviour with the toy model: outputs against the independent reference, stop rules,
// streaming, cancellation, bad input, failures, prefix caching, adapters and metrics.
#include <gtest/gtest.h>

#include "engine_test_util.h"

namespace folio::engine {
namespace {

using testing::EngineHarness;
using testing::greedy_request;
using testing::HarnessOptions;
using testing::iota_prompt;
using testing::Recorder;
using testing::reference_greedy;
using testing::toy_decode;

TEST(EngineTest, GreedyRequestMatchesTheReferenceAndStreamsEveryTokenOnce) {
  EngineHarness harness(HarnessOptions{});
  Recorder recorder;
  Request request = greedy_request(iota_prompt(13), 20);
  const RequestId id = *harness.engine().submit(recorder.attach(request));
  harness.engine().run_until_idle();
  const RequestId ids[] = {id};
  recorder.expect_each_finished_once(ids);
  const Recorder::Stream stream = recorder.stream(id);
  EXPECT_EQ(stream.tokens, reference_greedy(harness.options(), iota_prompt(13), 20));
  EXPECT_EQ(stream.text, toy_decode(stream.tokens));
  const Completion completion = recorder.completion(id);
  EXPECT_EQ(completion.reason, FinishReason::kLength);
  EXPECT_EQ(completion.num_prompt_tokens, 13);
  EXPECT_EQ(completion.num_generated_tokens, 20);
  harness.expect_all_blocks_free_or_cached();
}

TEST(EngineTest, EndsAtTheContextLimitWithLength) {
  HarnessOptions options;
  options.max_context_tokens = 24;
  EngineHarness harness(options);
  Recorder recorder;
  Request request = greedy_request(iota_prompt(20), 100);
  const RequestId id = *harness.engine().submit(recorder.attach(request));
  harness.engine().run_until_idle();
  EXPECT_EQ(recorder.stream(id).tokens.size(), 4u);
  EXPECT_EQ(recorder.completion(id).reason, FinishReason::kLength);
  harness.expect_all_blocks_free_or_cached();
}

TEST(EngineTest, EosStopsGenerationUnlessIgnored) {
  HarnessOptions options;
  // Make the EOS the reference's fourth token, so it is certain to come up.
  const std::vector<int32_t> reference = reference_greedy(options, iota_prompt(9), 8);
  options.eos_token = reference[3];
  const auto first_eos = std::find(reference.begin(), reference.end(), reference[3]);
  EngineHarness harness(options);
  Recorder recorder;
  Request stops = greedy_request(iota_prompt(9), 8);
  Request ignores = greedy_request(iota_prompt(9), 8);
  ignores.ignore_eos = true;
  const RequestId stops_id = *harness.engine().submit(recorder.attach(stops));
  const RequestId ignores_id = *harness.engine().submit(recorder.attach(ignores));
  harness.engine().run_until_idle();
  const std::vector<int32_t> expected(reference.begin(), first_eos + 1);
  EXPECT_EQ(recorder.stream(stops_id).tokens, expected);
  EXPECT_EQ(recorder.completion(stops_id).reason, FinishReason::kStop);
  EXPECT_EQ(recorder.completion(stops_id).stop_token, reference[3]);
  // The stop token is reported, its text is not.
  EXPECT_EQ(recorder.stream(stops_id).text,
            toy_decode(std::span<const int32_t>(expected).first(expected.size() - 1)));
  EXPECT_EQ(recorder.stream(ignores_id).tokens, reference);
  EXPECT_EQ(recorder.completion(ignores_id).reason, FinishReason::kLength);
}

TEST(EngineTest, StopTokenIdsStopGeneration) {
  EngineHarness harness(HarnessOptions{});
  const std::vector<int32_t> reference = reference_greedy(harness.options(), iota_prompt(5), 12);
  Recorder recorder;
  Request request = greedy_request(iota_prompt(5), 12);
  request.stop_token_ids = {reference[6]};
  const RequestId id = *harness.engine().submit(recorder.attach(request));
  harness.engine().run_until_idle();
  const auto stop = std::find(reference.begin(), reference.end(), reference[6]);
  EXPECT_EQ(recorder.stream(id).tokens, std::vector<int32_t>(reference.begin(), stop + 1));
  EXPECT_EQ(recorder.completion(id).reason, FinishReason::kStop);
}

TEST(EngineTest, StopStringEndsTheTextRightBeforeIt) {
  EngineHarness harness(HarnessOptions{});
  const std::vector<int32_t> reference = reference_greedy(harness.options(), iota_prompt(7), 24);
  const std::string full_text = toy_decode(reference);
  // A stop string that spans token boundaries somewhere in the middle of the output.
  const std::string stop = full_text.substr(9, 3);
  const size_t cut = full_text.find(stop);
  Recorder recorder;
  Request request = greedy_request(iota_prompt(7), 24);
  request.stop_strings = {"not-in-the-output", stop};
  const RequestId id = *harness.engine().submit(recorder.attach(request));
  harness.engine().run_until_idle();
  const Recorder::Stream stream = recorder.stream(id);
  EXPECT_EQ(stream.text, full_text.substr(0, cut));
  EXPECT_EQ(recorder.completion(id).reason, FinishReason::kStop);
  EXPECT_EQ(recorder.completion(id).stop_string, stop);
  // Generation ended with the token that completed the stop string.
  EXPECT_GE(toy_decode(stream.tokens).size(), cut + stop.size());
  EXPECT_LT(
      toy_decode(std::span<const int32_t>(stream.tokens).first(stream.tokens.size() - 1)).size(),
      cut + stop.size());
  harness.expect_all_blocks_free_or_cached();
}

TEST(EngineTest, HeldBackTextIsReleasedWhenTheRequestEndsForAnotherReason) {
  EngineHarness harness(HarnessOptions{});
  const std::vector<int32_t> reference = reference_greedy(harness.options(), iota_prompt(7), 6);
  const std::string full_text = toy_decode(reference);
  Recorder recorder;
  Request request = greedy_request(iota_prompt(7), 6);
  // The output's last letter followed by something never generated: always held, never matched.
  request.stop_strings = {full_text.substr(full_text.size() - 1) + "#"};
  const RequestId id = *harness.engine().submit(recorder.attach(request));
  harness.engine().run_until_idle();
  EXPECT_EQ(recorder.stream(id).text, full_text);
  EXPECT_EQ(recorder.completion(id).reason, FinishReason::kLength);
}

TEST(EngineTest, RejectsBadRequestsWithoutQueueingThem) {
  HarnessOptions options;
  options.with_text = false;
  EngineHarness harness(options);
  auto expect_rejected = [&](Request request, std::string_view why) {
    Result<RequestId> result = harness.engine().submit(std::move(request));
    ASSERT_FALSE(result.ok()) << why;
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument) << why;
  };
  expect_rejected(greedy_request({}, 4), "empty prompt");
  expect_rejected(greedy_request({1, 64}, 4), "token outside the vocabulary");
  expect_rejected(greedy_request({1, -1}, 4), "negative token");
  expect_rejected(greedy_request(std::vector<int32_t>(128, 1), 4), "prompt fills the context");
  expect_rejected(greedy_request({1}, 0), "max_tokens 0");
  Request bad_sampling = greedy_request({1}, 4);
  bad_sampling.sampling.top_p = 0.0f;
  expect_rejected(bad_sampling, "top_p 0");
  Request bad_stop_token = greedy_request({1}, 4);
  bad_stop_token.stop_token_ids = {99};
  expect_rejected(bad_stop_token, "stop token outside the vocabulary");
  Request stop_without_text = greedy_request({1}, 4);
  stop_without_text.stop_strings = {"ab"};
  expect_rejected(stop_without_text, "stop strings without a text decoder");
  Request adapter = greedy_request({1}, 4);
  adapter.adapter_id = 3;
  expect_rejected(adapter, "unknown adapter");
  EXPECT_FALSE(harness.engine().has_unfinished_requests());
  EXPECT_EQ(harness.engine().stats().requests_submitted, 0);
  EXPECT_FALSE(harness.engine().step());
}

TEST(EngineTest, CancellingFreesTheSequenceInTheNextStep) {
  EngineHarness harness(HarnessOptions{});
  Recorder recorder;
  Request running = greedy_request(iota_prompt(30), 50);
  Request waiting = greedy_request(iota_prompt(10, 3), 50);
  const RequestId running_id = *harness.engine().submit(recorder.attach(running));
  harness.engine().step();  // admits and prefills `running`: its first token
  harness.engine().step();  // its second token
  EXPECT_GT(harness.block_manager().num_sequences(), 0);
  const RequestId waiting_id = *harness.engine().submit(recorder.attach(waiting));
  harness.engine().cancel(running_id);
  harness.engine().cancel(waiting_id);        // cancelled in the same drain that admits it
  harness.engine().cancel(RequestId(12345));  // unknown: ignored
  harness.engine().step();
  EXPECT_EQ(harness.block_manager().num_sequences(), 0);
  EXPECT_FALSE(harness.engine().has_unfinished_requests());
  const RequestId ids[] = {running_id, waiting_id};
  recorder.expect_each_finished_once(ids);
  EXPECT_EQ(recorder.completion(running_id).reason, FinishReason::kCancelled);
  EXPECT_EQ(recorder.completion(running_id).num_generated_tokens, 2);  // prefill, one decode
  EXPECT_EQ(recorder.completion(waiting_id).reason, FinishReason::kCancelled);
  EXPECT_EQ(recorder.completion(waiting_id).num_generated_tokens, 0);
  harness.expect_all_blocks_free_or_cached();
}

TEST(EngineTest, CancelFromInsideATokenCallbackStopsAfterThatToken) {
  EngineHarness harness(HarnessOptions{});
  Recorder recorder;
  Request request = greedy_request(iota_prompt(6), 40);
  recorder.attach(request);
  RequestId id;
  auto record = request.on_token;
  request.on_token = [&](const TokenEvent& event) {
    record(event);
    if (event.index == 4) harness.engine().cancel(event.request);
  };
  id = *harness.engine().submit(std::move(request));
  harness.engine().run_until_idle();
  EXPECT_EQ(recorder.completion(id).reason, FinishReason::kCancelled);
  EXPECT_EQ(recorder.stream(id).tokens.size(), 5u);
}

TEST(EngineTest, RunnerFailureFailsTheStepsRequestsAndTheEngineGoesOn) {
  EngineHarness harness(HarnessOptions{});
  Recorder recorder;
  Request first = greedy_request(iota_prompt(8), 5);
  const RequestId first_id = *harness.engine().submit(recorder.attach(first));
  harness.runner().set_step_observer(
      [](const ir::StepBatch&) { return unavailable("injected device failure"); });
  harness.engine().step();
  ASSERT_TRUE(recorder.finished(first_id));
  const Completion failed = recorder.completion(first_id);
  EXPECT_EQ(failed.reason, FinishReason::kError);
  EXPECT_EQ(failed.error.code(), StatusCode::kUnavailable);
  EXPECT_NE(failed.error.message().find("injected device failure"), std::string::npos);
  harness.runner().set_step_observer(nullptr);
  Request second = greedy_request(iota_prompt(8), 5);
  const RequestId second_id = *harness.engine().submit(recorder.attach(second));
  harness.engine().run_until_idle();
  EXPECT_EQ(recorder.stream(second_id).tokens,
            reference_greedy(harness.options(), iota_prompt(8), 5));
  harness.expect_all_blocks_free_or_cached();
}

TEST(EngineTest, SharedPromptPrefixIsServedFromTheCache) {
  EngineHarness harness(HarnessOptions{});
  Recorder recorder;
  Request first = greedy_request(iota_prompt(21), 3);
  const RequestId first_id = *harness.engine().submit(recorder.attach(first));
  harness.engine().run_until_idle();
  Request second = greedy_request(iota_prompt(21), 3);
  const RequestId second_id = *harness.engine().submit(recorder.attach(second));
  harness.engine().run_until_idle();
  EXPECT_EQ(recorder.completion(first_id).num_cached_prompt_tokens, 0);
  // The two full blocks of 8 (the last prompt token's logits must be computed anyway).
  EXPECT_EQ(recorder.completion(second_id).num_cached_prompt_tokens, 16);
  EXPECT_EQ(recorder.stream(second_id).tokens, recorder.stream(first_id).tokens);
  EXPECT_GT(harness.engine().stats().prefix_cache_hit_blocks, 0);
}

TEST(EngineTest, AdaptersNeitherShareCacheNorOutput) {
  HarnessOptions options;
  options.num_adapters = 2;
  EngineHarness harness(options);
  Recorder recorder;
  Request base = greedy_request(iota_prompt(16), 6);
  const RequestId base_id = *harness.engine().submit(recorder.attach(base));
  harness.engine().run_until_idle();
  Request adapted = greedy_request(iota_prompt(16), 6);
  adapted.adapter_id = 1;
  const RequestId adapted_id = *harness.engine().submit(recorder.attach(adapted));
  harness.engine().run_until_idle();
  EXPECT_EQ(recorder.completion(adapted_id).num_cached_prompt_tokens, 0);
  EXPECT_EQ(recorder.stream(adapted_id).tokens,
            reference_greedy(options, iota_prompt(16), 6, {}, /*adapter_id=*/1));
  EXPECT_NE(recorder.stream(adapted_id).tokens, recorder.stream(base_id).tokens);
}

TEST(EngineTest, SeededSamplingIsReproducibleAndSeedsDiffer) {
  EngineHarness harness(HarnessOptions{});
  Recorder recorder;
  std::vector<RequestId> ids;
  for (uint64_t seed : {11u, 11u, 12u}) {
    Request request = greedy_request(iota_prompt(10), 30);
    request.sampling.temperature = 1.0f;
    request.sampling.seed = seed;
    ids.push_back(*harness.engine().submit(recorder.attach(request)));
  }
  harness.engine().run_until_idle();
  EXPECT_EQ(recorder.stream(ids[0]).tokens, recorder.stream(ids[1]).tokens);
  EXPECT_NE(recorder.stream(ids[0]).tokens, recorder.stream(ids[2]).tokens);
}

TEST(EngineTest, StopEndsUnfinishedRequestsWithAnErrorAndRefusesNewOnes) {
  EngineHarness harness(HarnessOptions{});
  Recorder recorder;
  Request request = greedy_request(iota_prompt(10), 50);
  const RequestId id = *harness.engine().submit(recorder.attach(request));
  harness.engine().step();
  harness.engine().stop();
  EXPECT_EQ(recorder.completion(id).reason, FinishReason::kError);
  EXPECT_EQ(recorder.completion(id).error.code(), StatusCode::kUnavailable);
  Result<RequestId> late = harness.engine().submit(greedy_request(iota_prompt(3), 2));
  EXPECT_EQ(late.status().code(), StatusCode::kFailedPrecondition);
  harness.expect_all_blocks_free_or_cached();
}

TEST(EngineTest, TimingAndMetricsFollowTheInjectedClock) {
  EngineHarness harness(HarnessOptions{});
  Recorder recorder;
  Request request = greedy_request(iota_prompt(10), 3);
  const RequestId id = *harness.engine().submit(recorder.attach(request));
  harness.clock().advance(std::chrono::milliseconds(5));
  harness.engine().step();  // prefill and first token at t = 5 ms
  harness.clock().advance(std::chrono::milliseconds(2));
  harness.engine().step();
  harness.clock().advance(std::chrono::milliseconds(4));
  harness.engine().step();
  const RequestTiming timing = recorder.completion(id).timing;
  EXPECT_EQ(timing.queue_time, std::chrono::milliseconds(5));
  EXPECT_EQ(timing.time_to_first_token, std::chrono::milliseconds(5));
  EXPECT_EQ(timing.time_per_output_token, std::chrono::milliseconds(3));
  EXPECT_EQ(timing.total_time, std::chrono::milliseconds(11));
  const EngineStats stats = harness.engine().stats();
  EXPECT_EQ(stats.steps, 3);
  EXPECT_EQ(stats.prefill_tokens, 10);
  EXPECT_EQ(stats.decode_tokens, 2);
  EXPECT_EQ(stats.generated_tokens, 3);
  EXPECT_EQ(stats.requests_finished, 1);
  const std::string text = harness.registry().render();
  EXPECT_NE(text.find("folio_engine_requests_finished_total{reason=\"length\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("folio_engine_time_to_first_token_seconds_sum 0.005"), std::string::npos);
  EXPECT_NE(text.find("folio_engine_requests{state=\"running\"} 0"), std::string::npos);
}

}  // namespace
}  // namespace folio::engine
