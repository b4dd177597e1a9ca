// Engine: construction, submission, cancellation and the loop thread. The step itself is in
// engine_step.cc.
#include "folio/engine/engine.h"

#include <algorithm>

#include "folio/base/check.h"
#include "folio/engine/engine_request_state.h"

namespace folio::engine {

uint64_t choice_seed(uint64_t request_seed, int32_t choice) {
  // Choice 0 keeps the request's seed, so it draws what the same request with n = 1 draws.
  if (choice == 0) return request_seed;
  return SplitMix64(request_seed ^ (static_cast<uint64_t>(choice) * 0x9e3779b97f4a7c15ULL)).next();
}

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  FOLIO_UNREACHABLE("bad FinishReason");
}

namespace {

kv::KvCache& kv_cache_of(const EngineParts& parts) {
  if (parts.kv_parallel_cache != nullptr) return *parts.kv_parallel_cache;
  return *parts.block_manager;
}

// Width of a step's block-table rows: a KV-parallel member holds at most its range.
int32_t block_table_width(const EngineParts& parts) {
  if (parts.kv_parallel_cache != nullptr) {
    return parts.kv_parallel_cache->tokens_per_group() /
           parts.kv_parallel_cache->cache_block_size();
  }
  const kv::BlockManagerOptions& options = parts.block_manager->options();
  return (options.max_context_tokens + options.geometry.block_size - 1) /
         options.geometry.block_size;
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::create(const EngineOptions& options,
                                               const EngineParts& parts) {
  if ((parts.block_manager == nullptr) == (parts.kv_parallel_cache == nullptr) ||
      parts.runner == nullptr) {
    return invalid_argument(
        "an engine needs a step runner and one KV cache: a block manager or a KV-parallel cache");
  }
  if (parts.runner->vocab_size() < 1) {
    return invalid_argument("the step runner reports a vocabulary of {} tokens",
                            parts.runner->vocab_size());
  }
  if (options.eos_token.has_value() &&
      (*options.eos_token < 0 || *options.eos_token >= parts.runner->vocab_size())) {
    return invalid_argument("EOS token {} is outside the vocabulary of {} tokens",
                            *options.eos_token, parts.runner->vocab_size());
  }
  if (options.max_recoveries_per_request < 0) {
    return invalid_argument("max_recoveries_per_request must not be negative, got {}",
                            options.max_recoveries_per_request);
  }
  if (options.recovery_retry_interval <= Duration::zero()) {
    return invalid_argument("recovery_retry_interval must be positive");
  }
  // Steps never ask for more logits rows than the runner returns.
  SchedulerOptions scheduler_options = options.scheduler;
  if (const int32_t runner_rows = parts.runner->max_logit_rows(); runner_rows > 0) {
    scheduler_options.max_logit_rows =
        scheduler_options.max_logit_rows == 0
            ? runner_rows
            : std::min(scheduler_options.max_logit_rows, runner_rows);
  }
  if (scheduler_options.preemption_mode == PreemptionMode::kCheaper && parts.has_swap_space &&
      parts.preemption_cost == nullptr) {
    return invalid_argument(
        "preemption by the cheaper of recompute and swap needs a preemption cost model");
  }
  FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> scheduler,
                         Scheduler::create(scheduler_options, kv_cache_of(parts),
                                           parts.has_swap_space, parts.adapters));
  scheduler->set_preemption_cost(parts.preemption_cost);
  std::unique_ptr<Clock> owned_clock;
  if (parts.clock == nullptr) owned_clock = std::make_unique<SteadyClock>();
  std::unique_ptr<metrics::Registry> owned_registry;
  if (parts.registry == nullptr) owned_registry = std::make_unique<metrics::Registry>();
  metrics::Registry& registry = parts.registry != nullptr ? *parts.registry : *owned_registry;
  FOLIO_ASSIGN_OR_RETURN(
      PhaseBudgetTuner phase_tuner,
      PhaseBudgetTuner::create(options.phase_tuner, options.scheduler.phase_split));
  FOLIO_ASSIGN_OR_RETURN(EngineMetrics metrics, EngineMetrics::create(registry));
  metrics.on_phase_split(phase_tuner.split(), 0, 0);
  return std::unique_ptr<Engine>(new Engine(options, parts, std::move(metrics),
                                            std::move(owned_clock), std::move(owned_registry),
                                            std::move(scheduler), std::move(phase_tuner)));
}

Engine::Engine(const EngineOptions& options, const EngineParts& parts, EngineMetrics metrics,
               std::unique_ptr<Clock> owned_clock,
               std::unique_ptr<metrics::Registry> owned_registry,
               std::unique_ptr<Scheduler> scheduler, PhaseBudgetTuner phase_tuner)
    : options_(options),
      kv_cache_(kv_cache_of(parts)),
      block_manager_(parts.block_manager),
      kv_parallel_cache_(parts.kv_parallel_cache),
      runner_(*parts.runner),
      adapters_(parts.adapters),
      pressure_(parts.pressure),
      profile_(parts.profile),
      owned_clock_(std::move(owned_clock)),
      clock_(parts.clock != nullptr ? *parts.clock : *owned_clock_),
      owned_registry_(std::move(owned_registry)),
      registry_(parts.registry != nullptr ? parts.registry : owned_registry_.get()),
      text_decoder_factory_(parts.text_decoder_factory),
      vocab_size_(parts.runner->vocab_size()),
      max_context_tokens_(static_cast<int32_t>(kv_cache_of(parts).context_limit())),
      max_blocks_per_sequence_(block_table_width(parts)),
      metrics_(std::move(metrics)),
      scheduler_(std::move(scheduler)),
      phase_tuner_(std::move(phase_tuner)),
      step_batch_builder_(max_blocks_per_sequence_) {
  note_progress();
  report_state();  // the gauges read the idle engine before its first step, not zeros
}

Engine::~Engine() {
  stop();
}

Status Engine::validate(const Request& request) const {
  if (request.prompt.empty()) return invalid_argument("the prompt has no tokens");
  // A prompt that is only scored (max_tokens 0) may fill the context; otherwise one token must
  // fit after it.
  const int64_t max_prompt_tokens = request.max_tokens == 0 && request.prompt_logprobs
                                        ? max_context_tokens_
                                        : max_context_tokens_ - 1;
  if (static_cast<int64_t>(request.prompt.size()) > max_prompt_tokens) {
    return invalid_argument(
        "the prompt has {} tokens; the context limit of {} leaves room for at most {}",
        request.prompt.size(), max_context_tokens_, max_prompt_tokens);
  }
  for (size_t index = 0; index < request.prompt.size(); ++index) {
    if (request.prompt[index] < 0 || request.prompt[index] >= vocab_size_) {
      return invalid_argument("prompt token {} (at {}) is outside the vocabulary of {} tokens",
                              request.prompt[index], index, vocab_size_);
    }
  }
  if (request.num_choices < 1 || request.num_choices > options_.scheduler.max_num_sequences) {
    return invalid_argument(
        "num_choices (n) must be in [1, {}] (the engine's max_num_sequences: every choice runs "
        "as its own sequence), got {}",
        options_.scheduler.max_num_sequences, request.num_choices);
  }
  if (request.max_tokens < (request.prompt_logprobs ? 0 : 1)) {
    return invalid_argument(
        "max_tokens must be at least 1 (0 only with prompt_logprobs: score the prompt, generate "
        "nothing), got {}",
        request.max_tokens);
  }
  FOLIO_RETURN_IF_ERROR(request.sampling.validate(vocab_size_));
  if (request.logprobs.has_value() &&
      (*request.logprobs < 0 || *request.logprobs > kMaxTopLogprobs)) {
    return invalid_argument("logprobs must be in [0, {}] (the number of top tokens), got {}",
                            kMaxTopLogprobs, *request.logprobs);
  }
  for (int32_t token : request.stop_token_ids) {
    if (token < 0 || token >= vocab_size_) {
      return invalid_argument("stop token {} is outside the vocabulary of {} tokens", token,
                              vocab_size_);
    }
  }
  for (const std::string& stop : request.stop_strings) {
    if (stop.empty()) return invalid_argument("stop strings must not be empty");
  }
  if (!request.stop_strings.empty() && !text_decoder_factory_) {
    return invalid_argument("stop strings need a text decoder, and this engine has none");
  }
  if (adapters_ != nullptr && request.adapter_id != 0) {
    if (!adapters_->get(request.adapter_id)) {
      return not_found("adapter {} is not registered (it may have been unloaded)",
                       request.adapter_id);
    }
  } else if (!runner_.supports_adapter(request.adapter_id)) {
    return invalid_argument("adapter {} is not served by this model", request.adapter_id);
  }
  return Status();
}

Result<RequestId> Engine::submit(Request request) {
  FOLIO_RETURN_IF_ERROR(validate(request));
  const auto num_prompt_tokens = static_cast<int32_t>(request.prompt.size());
  auto state = std::make_unique<RequestState>(request);
  std::vector<int32_t>& stop_token_ids = state->stop_token_ids;
  if (options_.eos_token.has_value() && !request.ignore_eos) {
    stop_token_ids.push_back(*options_.eos_token);
  }
  std::sort(stop_token_ids.begin(), stop_token_ids.end());
  stop_token_ids.erase(std::unique(stop_token_ids.begin(), stop_token_ids.end()),
                       stop_token_ids.end());
  // KV computed under an adapter is keyed by what the adapter computes (its content), never by
  // its name or id, so different weights under one name can never share a prefix.
  kv::CacheNamespace cache_namespace;
  cache_namespace.adapter_id = request.adapter_id;
  if (adapters_ != nullptr && request.adapter_id != 0) {
    std::optional<lora::AdapterInfo> adapter = adapters_->get(request.adapter_id);
    if (!adapter) return not_found("adapter {} is not registered", request.adapter_id);
    cache_namespace.adapter_id = adapter->kv_namespace();
  }
  if (request.prompt_logprobs) {
    state->prompt_logprobs.resize(static_cast<size_t>(num_prompt_tokens - 1));
  }
  const TimePoint arrival = clock_.now();
  std::unique_ptr<TokenConstraint> constraint = std::move(request.constraint).release();
  for (int32_t index = 0; index < request.num_choices; ++index) {
    auto choice =
        std::make_unique<ChoiceState>(state.get(), index, request.prompt, request.stop_strings);
    Sequence& sequence = choice->sequence;
    sequence.choice = index;
    sequence.priority = request.priority;
    sequence.adapter_id = request.adapter_id;
    sequence.cache_namespace = cache_namespace;
    sequence.num_prompt_tokens = num_prompt_tokens;
    sequence.arrival = arrival;
    if (index == 0) {
      // Choice 0 prefills the prompt for every choice; the others fork from it.
      sequence.tokens = request.prompt;
      sequence.wants_prompt_logits = request.prompt_logprobs;
      sequence.num_pending_forks = request.num_choices - 1;
    }
    if (constraint != nullptr) {
      choice->constraint =
          index + 1 == request.num_choices ? std::move(constraint) : constraint->clone();
    }
    state->choices.push_back(std::move(choice));
  }
  // Read before the lock: the runner answers from its own state (any thread).
  const bool runner_available = runner_.available();
  RequestId id;
  {
    MutexLock lock(inbox_mutex_);
    if (!accepting_) {
      return failed_precondition("the engine is stopped and accepts no more requests");
    }
    // Acquire: pairs with the driving thread's release in enter_runner_unavailable(), which
    // sets unavailable_cause_ under this lock first.
    if (runner_unavailable_.load(std::memory_order_acquire) || !runner_available) {
      return unavailable(
          "the model's step runner is unavailable ({}); requests are accepted again once it "
          "recovers (retried every {:.3g} s)",
          unavailable_cause_.empty() ? "it lost a worker and has not recovered yet"
                                     : unavailable_cause_,
          to_seconds(options_.recovery_retry_interval));
    }
    id = RequestId(next_request_id_++);
    state->id = id;
    // Unseeded requests still get a reproducible stream: the engine seed mixed with the id.
    const uint64_t seed = request.sampling.seed.value_or(
        SplitMix64(options_.seed ^ (static_cast<uint64_t>(id.value()) << 32)).next());
    for (const std::unique_ptr<ChoiceState>& choice : state->choices) {
      Sequence& sequence = choice->sequence;
      sequence.request = id;
      sequence.seq = kv::SeqId(next_seq_id_++);
      sequence.arrival_order = id.value();
      choice->generator = Xoshiro256StarStar(choice_seed(seed, choice->index));
    }
    // Counted before the driving thread can see (and finish) the request.
    metrics_.on_submitted(num_prompt_tokens, request.num_choices);
    // Release: pairs with the acquire in health(); before the driving thread can decrement it.
    num_unfinished_requests_.fetch_add(1, std::memory_order_release);
    // The driving thread may take and finish the request as soon as the lock is released.
    submissions_.push_back(std::move(state));
  }
  inbox_changed_.notify_one();
  return id;
}

void Engine::cancel(RequestId request) {
  {
    MutexLock lock(inbox_mutex_);
    cancellations_.push_back(request);
  }
  inbox_changed_.notify_one();
}

void Engine::start() {
  {
    MutexLock lock(inbox_mutex_);
    FOLIO_CHECK(!stop_requested_, "an engine cannot be restarted after stop()");
  }
  FOLIO_CHECK(!loop_thread_.joinable(), "the engine loop is already running");
  loop_thread_ = std::thread([this] { loop(); });
}

void Engine::stop() {
  FOLIO_CHECK(!loop_thread_.joinable() || std::this_thread::get_id() != loop_thread_.get_id(),
              "Engine::stop() called from a request callback on the engine thread");
  {
    MutexLock lock(inbox_mutex_);
    stop_requested_ = true;
    accepting_ = false;
  }
  inbox_changed_.notify_all();
  if (loop_thread_.joinable()) loop_thread_.join();
  // This thread drives from here on: end whatever is left.
  drain_inbox();
  std::vector<RequestId> unfinished;
  unfinished.reserve(requests_.size());
  for (const auto& [id, state] : requests_) unfinished.push_back(id);
  std::sort(unfinished.begin(), unfinished.end());
  for (RequestId id : unfinished) {
    finish_request(id, FinishReason::kError,
                   unavailable("the engine stopped before the request finished"));
  }
  report_state();
}

void Engine::loop() {
  while (true) {
    const bool busy = scheduler_->has_unfinished();
    // Relaxed: this thread is the only one that stores it.
    const bool retrying = runner_unavailable_.load(std::memory_order_relaxed);
    {
      MutexLock lock(inbox_mutex_);
      const auto ready = [&]() FOLIO_REQUIRES(inbox_mutex_) {
        return stop_requested_ || busy || !submissions_.empty() || !cancellations_.empty();
      };
      if (retrying) {
        // Every request has ended and submit() refuses: wait for the next attempt at recovery
        // (a submission that raced the refusal is taken and ended at once).
        note_idle();
        lock.wait_for(inbox_changed_, options_.recovery_retry_interval,
                      [&]() FOLIO_REQUIRES(inbox_mutex_) {
                        return stop_requested_ || !submissions_.empty();
                      });
      } else if (!ready()) {
        note_idle();
        lock.wait(inbox_changed_, ready);
      }
      if (stop_requested_) return;
    }
    note_progress();  // awake: from here on a step that never returns shows in health()
    if (step_once() || !scheduler_->has_unfinished()) continue;
    // Work is left but nothing could run (waiting requests need memory another owner holds):
    // wait a little for the inbox rather than spin.
    MutexLock lock(inbox_mutex_);
    lock.wait_for(inbox_changed_, std::chrono::milliseconds(1), [&]() FOLIO_REQUIRES(inbox_mutex_) {
      return stop_requested_ || !submissions_.empty() || !cancellations_.empty();
    });
  }
}

void Engine::drain_inbox() {
  std::vector<std::unique_ptr<RequestState>> submissions;
  std::vector<RequestId> cancellations;
  {
    MutexLock lock(inbox_mutex_);
    submissions.swap(submissions_);
    cancellations.swap(cancellations_);
  }
  for (std::unique_ptr<RequestState>& state : submissions) accept(std::move(state));
  for (RequestId id : cancellations) finish_request(id, FinishReason::kCancelled, Status());
}

void Engine::accept(std::unique_ptr<RequestState> state) {
  if (text_decoder_factory_) {
    for (std::unique_ptr<ChoiceState>& choice : state->choices) {
      choice->decoder = text_decoder_factory_();
    }
  }
  Sequence* sequence = &state->choices.front()->sequence;
  requests_.emplace(state->id, std::move(state));
  scheduler_->add(sequence);
}

void Engine::finish_request(RequestId id, FinishReason reason, const Status& error) {
  // Each finish may end the request (and so destroy its state): look it up again every time.
  while (true) {
    const auto entry = requests_.find(id);
    if (entry == requests_.end()) return;
    for (const std::unique_ptr<ChoiceState>& choice : entry->second->choices) {
      if (!choice->finished) {
        finish(*choice, reason, error);
        break;
      }
    }
  }
}

void Engine::note_progress() {
  // Release: pairs with the acquire in health().
  progress_nanoseconds_.store(clock_.now().time_since_epoch().count(), std::memory_order_release);
}

void Engine::note_idle() {
  // Release: pairs with the acquire in health().
  progress_nanoseconds_.store(kIdleProgress, std::memory_order_release);
}

EngineHealth Engine::health() const {
  EngineHealth health;
  // Acquire: pairs with the release stores in enter_runner_unavailable() / restore_runner().
  health.runner_available =
      !runner_unavailable_.load(std::memory_order_acquire) && runner_.available();
  // Acquire: pairs with the release increments in submit() and decrements in finish().
  health.has_work = num_unfinished_requests_.load(std::memory_order_acquire) > 0;
  // Acquire: pairs with the release stores in note_progress() and note_idle().
  const int64_t progress = progress_nanoseconds_.load(std::memory_order_acquire);
  if (progress != kIdleProgress) {
    const Duration since = clock_.now().time_since_epoch() - Duration(progress);
    health.seconds_since_progress = std::max(0.0, to_seconds(since));
  }
  return health;
}

bool Engine::has_unfinished_requests() {
  {
    MutexLock lock(inbox_mutex_);
    if (!submissions_.empty()) return true;
  }
  return !requests_.empty();
}

void Engine::check_invariants() const {
  scheduler_->check_invariants();
  kv_cache_.check_cache_invariants();
  int64_t num_scheduled = 0;
  for (const auto& [id, state] : requests_) {
    int32_t num_unfinished = 0;
    FOLIO_CHECK(static_cast<int32_t>(state->choices.size()) == state->num_choices);
    for (const std::unique_ptr<ChoiceState>& choice : state->choices) {
      if (choice->finished) continue;
      ++num_unfinished;
      const bool scheduled = choice->index == 0 || state->forked;
      FOLIO_CHECK(!scheduled || choice->sequence.status != SequenceStatus::kFinished,
                  "unfinished choice {} of request {} has a finished sequence", choice->index, id);
      num_scheduled += scheduled ? 1 : 0;
    }
    FOLIO_CHECK(num_unfinished == state->num_unfinished && num_unfinished > 0,
                "request {}: {} unfinished choices, {} counted", id, num_unfinished,
                state->num_unfinished);
  }
  FOLIO_CHECK(num_scheduled == int64_t{scheduler_->num_waiting()} + scheduler_->num_running() +
                                   scheduler_->num_swapped());
}

}  // namespace folio::engine
