// Recovery of the step runner (engine.h "Recovery", step_runner.h): a runner that loses KV at
// chosen or random steps (FaultInjectingStepRunner: garbage over the KV cache, then kUnavailable)
// must leave every request's streamed tokens exactly as an uninterrupted run's, nothing lost and
// nothing duplicated, with each kind of loss (none, a stage's, all of it), with the toy model
// (whose every step checks the KV it reads) and with the real model (bit-equal tokens, which is
// what shows that replay, chunked differently from the original steps, rewrites identical KV).
// Also: the cached prefix blocks are never hit after a recovery, the per-request recovery
// limit, an unavailable runner (every request ends, submissions refused, service back after a
// recovery), health() and the recovery metrics. The loop thread's side is in
// engine_recovery_concurrency_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "folio/engine/model_engine.h"
#include "folio/engine/model_step_runner.h"
#include "folio/model/llama_model_file.h"

namespace folio::engine {
namespace {

using testing::EngineHarness;
using testing::FaultInjectingStepRunner;
using testing::greedy_request;
using testing::HarnessOptions;
using testing::iota_prompt;
using testing::random_prompt;
using testing::Recorder;
using testing::reference_greedy;
using LostKv = RunnerRecovery::LostKv;
using Fault = FaultInjectingStepRunner::Fault;
using Call = FaultInjectingStepRunner::Call;

using Spec = testing::RequestSpec;
using testing::to_request;

// `count` requests over a vocabulary of `vocab` tokens (from `first_token` up): prompts of 4
// to 40 tokens, a third behind a shared prefix of 19 tokens (prefix cache hits), greedy and
// seeded sampling with every knob, a few of 2 or 3 choices, a few with logprobs and prompt
// logprobs.
std::vector<Spec> workload(uint64_t seed, int32_t count, int32_t vocab, int32_t first_token) {
  uint64_t state = seed;
  std::vector<int32_t> shared_prefix = random_prompt(state, 19, vocab);
  for (int32_t& token : shared_prefix) token += first_token;
  std::vector<Spec> specs;
  for (int32_t index = 0; index < count; ++index) {
    Spec spec;
    spec.ignore_eos = true;
    spec.prompt = random_prompt(state, static_cast<int32_t>(4 + (state >> 40) % 37), vocab);
    for (int32_t& token : spec.prompt) token += first_token;
    if (index % 3 == 0) {
      spec.prompt.insert(spec.prompt.begin(), shared_prefix.begin(), shared_prefix.end());
      spec.prompt.resize(std::min<size_t>(spec.prompt.size(), 48));
    }
    spec.max_tokens = static_cast<int32_t>(4 + (state >> 20) % 27);
    spec.sampling.temperature = 0.0f;
    if (index % 4 == 1 || index % 5 == 3) {
      spec.sampling.temperature = 0.8f;
      spec.sampling.top_k = 20;
      spec.sampling.top_p = 0.9f;
      spec.sampling.repetition_penalty = 1.1f;
      spec.sampling.presence_penalty = 0.3f;
      spec.sampling.seed = 1000 + index;
    }
    if (index % 5 == 3) spec.num_choices = 2 + index % 2;
    if (index % 7 == 2) {
      spec.prompt_logprobs = true;
      spec.logprobs = 2;
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

// Logprobs as plain numbers (token, logprob, then each alternative's token and logprob), so
// runs compare with ==.
std::vector<double> flatten(std::span<const TokenLogprobs> entries) {
  std::vector<double> values;
  for (const TokenLogprobs& entry : entries) {
    values.push_back(entry.token);
    values.push_back(entry.logprob);
    for (const TopLogprob& top : entry.top) {
      values.push_back(top.token);
      values.push_back(top.logprob);
    }
  }
  return values;
}

// What a run streamed: per request (in submission order), per choice, the tokens, the text, the
// logprobs (the prompt's, then the tokens') and the finish reason.
struct Outcome {
  std::vector<std::vector<std::vector<int32_t>>> tokens;
  std::vector<std::vector<std::string>> texts;
  std::vector<std::vector<std::vector<double>>> logprobs;
  std::vector<std::vector<FinishReason>> reasons;
  EngineStats stats;
};

// Submits the specs, `per_step` before each step (0: all before the first), steps to the end
// checking the engine's invariants after each step, and checks every choice ended once without
// a contract violation. `recorder` must outlive the engine.
Outcome drive(Engine& engine, Recorder& recorder, std::span<const Spec> specs, int32_t per_step) {
  std::vector<RequestId> ids;
  std::vector<int32_t> choices;
  size_t submitted = 0;
  const auto submit = [&](size_t count) {
    for (; count > 0 && submitted < specs.size(); --count) {
      Request request = to_request(specs[submitted]);
      Result<RequestId> id = engine.submit(recorder.attach(request));
      EXPECT_TRUE(id.ok()) << id.status();
      if (id.ok()) {
        ids.push_back(*id);
        choices.push_back(specs[submitted].num_choices);
      }
      ++submitted;
    }
  };
  if (per_step == 0) submit(specs.size());
  int64_t steps = 0;
  while (submitted < specs.size() || engine.has_unfinished_requests()) {
    submit(static_cast<size_t>(per_step));
    engine.step();
    engine.check_invariants();
    if (++steps > 20000) {
      ADD_FAILURE() << "no end after " << steps << " steps";
      break;
    }
  }
  recorder.expect_each_finished_once(ids, choices);
  Outcome outcome;
  for (size_t index = 0; index < ids.size(); ++index) {
    outcome.tokens.emplace_back();
    outcome.texts.emplace_back();
    outcome.logprobs.emplace_back();
    outcome.reasons.emplace_back();
    for (int32_t choice = 0; choice < choices[index]; ++choice) {
      const Recorder::Stream stream = recorder.stream(ids[index], choice);
      outcome.tokens.back().push_back(stream.tokens);
      outcome.texts.back().push_back(stream.text);
      std::vector<double> logprobs = flatten(stream.prompt_logprobs);
      const std::vector<double> token_logprobs = flatten(stream.logprobs);
      logprobs.insert(logprobs.end(), token_logprobs.begin(), token_logprobs.end());
      outcome.logprobs.back().push_back(std::move(logprobs));
      if (specs[index].prompt_logprobs && choice == 0) {
        EXPECT_EQ(stream.num_prompt_logprobs_calls, 1) << "request " << index;
        EXPECT_EQ(stream.prompt_logprobs.size(), specs[index].prompt.size() - 1);
      }
      if (specs[index].logprobs.has_value()) {
        EXPECT_EQ(stream.logprobs.size(), stream.tokens.size()) << "request " << index;
      }
      outcome.reasons.back().push_back(
          stream.completions.empty() ? FinishReason::kError : stream.completions.front().reason);
      if (!stream.completions.empty()) {
        EXPECT_NE(stream.completions.front().reason, FinishReason::kError)
            << "request " << index << " choice " << choice << ": "
            << stream.completions.front().error;
      }
    }
  }
  outcome.stats = engine.stats();
  return outcome;
}

void expect_same_streams(const Outcome& faulted, const Outcome& reference,
                         const std::string& context) {
  ASSERT_EQ(faulted.tokens.size(), reference.tokens.size()) << context;
  for (size_t index = 0; index < reference.tokens.size(); ++index) {
    EXPECT_EQ(faulted.tokens[index], reference.tokens[index]) << context << ", request " << index;
    EXPECT_EQ(faulted.texts[index], reference.texts[index]) << context << ", request " << index;
    EXPECT_EQ(faulted.logprobs[index], reference.logprobs[index])
        << context << ", request " << index;
    EXPECT_EQ(faulted.reasons[index], reference.reasons[index]) << context << ", request " << index;
  }
}

// Faults at random run() calls (one in `one_in`) and replay() calls (one in 8), of random kinds,
// at most `max_faults` of them.
FaultInjectingStepRunner::FaultPlan random_faults(uint64_t seed, int32_t one_in, int32_t max_faults,
                                                  int32_t num_layers) {
  auto random = std::make_shared<SplitMix64>(seed);
  auto left = std::make_shared<int32_t>(max_faults);
  return [=](Call call, int64_t, const ir::StepBatch&) -> std::optional<Fault> {
    if (*left == 0 ||
        random->next() % static_cast<uint64_t>(call == Call::kRun ? one_in : 8) != 0) {
      return std::nullopt;
    }
    --*left;
    Fault fault;
    fault.run_first = random->next() % 2 == 0;
    switch (random->next() % 3) {
      case 0:
        fault.loss = RunnerRecovery{LostKv::kNone, -1};
        break;
      case 1: {
        // Stage s of a pipeline of one stage per layer: layers [0, s] lose their KV.
        const auto stage = static_cast<int32_t>(random->next() % static_cast<uint64_t>(num_layers));
        fault.loss = RunnerRecovery{LostKv::kStageKv, stage};
        fault.first_layer = random->next() % 2 == 0 ? 0 : stage;
        fault.end_layer = stage + 1;
        break;
      }
      default:
        fault.loss = RunnerRecovery{LostKv::kAllKv, -1};
        break;
    }
    return fault;
  };
}

// --- The toy model.

HarnessOptions toy_options(uint64_t seed) {
  SplitMix64 random(seed);
  HarnessOptions options;
  testing::randomize_batching(options.scheduler, random, 12, 48);
  // Room for a request of three choices.
  options.scheduler.max_num_sequences = std::max(options.scheduler.max_num_sequences, 3);
  options.scheduler.max_num_batched_tokens =
      std::max(options.scheduler.max_num_batched_tokens, options.scheduler.max_num_sequences);
  options.num_pages = static_cast<int32_t>(8 + random.next() % 8);  // 64 to 120 blocks
  if (random.next() % 3 == 0) {
    options.swap_blocks = 64;
    options.scheduler.preemption_mode = PreemptionMode::kSwap;
  }
  options.max_recoveries_per_request = 1000;
  return options;
}

TEST(EngineRecoveryTest, RandomFaultsOfEveryKindLeaveEveryStreamAsAnUninterruptedRun) {
  int64_t faults = 0;
  int64_t replays = 0;
  int64_t recoveries = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    const std::vector<Spec> specs = workload(seed * 7919, 10, 60, 0);
    const int32_t per_step = static_cast<int32_t>(seed % 3);
    HarnessOptions options = toy_options(seed);
    Outcome reference;
    {
      Recorder recorder;
      EngineHarness harness(options);
      reference = drive(harness.engine(), recorder, specs, per_step);
      harness.expect_all_blocks_free_or_cached();
    }
    options.inject_faults = true;
    Recorder recorder;
    EngineHarness harness(options);
    FaultInjectingStepRunner& runner = harness.fault_runner();
    runner.set_fault_plan(random_faults(seed, 6, 12, 1));
    const Outcome faulted = drive(harness.engine(), recorder, specs, per_step);
    harness.expect_all_blocks_free_or_cached();
    expect_same_streams(faulted, reference, fmt::format("seed {}", seed));
    EXPECT_EQ(faulted.stats.recoveries, runner.num_recovers()) << "seed " << seed;
    EXPECT_EQ(faulted.stats.recovery_failures, 0) << "seed " << seed;
    // Each fault is followed by one recover(); a replay fault within the same recovery too.
    EXPECT_EQ(runner.num_recovers(), runner.num_faults()) << "seed " << seed;
    faults += runner.num_faults();
    replays += runner.num_replays();
    recoveries += faulted.stats.recoveries;
  }
  // The test could not fail if no fault had fired.
  EXPECT_GT(faults, 100);
  EXPECT_GT(replays, 100);
  EXPECT_EQ(recoveries, faults);
}

// One fault of `kind` at the 4th run(), after the step ran: the metrics count it exactly. With
// `replay_lost_stages` false a lost stage is recomputed instead, to the same tokens.
void check_one_fault(LostKv kind, bool replay_lost_stages = true) {
  HarnessOptions options;
  options.inject_faults = true;
  options.replay_lost_stages = replay_lost_stages;
  options.scheduler.max_num_batched_tokens = 64;
  options.scheduler.prefill_chunk_size = 8;
  EngineHarness harness(options);
  FaultInjectingStepRunner& runner = harness.fault_runner();
  runner.set_fault_plan([kind](Call call, int64_t index, const ir::StepBatch&) {
    std::optional<Fault> fault;
    if (call == Call::kRun && index == 3) {
      fault.emplace();
      fault->loss = RunnerRecovery{kind, kind == LostKv::kStageKv ? 0 : -1};
      fault->run_first = true;
    }
    return fault;
  });
  Recorder recorder;
  Engine& engine = harness.engine();
  const std::vector<int32_t> prompts[] = {iota_prompt(21, 1), iota_prompt(5, 2),
                                          iota_prompt(13, 3)};
  std::vector<RequestId> ids;
  for (const std::vector<int32_t>& prompt : prompts) {
    Request request = greedy_request(prompt, 12);
    ids.push_back(*engine.submit(recorder.attach(request)));
  }
  engine.run_until_idle();
  recorder.expect_each_finished_once(ids);
  for (size_t index = 0; index < ids.size(); ++index) {
    EXPECT_EQ(recorder.stream(ids[index]).tokens, reference_greedy(options, prompts[index], 12));
  }
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.recoveries, 1);
  EXPECT_EQ(stats.requests_recovered, 3);  // all three run from the first step
  EXPECT_EQ(stats.recovery_failures, 0);
  EXPECT_EQ(stats.recovery_observations, 1);
  // The 4th step's tokens were streamed once: from its second run.
  EXPECT_EQ(stats.generated_tokens, 36);
  EXPECT_EQ(runner.num_replays() > 0, kind == LostKv::kStageKv && replay_lost_stages);
  if (kind == LostKv::kAllKv || !replay_lost_stages) {
    EXPECT_EQ(recorder.completion(ids[0]).num_preemptions, 0);
  }
  harness.expect_all_blocks_free_or_cached();
}

TEST(EngineRecoveryTest, OneLostStageIsReplayedAndCountedOnce) {
  check_one_fault(LostKv::kStageKv);
}
TEST(EngineRecoveryTest, OneLostStageIsRecomputedWhenReplayIsOff) {
  check_one_fault(LostKv::kStageKv, /*replay_lost_stages=*/false);
}
TEST(EngineRecoveryTest, OneLostCacheIsRecomputedAndCountedOnce) {
  check_one_fault(LostKv::kAllKv);
}
TEST(EngineRecoveryTest, OneFaultWithoutLostKvRerunsTheStepAndCountsOnce) {
  check_one_fault(LostKv::kNone);
}

// A finished request's prompt sits in the prefix cache (CACHED blocks); after a recovery of
// `kind` a request with the same prompt must not hit it.
void check_cache_dropped(LostKv kind) {
  HarnessOptions options;
  options.inject_faults = true;
  EngineHarness harness(options);
  Engine& engine = harness.engine();
  FaultInjectingStepRunner& runner = harness.fault_runner();
  Recorder recorder;
  const std::vector<int32_t> cached_prompt = iota_prompt(27, 5);
  Request first = greedy_request(cached_prompt, 3);
  const RequestId first_id = *engine.submit(recorder.attach(first));
  engine.run_until_idle();
  ASSERT_GT(harness.block_manager().counts().cached, 0);
  // The next run() (the other request's first step) fails.
  const int64_t failing_run = runner.num_runs();
  runner.set_fault_plan([&](Call call, int64_t index, const ir::StepBatch&) {
    std::optional<Fault> fault;
    if (call == Call::kRun && index == failing_run) {
      fault.emplace();
      fault->loss = RunnerRecovery{kind, kind == LostKv::kStageKv ? 0 : -1};
    }
    return fault;
  });
  Request other = greedy_request(iota_prompt(9, 40), 3);
  const RequestId other_id = *engine.submit(recorder.attach(other));
  engine.step();
  EXPECT_EQ(harness.block_manager().counts().cached, 0);
  engine.run_until_idle();
  Request again = greedy_request(cached_prompt, 6);
  const RequestId again_id = *engine.submit(recorder.attach(again));
  engine.run_until_idle();
  const RequestId ids[] = {first_id, other_id, again_id};
  recorder.expect_each_finished_once(ids);
  EXPECT_EQ(recorder.completion(again_id).num_cached_prompt_tokens, 0);
  EXPECT_EQ(recorder.stream(again_id).tokens, reference_greedy(options, cached_prompt, 6));
  EXPECT_EQ(recorder.stream(other_id).tokens, reference_greedy(options, iota_prompt(9, 40), 3));
  EXPECT_EQ(engine.stats().recoveries, 1);
  harness.expect_all_blocks_free_or_cached();
}

TEST(EngineRecoveryTest, CachedPrefixIsNeverHitAfterARecoveryWithoutLostKv) {
  check_cache_dropped(LostKv::kNone);
}
TEST(EngineRecoveryTest, CachedPrefixIsNeverHitAfterALostStage) {
  check_cache_dropped(LostKv::kStageKv);
}

TEST(EngineRecoveryTest, ControlTheSamePromptHitsThePrefixCacheWithoutARecovery) {
  HarnessOptions options;
  options.inject_faults = true;
  EngineHarness harness(options);
  Engine& engine = harness.engine();
  Recorder recorder;
  const std::vector<int32_t> cached_prompt = iota_prompt(27, 5);
  Request first = greedy_request(cached_prompt, 3);
  engine.submit(recorder.attach(first)).value();
  engine.run_until_idle();
  Request again = greedy_request(cached_prompt, 6);
  const RequestId again_id = *engine.submit(recorder.attach(again));
  engine.run_until_idle();
  EXPECT_EQ(recorder.completion(again_id).num_cached_prompt_tokens, 24);
}

TEST(EngineRecoveryTest, ARequestPastItsRecoveryLimitEndsWithAClearErrorAndOthersRunOn) {
  HarnessOptions options;
  options.inject_faults = true;
  options.num_adapters = 2;
  options.scheduler.max_num_sequences = 2;
  options.max_recoveries_per_request = 3;
  EngineHarness harness(options);
  Engine& engine = harness.engine();
  FaultInjectingStepRunner& runner = harness.fault_runner();
  // Every step that runs adapter 1 loses a stage.
  runner.set_fault_plan([](Call call, int64_t, const ir::StepBatch& step) {
    std::optional<Fault> fault;
    if (call == Call::kRun &&
        std::find(step.adapter_ids.begin(), step.adapter_ids.end(), 1) != step.adapter_ids.end()) {
      fault.emplace();
      fault->loss = RunnerRecovery{LostKv::kStageKv, 0};
    }
    return fault;
  });
  Recorder recorder;
  std::vector<RequestId> ids;
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t index = 0; index < 4; ++index) {
    prompts.push_back(iota_prompt(6 + index, 3 * index));
    Request request = greedy_request(prompts.back(), 8);
    if (index == 0) request.adapter_id = 1;  // the poisoned one
    ids.push_back(*engine.submit(recorder.attach(request)));
  }
  // The first step runs requests 0 and 1 (two sequences at most); its run fails four times: both
  // end after their 4th recovery. Requests 2 and 3 waited and run on.
  engine.step();
  engine.check_invariants();
  for (int32_t index = 0; index < 2; ++index) {
    ASSERT_TRUE(recorder.finished(ids[index]));
    const Completion completion = recorder.completion(ids[index]);
    EXPECT_EQ(completion.reason, FinishReason::kError);
    EXPECT_EQ(completion.error.code(), StatusCode::kUnavailable);
    EXPECT_EQ(completion.error.message(),
              fmt::format("request {} lost its KV cache in 4 recoveries of the step runner; the "
                          "limit is 3 (max_recoveries_per_request)",
                          ids[index]));
    EXPECT_TRUE(recorder.stream(ids[index]).tokens.empty());
  }
  engine.run_until_idle();
  recorder.expect_each_finished_once(ids);
  for (int32_t index = 2; index < 4; ++index) {
    EXPECT_EQ(recorder.completion(ids[index]).reason, FinishReason::kLength);
    EXPECT_EQ(recorder.stream(ids[index]).tokens, reference_greedy(options, prompts[index], 8));
  }
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.recoveries, 4);
  EXPECT_EQ(stats.requests_recovered, 6);  // both, three times; none lived through the 4th
  EXPECT_EQ(stats.recovery_observations, 4);
  EXPECT_EQ(stats.recovery_failures, 0);
  EXPECT_EQ(runner.num_faults(), 4);
  harness.expect_all_blocks_free_or_cached();
}

TEST(EngineRecoveryTest, UnavailableRunnerEndsEveryRequestRefusesNewOnesAndServesAgainOnceBack) {
  HarnessOptions options;
  options.inject_faults = true;
  options.scheduler.max_num_sequences = 2;
  EngineHarness harness(options);
  Engine& engine = harness.engine();
  FaultInjectingStepRunner& runner = harness.fault_runner();
  runner.set_fault_plan([](Call call, int64_t index, const ir::StepBatch&) {
    std::optional<Fault> fault;
    if (call == Call::kRun && index == 2) {
      fault.emplace();
      fault->loss = RunnerRecovery{LostKv::kAllKv, -1};
    }
    return fault;
  });
  runner.set_recover_fails(true);
  Recorder recorder;
  std::vector<RequestId> ids;
  for (int32_t index = 0; index < 4; ++index) {
    Request request = greedy_request(iota_prompt(5 + index, index), 10);
    ids.push_back(*engine.submit(recorder.attach(request)));
  }
  engine.step();
  engine.step();
  EXPECT_TRUE(engine.health().runner_available);
  EXPECT_TRUE(engine.health().has_work);
  engine.step();  // fails; recover() fails: every request ends, running (0, 1) and waiting
  recorder.expect_each_finished_once(ids);
  for (RequestId id : ids) {
    const Completion completion = recorder.completion(id);
    EXPECT_EQ(completion.reason, FinishReason::kError);
    EXPECT_EQ(completion.error.code(), StatusCode::kUnavailable) << completion.error;
    EXPECT_THAT(completion.error.message(), ::testing::HasSubstr("no worker can take"));
  }
  EXPECT_EQ(recorder.stream(ids[0]).tokens.size(), 2u);  // steps 1 and 2; nothing from step 3
  EngineHealth health = engine.health();
  EXPECT_FALSE(health.runner_available);
  EXPECT_FALSE(health.has_work);
  Request refused = greedy_request(iota_prompt(5), 4);
  const Result<RequestId> refused_id = engine.submit(recorder.attach(refused));
  ASSERT_FALSE(refused_id.ok());
  EXPECT_EQ(refused_id.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(refused_id.status().message(), ::testing::HasSubstr("no worker can take"));
  EXPECT_FALSE(engine.step());  // a retry, which fails again
  EXPECT_EQ(engine.stats().recovery_failures, 2);
  EXPECT_FALSE(engine.health().runner_available);

  runner.set_recover_fails(false);
  EXPECT_FALSE(engine.step());  // the retry succeeds; nothing to run
  EXPECT_TRUE(engine.health().runner_available);
  std::vector<RequestId> later;
  for (int32_t index = 0; index < 3; ++index) {
    Request request = greedy_request(iota_prompt(7 + index, 10 + index), 9);
    later.push_back(*engine.submit(recorder.attach(request)));
  }
  engine.run_until_idle();
  recorder.expect_each_finished_once(
      std::vector<RequestId>{ids[0], ids[1], ids[2], ids[3], later[0], later[1], later[2]});
  for (int32_t index = 0; index < 3; ++index) {
    EXPECT_EQ(recorder.stream(later[index]).tokens,
              reference_greedy(options, iota_prompt(7 + index, 10 + index), 9));
  }
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.recoveries, 1);
  EXPECT_EQ(stats.requests_recovered, 0);
  EXPECT_EQ(stats.recovery_failures, 2);
  harness.expect_all_blocks_free_or_cached();
}

TEST(EngineRecoveryTest, HealthCountsTimeWithoutProgressOnlyWhileWorkWaits) {
  HarnessOptions options;
  EngineHarness harness(options);
  Engine& engine = harness.engine();
  EngineHealth health = engine.health();
  EXPECT_TRUE(health.runner_available);
  EXPECT_FALSE(health.has_work);
  Recorder recorder;
  Request request = greedy_request(iota_prompt(5), 3);
  engine.submit(recorder.attach(request)).value();
  harness.clock().advance(std::chrono::seconds(3));
  health = engine.health();
  EXPECT_TRUE(health.has_work);
  EXPECT_EQ(health.seconds_since_progress, 3.0);
  engine.step();
  EXPECT_EQ(engine.health().seconds_since_progress, 0.0);
  engine.run_until_idle();
  EXPECT_FALSE(engine.health().has_work);
}

TEST(EngineRecoveryTest, RecoveryOptionsAreValidated) {
  HarnessOptions options;
  EngineHarness harness(options);
  EngineOptions engine_options;
  EngineParts parts;
  parts.block_manager = &harness.block_manager();
  parts.runner = &harness.runner();
  engine_options.max_recoveries_per_request = -1;
  EXPECT_EQ(Engine::create(engine_options, parts).status().code(), StatusCode::kInvalidArgument);
  engine_options.max_recoveries_per_request = 0;
  engine_options.recovery_retry_interval = Duration::zero();
  EXPECT_EQ(Engine::create(engine_options, parts).status().code(), StatusCode::kInvalidArgument);
}

TEST(EngineRecoveryTest, ARunnerWithoutRecoveryFailsOnlyTheStepsRequests) {
  // The toy runner's recover() is StepRunner's default: the failure is not recoverable.
  HarnessOptions options;
  options.scheduler.max_num_sequences = 1;
  EngineHarness harness(options);
  Engine& engine = harness.engine();
  harness.runner().set_step_observer([&](const ir::StepBatch&) {
    return harness.runner().num_steps() == 2 ? internal_error("broken step") : Status();
  });
  Recorder recorder;
  Request first = greedy_request(iota_prompt(5), 4);
  Request second = greedy_request(iota_prompt(6), 4);
  const RequestId first_id = *engine.submit(recorder.attach(first));
  const RequestId second_id = *engine.submit(recorder.attach(second));
  engine.run_until_idle();
  EXPECT_EQ(recorder.completion(first_id).reason, FinishReason::kError);
  EXPECT_EQ(recorder.completion(first_id).error.code(), StatusCode::kInternal);
  EXPECT_EQ(recorder.completion(second_id).reason, FinishReason::kLength);
  EXPECT_TRUE(engine.health().runner_available);
  EXPECT_EQ(engine.stats().recoveries, 0);
  EXPECT_EQ(engine.stats().recovery_failures, 1);
}

// --- The real model: a small generated Llama (two layers, q8_0 weights, f16 KV) through the
// page pool, the paged KV cache and the executor; the fault runner wraps its ModelStepRunner.

class ModelRecoveryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_path_ = new std::string((std::filesystem::path(::testing::TempDir()) /
                                   ("folio_recovery_model_" + std::to_string(getpid()) + ".gguf"))
                                      .string());
    model::LlamaShape shape;
    shape.context_length = 128;
    shape.weight_dtype = DType::kQ8_0;
    ASSERT_TRUE(model::write_random_llama_model(*model_path_, shape, 11).ok());
  }
  static void TearDownTestSuite() {
    std::filesystem::remove(*model_path_);
    delete model_path_;
  }

  // Runs `specs` (all submitted at once) on a fresh model, through a fault runner following
  // `plan` (none: uninterrupted).
  static Outcome run(std::span<const Spec> specs, bool use_graphs, uint64_t batching_seed,
                     FaultInjectingStepRunner::FaultPlan plan, int64_t* num_faults) {
    Result<std::unique_ptr<model::LlamaModel>> model = model::LlamaModel::open(*model_path_);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return {};
    ModelEngineOptions options;
    options.num_threads = 1;
    options.memory_budget_bytes = 4 << 20;
    options.page_bytes = 16 << 10;  // 8 blocks of 8 tokens (f16)
    options.block_size = 8;
    options.kv_dtype = DType::kF16;
    options.use_graphs = use_graphs;
    options.precapture_seconds = 0;
    options.scheduler.max_num_batched_tokens = 64;
    options.scheduler.max_num_sequences = 32;
    Result<std::unique_ptr<ModelEngine>> bundle = ModelEngine::create(std::move(*model), options);
    EXPECT_TRUE(bundle.ok()) << bundle.status();
    if (!bundle.ok()) return {};
    // An engine of its own over the bundle's KV cache and executor (the bundle's engine stays
    // idle), so its runner can be wrapped.
    ModelStepRunner model_runner((*bundle)->executor(), nullptr, &(*bundle)->pool());
    FaultInjectingStepRunner runner(model_runner, (*bundle)->block_manager(), batching_seed);
    if (plan) runner.set_fault_plan(std::move(plan));
    SplitMix64 random(batching_seed);
    EngineOptions engine_options;
    engine_options.scheduler.max_num_sequences = static_cast<int32_t>(4 + random.next() % 12);
    engine_options.scheduler.max_num_batched_tokens =
        engine_options.scheduler.max_num_sequences + static_cast<int32_t>(random.next() % 48);
    engine_options.scheduler.prefill_chunk_size = static_cast<int32_t>(1 + random.next() % 24);
    engine_options.max_recoveries_per_request = 1000;
    EngineParts parts;
    parts.block_manager = &(*bundle)->block_manager();
    parts.runner = &runner;
    Result<std::unique_ptr<Engine>> engine = Engine::create(engine_options, parts);
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok()) return {};
    Recorder recorder;
    Outcome outcome = drive(**engine, recorder, specs, 1);
    const kv::BlockManager& block_manager = (*bundle)->block_manager();
    EXPECT_EQ(block_manager.num_sequences(), 0);
    EXPECT_EQ(block_manager.counts().owned, block_manager.num_dummy_blocks());
    block_manager.check_invariants();
    *num_faults = runner.num_faults();
    return outcome;
  }

  static void check(bool use_graphs) {
    int64_t faults = 0;
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      // Token ids from 3: no BOS, EOS or UNK inside prompts.
      const std::vector<Spec> specs = workload(seed * 104729, 9, 500, 3);
      int64_t num_faults = 0;
      const Outcome reference = run(specs, use_graphs, seed, nullptr, &num_faults);
      const Outcome faulted =
          run(specs, use_graphs, seed, random_faults(seed, 5, 8, 2), &num_faults);
      expect_same_streams(faulted, reference, fmt::format("seed {}", seed));
      EXPECT_EQ(faulted.stats.recoveries, num_faults);
      faults += num_faults;
    }
    EXPECT_GT(faults, 8);
  }

  static std::string* model_path_;
};

std::string* ModelRecoveryTest::model_path_ = nullptr;

TEST_F(ModelRecoveryTest, ModelEnginePassesItsRecoveryOptionsToTheEngine) {
  ModelEngineOptions options;
  options.num_threads = 1;
  options.memory_budget_bytes = 4 << 20;
  options.page_bytes = 16 << 10;
  options.block_size = 8;
  options.use_graphs = false;
  options.precapture_seconds = 0;
  options.scheduler.max_num_batched_tokens = 64;
  options.scheduler.max_num_sequences = 8;
  options.max_recoveries_per_request = -1;
  Result<std::unique_ptr<model::LlamaModel>> model = model::LlamaModel::open(*model_path_);
  ASSERT_TRUE(model.ok()) << model.status();
  Result<std::unique_ptr<ModelEngine>> bundle = ModelEngine::create(std::move(*model), options);
  ASSERT_FALSE(bundle.ok());
  EXPECT_THAT(bundle.status().message(), ::testing::HasSubstr("max_recoveries_per_request"));
}

TEST_F(ModelRecoveryTest, RandomFaultsLeaveEveryStreamBitEqualEagerly) {
  check(false);
}
TEST_F(ModelRecoveryTest, RandomFaultsLeaveEveryStreamBitEqualWithGraphs) {
  check(true);
}

}  // namespace
}  // namespace folio::engine
