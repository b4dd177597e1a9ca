// Randomized workloads with fixed seeds: random engine configurations, submissions (shared
// prefixes, greedy and sampled, stop tokens and strings, priorities, n > 1 choices sharing their
// prompt's blocks), cancellations and clock advances, with the engine's invariants (the block
// manager's reference and shared-block counts included) checked after every step. At the end:
// every choice of every request ended exactly once, streams are gap-free, greedy outputs of
// every choice equal the independent reference (cut by stop strings, or a prefix of it when
// cancelled), and every KV block is FREE or CACHED.
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "folio/base/random.h"

namespace folio::engine {
namespace {

using testing::EngineHarness;
using testing::HarnessOptions;
using testing::randomize_batching;
using testing::Recorder;
using testing::reference_greedy;
using testing::toy_decode;

struct Submitted {
  RequestId id;
  Request request;  // a copy without callbacks
  bool cancelled = false;
};

// What the engine must produce for a greedy request that was not cancelled: the reference
// tokens, cut at the token that completes the first stop string; and the text before it.
void expected_greedy(const HarnessOptions& options, const Request& request,
                     std::vector<int32_t>& tokens, std::string& text) {
  tokens = reference_greedy(options, request.prompt, request.max_tokens, request.stop_token_ids);
  text.clear();
  for (size_t count = 1; count <= tokens.size(); ++count) {
    const bool stop_token =
        std::find(request.stop_token_ids.begin(), request.stop_token_ids.end(),
                  tokens[count - 1]) != request.stop_token_ids.end() ||
        (options.eos_token.has_value() && tokens[count - 1] == *options.eos_token);
    const std::string decoded =
        toy_decode(std::span<const int32_t>(tokens).first(stop_token ? count - 1 : count));
    size_t first_start = std::string::npos;
    size_t first_end = std::string::npos;
    for (const std::string& stop : request.stop_strings) {
      const size_t start = decoded.find(stop);
      if (start == std::string::npos) continue;
      const size_t end = start + stop.size();
      if (end < first_end || (end == first_end && start < first_start)) {
        first_end = end;
        first_start = start;
      }
    }
    if (first_start != std::string::npos) {
      tokens.resize(count);
      text = decoded.substr(0, first_start);
      return;
    }
    text = decoded;
  }
}

HarnessOptions random_options(SplitMix64& random) {
  HarnessOptions options;
  options.num_pages = static_cast<int32_t>(4 + random.next() % 6);  // 32 to 72 blocks
  options.eos_token = random.next() % 2 == 0 ? std::optional<int32_t>(5) : std::nullopt;
  SchedulerOptions& scheduler = options.scheduler;
  randomize_batching(scheduler, random, 25, 80);
  // A runner with few logit rows per step cuts prompt-logprobs prefills into many chunks.
  if (random.next() % 2 == 0) {
    options.max_logit_rows = scheduler.max_num_sequences + static_cast<int32_t>(random.next() % 8);
  }
  if (random.next() % 2 == 0) {
    scheduler.preemption_mode = PreemptionMode::kSwap;
    options.swap_blocks = static_cast<int32_t>(8 + random.next() % 120);
  }
  return options;
}

Request random_request(SplitMix64& random, const std::vector<std::vector<int32_t>>& prefixes,
                       int32_t max_total_tokens, int32_t max_num_sequences) {
  Request request;
  if (random.next() % 2 == 0) request.prompt = prefixes[random.next() % prefixes.size()];
  const auto extra = static_cast<int32_t>(1 + random.next() % 24);
  for (int32_t index = 0; index < extra; ++index) {
    request.prompt.push_back(static_cast<int32_t>(random.next() % 64));
  }
  request.max_tokens = static_cast<int32_t>(1 + random.next() % 40);
  request.max_tokens = std::min<int32_t>(
      request.max_tokens, max_total_tokens - static_cast<int32_t>(request.prompt.size()));
  request.priority = static_cast<int32_t>(random.next() % 3);
  request.sampling.temperature = 0.0f;
  if (random.next() % 4 == 0) {
    request.sampling.temperature = 0.9f;
    request.sampling.top_k = static_cast<int32_t>(random.next() % 20);
    request.sampling.seed = random.next();
  }
  if (random.next() % 4 == 0) request.stop_token_ids = {static_cast<int32_t>(random.next() % 64)};
  if (random.next() % 3 == 0) {
    // A letter, or a letter and a capital (a token's two-letter piece, or two tokens' text).
    std::string stop(1, static_cast<char>('a' + random.next() % 26));
    if (random.next() % 2 == 0) stop.push_back(static_cast<char>('A' + random.next() % 2));
    request.stop_strings = {stop};
  }
  if (random.next() % 4 == 0) {
    request.num_choices = std::min(max_num_sequences, static_cast<int32_t>(2 + random.next() % 3));
  }
  if (random.next() % 6 == 0) {
    request.prompt_logprobs = true;
    request.logprobs = static_cast<int32_t>(random.next() % 4);
    if (random.next() % 3 == 0) request.max_tokens = 0;
  }
  return request;
}

// What one choice of a finished request must show.
void check_choice(const HarnessOptions& options, const Submitted& entry, const Recorder& recorder,
                  int32_t choice) {
  const Completion completion = recorder.completion(entry.id, choice);
  const Recorder::Stream stream = recorder.stream(entry.id, choice);
  ASSERT_NE(completion.reason, FinishReason::kError) << completion.error;
  if (completion.reason == FinishReason::kCancelled) {
    EXPECT_TRUE(entry.cancelled);
  }
  EXPECT_EQ(stream.text, toy_decode(stream.tokens).substr(0, stream.text.size()));
  if (choice == 0 && entry.request.prompt_logprobs) {
    // Delivered exactly once, unless cancelled before the prefill completed.
    const std::vector<int32_t>& prompt = entry.request.prompt;
    if (stream.num_prompt_logprobs_calls == 0) {
      EXPECT_EQ(completion.reason, FinishReason::kCancelled);
      EXPECT_TRUE(stream.tokens.empty());
    } else {
      EXPECT_EQ(stream.num_prompt_logprobs_calls, 1);
      ASSERT_EQ(stream.prompt_logprobs.size(), prompt.size() - 1);
      for (size_t index = 1; index < prompt.size(); ++index) {
        TokenLogprobs expected;
        compute_token_logprobs(testing::reference_logits(options, std::span(prompt).first(index)),
                               prompt[index], entry.request.logprobs.value_or(0), expected);
        const TokenLogprobs& actual = stream.prompt_logprobs[index - 1];
        EXPECT_EQ(actual.token, expected.token);
        EXPECT_EQ(actual.logprob, expected.logprob) << "prompt token " << index;
        ASSERT_EQ(actual.top.size(), expected.top.size());
        for (size_t rank = 0; rank < expected.top.size(); ++rank) {
          EXPECT_EQ(actual.top[rank].token, expected.top[rank].token);
        }
      }
    }
  }
  if (entry.request.max_tokens == 0) {
    EXPECT_TRUE(stream.tokens.empty());
    return;
  }
  if (!entry.request.sampling.is_greedy()) return;
  std::vector<int32_t> expected_tokens;
  std::string expected_text;
  expected_greedy(options, entry.request, expected_tokens, expected_text);
  if (completion.reason == FinishReason::kCancelled) {
    ASSERT_LE(stream.tokens.size(), expected_tokens.size());
    EXPECT_TRUE(std::equal(stream.tokens.begin(), stream.tokens.end(), expected_tokens.begin()))
        << "request " << entry.id.value();
    return;
  }
  EXPECT_EQ(stream.tokens, expected_tokens) << "request " << entry.id.value();
  EXPECT_EQ(stream.text, expected_text) << "request " << entry.id.value();
}

void run_workload(uint64_t seed) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  SplitMix64 random(seed);
  const HarnessOptions options = random_options(random);
  EngineHarness harness(options);
  // Requests always fit the cache alone: no "never fits" errors are expected.
  const int32_t max_total_tokens =
      std::min(options.max_context_tokens - 1,
               (options.num_pages * options.blocks_per_page - 3) * options.block_size);
  std::vector<std::vector<int32_t>> prefixes;
  for (int index = 0; index < 3; ++index) {
    std::vector<int32_t> prefix;
    for (int token = 0; token < 20; ++token)
      prefix.push_back(static_cast<int32_t>(random.next() % 64));
    prefixes.push_back(prefix);
  }
  Recorder recorder;
  std::vector<Submitted> submitted;
  int64_t most_shared = 0;
  for (int step = 0; step < 300 || harness.engine().has_unfinished_requests(); ++step) {
    if (step < 300) {
      const int arrivals = static_cast<int>(random.next() % 5) - 1;
      for (int index = 0; index < arrivals; ++index) {
        Request request =
            random_request(random, prefixes, max_total_tokens, options.scheduler.max_num_sequences);
        Submitted entry{RequestId(), request, false};
        entry.id = *harness.engine().submit(recorder.attach(request));
        submitted.push_back(std::move(entry));
      }
      if (!submitted.empty() && random.next() % 10 == 0) {
        Submitted& victim = submitted[random.next() % submitted.size()];
        victim.cancelled = true;  // may already have finished: then it is ignored
        harness.engine().cancel(victim.id);
      }
    }
    harness.clock().advance(std::chrono::milliseconds(random.next() % 5));
    harness.engine().step();
    harness.engine().check_invariants();
    most_shared = std::max(most_shared, harness.block_manager().counts().shared);
    ASSERT_LT(step, 20000) << "the workload does not drain";
  }
  std::vector<RequestId> ids;
  std::vector<int32_t> num_choices;
  int64_t total_choices = 0;
  for (const Submitted& entry : submitted) {
    ids.push_back(entry.id);
    num_choices.push_back(entry.request.num_choices);
    total_choices += entry.request.num_choices;
  }
  recorder.expect_each_finished_once(ids, num_choices);
  EXPECT_GT(most_shared, 0) << "no KV block was ever shared (by choices or prefix hits)";
  int32_t num_forked = 0;  // requests whose second choice generated (so it forked)
  for (const Submitted& entry : submitted) {
    if (entry.request.num_choices > 1 && !recorder.stream(entry.id, 1).tokens.empty()) ++num_forked;
  }
  EXPECT_GT(num_forked, 0);
  int32_t num_scored = 0;  // requests whose prompt logprobs came
  for (const Submitted& entry : submitted) {
    if (recorder.stream(entry.id).num_prompt_logprobs_calls > 0) ++num_scored;
  }
  EXPECT_GT(num_scored, 0);
  for (const Submitted& entry : submitted) {
    for (int32_t choice = 0; choice < entry.request.num_choices; ++choice) {
      SCOPED_TRACE(fmt::format("request {} choice {}", entry.id.value(), choice));
      check_choice(options, entry, recorder, choice);
    }
  }
  harness.expect_all_blocks_free_or_cached();
  const EngineStats stats = harness.engine().stats();
  EXPECT_EQ(stats.requests_submitted, total_choices);
  EXPECT_EQ(stats.requests_finished, total_choices);
}

TEST(EngineRandomTest, RandomWorkloadsKeepEveryContract) {
  for (uint64_t seed = 1; seed <= 12; ++seed) run_workload(seed);
}

}  // namespace
}  // namespace folio::engine
