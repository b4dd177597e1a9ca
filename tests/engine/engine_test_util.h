// Test support for engine/: an engine over a small paged KV cache and the toy model
// (ToyStepRunner, optionally behind a FaultInjectingStepRunner), a recorder of streamed events that
// checks exactly-once delivery, an independent greedy reference, and a toy detokenizer.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "folio/base/metrics.h"
#include "folio/base/random.h"
#include "folio/engine/engine.h"
#include "folio/kv/block_copier.h"
#include "folio/kv/block_manager.h"
#include "folio/kv/fixed_page_source.h"
#include "folio/kv/host_swap_space.h"
#include "testing/fault_injecting_step_runner.h"
#include "testing/toy_step_runner.h"

namespace folio::engine::testing {

// Random batching options for the randomized engine tests: 2 to 1 + max_sequences sequences, a
// token budget of that plus up to extra_tokens - 1, chunked prefill two times in three with
// chunks of 1 to 32 tokens, aging and starvation times, and preemption never failing a request.
inline void randomize_batching(SchedulerOptions& scheduler, SplitMix64& random,
                               int32_t max_sequences, int32_t extra_tokens) {
  scheduler.max_num_sequences = static_cast<int32_t>(2 + random.next() % (max_sequences - 1));
  scheduler.max_num_batched_tokens =
      scheduler.max_num_sequences + static_cast<int32_t>(random.next() % extra_tokens);
  scheduler.chunked_prefill = random.next() % 3 != 0;
  scheduler.prefill_chunk_size = static_cast<int32_t>(1 + random.next() % 32);
  scheduler.max_preemptions = 1000000;
  scheduler.aging_interval = std::chrono::milliseconds(1 + random.next() % 50);
  scheduler.starvation_threshold = std::chrono::milliseconds(random.next() % 400);
}

// The toy detokenizer: token t spells one letter, or two for t >= 26, so text and tokens do not
// line up one to one.
inline std::string toy_piece(int32_t token) {
  std::string piece(1, static_cast<char>('a' + token % 26));
  if (token >= 26) piece.push_back(static_cast<char>('A' + (token / 26) % 26));
  return piece;
}
inline std::string toy_decode(std::span<const int32_t> tokens) {
  std::string text;
  for (int32_t token : tokens) text += toy_piece(token);
  return text;
}

struct HarnessOptions {
  int32_t block_size = 8;
  int32_t blocks_per_page = 8;
  int32_t num_pages = 16;
  int32_t max_context_tokens = 128;
  double watermark = 0.01;
  int32_t swap_blocks = 0;  // > 0: a host swap space of this many blocks
  int32_t vocab_size = 64;
  uint64_t model_seed = 7;
  int64_t num_adapters = 1;
  int32_t max_logit_rows = 0;  // the toy runner's limit per step (0: none)
  bool with_text = true;
  std::optional<int32_t> eos_token;
  SchedulerOptions scheduler;
  PhaseBudgetTunerOptions phase_tuner;
  uint64_t engine_seed = 0;
  // Prices victims for PreemptionMode::kCheaper; must outlive the harness.
  const PreemptionCostModel* preemption_cost = nullptr;
  // The engine runs the toy model through a FaultInjectingStepRunner (fault_runner()).
  bool inject_faults = false;
  int32_t max_recoveries_per_request = EngineOptions{}.max_recoveries_per_request;
  Duration recovery_retry_interval = EngineOptions{}.recovery_retry_interval;
  bool replay_lost_stages = EngineOptions{}.replay_lost_stages;
};

// Owns the KV cache, the toy runner, a manual clock and the engine, in dependency order.
class EngineHarness {
 public:
  explicit EngineHarness(const HarnessOptions& options) : options_(options) {
    kv::BlockManagerOptions kv_options;
    kv_options.geometry.block_size = options.block_size;
    kv_options.geometry.num_layers = 1;
    kv_options.geometry.num_kv_heads = 1;
    kv_options.geometry.head_dim = 4;
    kv_options.geometry.dtype = DType::kF32;
    kv_options.max_context_tokens = options.max_context_tokens;
    kv_options.watermark = options.watermark;
    const int64_t block_bytes = kv_options.geometry.block_bytes();
    page_source_ = std::make_unique<kv::FixedPageSource>(block_bytes * options.blocks_per_page,
                                                         options.num_pages);
    if (options.swap_blocks > 0) {
      swap_space_ = std::make_unique<kv::HostSwapSpace>(block_bytes, options.swap_blocks);
    }
    block_manager_ = std::move(
        kv::BlockManager::create(kv_options, *page_source_, copier_, swap_space_.get()).value());
    runner_ = std::move(ToyStepRunner::create(block_manager_->layout(), options.vocab_size,
                                              options.model_seed, options.num_adapters)
                            .value());
    runner_->set_max_logit_rows(options.max_logit_rows);
    if (options.inject_faults) {
      fault_runner_ = std::make_unique<FaultInjectingStepRunner>(*runner_, *block_manager_,
                                                                 options.model_seed + 1);
    }
    EngineOptions engine_options;
    engine_options.max_recoveries_per_request = options.max_recoveries_per_request;
    engine_options.recovery_retry_interval = options.recovery_retry_interval;
    engine_options.replay_lost_stages = options.replay_lost_stages;
    engine_options.scheduler = options.scheduler;
    engine_options.eos_token = options.eos_token;
    engine_options.seed = options.engine_seed;
    engine_options.phase_tuner = options.phase_tuner;
    EngineParts parts;
    parts.block_manager = block_manager_.get();
    parts.runner =
        fault_runner_ != nullptr ? static_cast<StepRunner*>(fault_runner_.get()) : runner_.get();
    parts.has_swap_space = swap_space_ != nullptr;
    parts.preemption_cost = options.preemption_cost;
    parts.clock = &clock_;
    parts.registry = &registry_;
    if (options.with_text) parts.text_decoder_factory = make_span_text_decoder_factory(toy_decode);
    engine_ = std::move(Engine::create(engine_options, parts).value());
  }
  ~EngineHarness() { engine_.reset(); }

  Engine& engine() { return *engine_; }
  ToyStepRunner& runner() { return *runner_; }
  // Requires: options.inject_faults.
  FaultInjectingStepRunner& fault_runner() { return *fault_runner_; }
  kv::BlockManager& block_manager() { return *block_manager_; }
  ManualClock& clock() { return clock_; }
  metrics::Registry& registry() { return registry_; }
  const HarnessOptions& options() const { return options_; }

  // After every request ended: no sequence is left and every block is FREE or CACHED (the
  // dummy block aside).
  void expect_all_blocks_free_or_cached() {
    block_manager_->check_invariants();
    EXPECT_EQ(block_manager_->num_sequences(), 0);
    const kv::BlockCounts& counts = block_manager_->counts();
    EXPECT_EQ(counts.owned, 1) << "only the dummy block may stay owned";
    EXPECT_EQ(counts.free + counts.cached + counts.owned, counts.total);
    if (swap_space_ != nullptr) {
      EXPECT_EQ(swap_space_->num_free(), swap_space_->num_blocks());
    }
  }

 private:
  HarnessOptions options_;
  std::unique_ptr<kv::FixedPageSource> page_source_;
  kv::HostKvBlockCopier copier_;
  std::unique_ptr<kv::HostSwapSpace> swap_space_;
  std::unique_ptr<kv::BlockManager> block_manager_;
  std::unique_ptr<ToyStepRunner> runner_;
  std::unique_ptr<FaultInjectingStepRunner> fault_runner_;  // with options.inject_faults
  ManualClock clock_;
  metrics::Registry registry_;
  std::unique_ptr<Engine> engine_;
};

// Collects every callback, keyed by request id and choice, and notes any breach of the streaming
// contract.
// Thread-safe: callbacks arrive on the engine thread while tests read from theirs.
class Recorder {
 public:
  struct Stream {
    std::vector<int32_t> tokens;
    std::string text;
    std::vector<TokenLogprobs> logprobs;  // one per token that carried them
    int32_t num_prompt_logprobs_calls = 0;
    std::vector<TokenLogprobs> prompt_logprobs;  // from on_prompt_logprobs (choice 0's stream)
    std::vector<Completion> completions;
    std::vector<std::string> violations;
  };

  // Sets the request's callbacks to record into this recorder (on_prompt_logprobs too when the
  // request asks for prompt logprobs).
  Request& attach(Request& request) {
    // on_prompt_logprobs does not name its request: it is parked here and filed under the
    // request by its next callback (the engine makes one of the same request's next).
    auto parked = std::make_shared<PromptRecord>();
    if (request.prompt_logprobs) {
      request.on_prompt_logprobs = [this, parked](std::span<const TokenLogprobs> entries) {
        std::lock_guard lock(mutex_);
        ++parked->num_calls;
        parked->entries.assign(entries.begin(), entries.end());
      };
    }
    request.on_token = [this, parked](const TokenEvent& event) {
      std::lock_guard lock(mutex_);
      file_prompt_logprobs(*parked, event.request);
      Stream& stream = streams_[{event.request, event.choice}];
      if (!stream.completions.empty()) stream.violations.push_back("token after finish");
      if (event.index != static_cast<int32_t>(stream.tokens.size())) {
        stream.violations.push_back("token index " + std::to_string(event.index) + " after " +
                                    std::to_string(stream.tokens.size()) + " tokens");
      }
      stream.tokens.push_back(event.token);
      stream.text.append(event.text);
      if (event.logprobs != nullptr) stream.logprobs.push_back(*event.logprobs);
    };
    request.on_finish = [this, parked](const Completion& completion) {
      std::lock_guard lock(mutex_);
      file_prompt_logprobs(*parked, completion.request);
      Stream& stream = streams_[{completion.request, completion.choice}];
      if (!stream.completions.empty()) stream.violations.push_back("finished twice");
      if (completion.num_generated_tokens != static_cast<int32_t>(stream.tokens.size())) {
        stream.violations.push_back("completion counts a different number of tokens");
      }
      if ((completion.reason == FinishReason::kError) == completion.error.ok()) {
        stream.violations.push_back("error status does not match the finish reason");
      }
      stream.completions.push_back(completion);
      ++num_finished_;
    };
    return request;
  }

  Stream stream(RequestId id, int32_t choice = 0) const {
    std::lock_guard lock(mutex_);
    const auto entry = streams_.find({id, choice});
    return entry == streams_.end() ? Stream{} : entry->second;
  }
  bool finished(RequestId id, int32_t choice = 0) const {
    std::lock_guard lock(mutex_);
    const auto entry = streams_.find({id, choice});
    return entry != streams_.end() && !entry->second.completions.empty();
  }
  Completion completion(RequestId id, int32_t choice = 0) const {
    std::lock_guard lock(mutex_);
    return streams_.at({id, choice}).completions.at(0);
  }
  int64_t num_finished() const {
    std::lock_guard lock(mutex_);
    return num_finished_;
  }
  // Every choice of every id finished exactly once, without contract violations.
  // num_choices: per id (empty: one choice each).
  void expect_each_finished_once(std::span<const RequestId> ids,
                                 std::span<const int32_t> num_choices = {}) const {
    std::lock_guard lock(mutex_);
    int64_t expected = 0;
    for (size_t index = 0; index < ids.size(); ++index) {
      const RequestId id = ids[index];
      const int32_t choices = num_choices.empty() ? 1 : num_choices[index];
      expected += choices;
      for (int32_t choice = 0; choice < choices; ++choice) {
        const auto entry = streams_.find({id, choice});
        ASSERT_NE(entry, streams_.end())
            << "request " << id.value() << " choice " << choice << " never reported";
        EXPECT_EQ(entry->second.completions.size(), 1u)
            << "request " << id.value() << " choice " << choice;
        for (const std::string& violation : entry->second.violations) {
          ADD_FAILURE() << "request " << id.value() << " choice " << choice << ": " << violation;
        }
      }
    }
    EXPECT_EQ(num_finished_, expected);
  }

 private:
  struct PromptRecord {
    int32_t num_calls = 0;
    std::vector<TokenLogprobs> entries;
  };
  // Files a parked on_prompt_logprobs call under choice 0 of `id`; a call after the request's
  // first token or completion is a contract violation.
  void file_prompt_logprobs(PromptRecord& parked, RequestId id) {
    Stream& stream = streams_[{id, 0}];
    if (parked.num_calls == 0) return;
    if (!stream.tokens.empty() || !stream.completions.empty()) {
      stream.violations.push_back("on_prompt_logprobs after a token or completion");
    }
    stream.num_prompt_logprobs_calls += parked.num_calls;
    stream.prompt_logprobs = std::move(parked.entries);
    parked.num_calls = 0;
  }

  mutable std::mutex mutex_;
  std::map<std::pair<RequestId, int32_t>, Stream> streams_;
  int64_t num_finished_ = 0;
};

// Independent greedy reference: the toy model's logits from scratch for every token, argmax
// (first maximum), the same stop rules as the engine's.
inline std::vector<int32_t> reference_greedy(const HarnessOptions& options,
                                             std::span<const int32_t> prompt, int32_t max_tokens,
                                             std::span<const int32_t> stop_tokens = {},
                                             int64_t adapter_id = 0) {
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  std::vector<int32_t> output;
  std::vector<float> logits(static_cast<size_t>(options.vocab_size));
  while (true) {
    ToyStepRunner::logits_for_key(
        ToyStepRunner::reference_key(options.model_seed, adapter_id, tokens), logits);
    const auto token =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    output.push_back(token);
    tokens.push_back(token);
    const bool eos = options.eos_token.has_value() && token == *options.eos_token;
    if (eos || std::find(stop_tokens.begin(), stop_tokens.end(), token) != stop_tokens.end()) {
      break;
    }
    if (static_cast<int32_t>(output.size()) >= max_tokens ||
        static_cast<int32_t>(tokens.size()) >= options.max_context_tokens) {
      break;
    }
  }
  return output;
}

// The toy model's logits row after `tokens` (what predicts the next token), without a cache.
inline std::vector<float> reference_logits(const HarnessOptions& options,
                                           std::span<const int32_t> tokens,
                                           int64_t adapter_id = 0) {
  std::vector<float> logits(static_cast<size_t>(options.vocab_size));
  ToyStepRunner::logits_for_key(
      ToyStepRunner::reference_key(options.model_seed, adapter_id, tokens), logits);
  return logits;
}

inline std::vector<int32_t> random_prompt(uint64_t& state, int32_t length, int32_t vocab_size) {
  std::vector<int32_t> prompt;
  for (int32_t index = 0; index < length; ++index) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    prompt.push_back(static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(vocab_size)));
  }
  return prompt;
}

// A request's fields without its callbacks: a workload is a list of these, replayed in several
// configurations.
struct RequestSpec {
  std::vector<int32_t> prompt;
  int32_t max_tokens = 0;
  int32_t priority = 0;
  SamplingParams sampling;
  bool ignore_eos = false;
  int64_t adapter_id = 0;
  int32_t num_choices = 1;
  bool prompt_logprobs = false;
  std::optional<int32_t> logprobs;
};

inline Request to_request(const RequestSpec& spec) {
  Request request;
  request.prompt = spec.prompt;
  request.max_tokens = spec.max_tokens;
  request.priority = spec.priority;
  request.sampling = spec.sampling;
  request.ignore_eos = spec.ignore_eos;
  request.adapter_id = spec.adapter_id;
  request.num_choices = spec.num_choices;
  request.prompt_logprobs = spec.prompt_logprobs;
  request.logprobs = spec.logprobs;
  return request;
}

// A prompt of `length` toy-vocabulary tokens in a fixed, non-repeating pattern.
inline std::vector<int32_t> iota_prompt(int32_t length, int32_t start = 1) {
  std::vector<int32_t> prompt;
  for (int32_t index = 0; index < length; ++index) prompt.push_back((start + index * 7) % 64);
  return prompt;
}

inline Request greedy_request(std::vector<int32_t> prompt, int32_t max_tokens) {
  Request request;
  request.prompt = std::move(prompt);
  request.max_tokens = max_tokens;
  request.sampling.temperature = 0.0f;
  return request;
}

}  // namespace folio::engine::testing
