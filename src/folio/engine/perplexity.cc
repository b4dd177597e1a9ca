#include "folio/engine/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "folio/kv/block_manager.h"

namespace folio::engine {
namespace {

// The sequence id windows run under; the engine's own requests are not running meanwhile, and
// each window frees it before the next allocates it again.
constexpr kv::SeqId kPerplexitySequence{std::numeric_limits<int64_t>::max() - 1};

// -log softmax(logits)[target], in double. logits: f32 [vocab].
double negative_log_likelihood(std::span<const float> logits, int32_t target) {
  double largest = -std::numeric_limits<double>::infinity();
  for (float logit : logits) largest = std::max(largest, static_cast<double>(logit));
  double sum = 0;
  for (float logit : logits) sum += std::exp(static_cast<double>(logit) - largest);
  return std::log(sum) + largest - static_cast<double>(logits[static_cast<size_t>(target)]);
}

// Frees the window's sequence however the window ends, so an error leaves the cache as it was.
class WindowSequence {
 public:
  explicit WindowSequence(kv::BlockManager& block_manager) : block_manager_(block_manager) {}
  WindowSequence(const WindowSequence&) = delete;
  WindowSequence& operator=(const WindowSequence&) = delete;
  ~WindowSequence() {
    if (allocated_) {
      const Status freed = block_manager_.free(kPerplexitySequence);
      FOLIO_CHECK(freed.ok(), "freeing the perplexity window: {}", freed.to_string());
    }
  }

  // Allocates blocks for every token of the window, with no prefix-cache hits (each position's
  // logits are needed, so every token must run) and no watermark (nothing else is running).
  Status allocate(std::span<const int32_t> tokens) {
    kv::BlockAllocationRequest request;
    request.tokens = tokens;
    request.max_hit_tokens = 0;
    request.apply_watermark = false;
    FOLIO_ASSIGN_OR_RETURN(kv::BlockManager::Reservation reservation,
                           block_manager_.prepare_allocate(kPerplexitySequence, request));
    if (!reservation.is_open()) {
      return resource_exhausted(
          "a window of {} tokens does not fit the KV cache; raise the memory budget "
          "(--memory-mib) or lower the context",
          tokens.size());
    }
    block_manager_.commit(std::move(reservation));
    allocated_ = true;
    return Status();
  }

 private:
  kv::BlockManager& block_manager_;
  bool allocated_ = false;
};

// Runs windows through the executor, reusing the step arrays from chunk to chunk.
class WindowEvaluator {
 public:
  WindowEvaluator(ModelEngine& model_engine, int32_t chunk_tokens, int32_t adapter_slot)
      : block_manager_(model_engine.block_manager()),
        executor_(model_engine.executor()),
        chunk_tokens_(chunk_tokens),
        adapter_slot_(adapter_slot),
        block_tables_(static_cast<size_t>(executor_.limits().max_blocks_per_sequence)) {}

  // Adds the NLL of the window's scored tokens to `nll_sum`; returns the tokens it ran.
  Result<int64_t> evaluate(std::span<const int32_t> tokens, const PerplexityWindow& window,
                           double& nll_sum) {
    const auto window_tokens = tokens.subspan(static_cast<size_t>(window.begin),
                                              static_cast<size_t>(window.end - window.begin));
    WindowSequence sequence(block_manager_);
    FOLIO_RETURN_IF_ERROR(sequence.allocate(window_tokens));
    FOLIO_RETURN_IF_ERROR(block_manager_.fill_block_tables(
        std::span(&kPerplexitySequence, 1), executor_.limits().max_blocks_per_sequence,
        block_tables_));
    // Window-relative positions whose logits score a token: [first_row, last_row).
    const auto first_row = static_cast<int32_t>(window.first_scored - 1 - window.begin);
    const auto last_row = static_cast<int32_t>(window.end - 1 - window.begin);
    for (int32_t start = 0; start < last_row; start += chunk_tokens_) {
      const int32_t count = std::min(chunk_tokens_, last_row - start);
      FOLIO_RETURN_IF_ERROR(run_chunk(window_tokens, start, count, first_row, nll_sum));
    }
    return int64_t{last_row};
  }

 private:
  // Runs window positions [start, start + count) over the KV of the earlier ones.
  Status run_chunk(std::span<const int32_t> window_tokens, int32_t start, int32_t count,
                   int32_t first_row, double& nll_sum) {
    positions_.resize(static_cast<size_t>(count));
    slots_.resize(static_cast<size_t>(count));
    logit_indices_.clear();
    for (int32_t i = 0; i < count; ++i) {
      positions_[static_cast<size_t>(i)] = start + i;
      if (start + i >= first_row) logit_indices_.push_back(i);
    }
    const kv::StepSegment segment{kPerplexitySequence, start, count};
    FOLIO_RETURN_IF_ERROR(block_manager_.fill_slot_mapping(std::span(&segment, 1), slots_));
    const int32_t query_start[] = {0, count};
    const int32_t context_length = start + count;
    const ir::StepBatch step{
        window_tokens.subspan(static_cast<size_t>(start), static_cast<size_t>(count)),
        positions_,
        slots_,
        query_start,
        std::span(&context_length, 1),
        block_tables_,
        logit_indices_,
        {},
        executor_.limits().max_blocks_per_sequence,
        adapter_slot_ == 0 ? std::span<const int32_t>() : std::span(&adapter_slot_, 1)};
    FOLIO_ASSIGN_OR_RETURN(ir::StepOutput output, executor_.execute(step));
    FOLIO_CHECK(output.num_rows == static_cast<int32_t>(logit_indices_.size()),
                "executor returned {} logit rows for {} asked", output.num_rows,
                logit_indices_.size());
    const auto vocab = static_cast<size_t>(output.vocab_size);
    for (size_t row = 0; row < logit_indices_.size(); ++row) {
      // The logits at window position q predict the token at q + 1.
      const int32_t position = start + logit_indices_[row];
      nll_sum += negative_log_likelihood(output.logits.subspan(row * vocab, vocab),
                                         window_tokens[static_cast<size_t>(position) + 1]);
    }
    return Status();
  }

  kv::BlockManager& block_manager_;
  exec::Executor& executor_;
  const int32_t chunk_tokens_;
  const int32_t adapter_slot_;
  std::vector<int32_t> block_tables_;  // i32 [1, max_blocks_per_sequence]
  std::vector<int32_t> positions_;     // i32 [count]
  std::vector<int32_t> slots_;         // i32 [count]
  std::vector<int32_t> logit_indices_;
};

struct ResolvedOptions {
  int32_t context = 0;
  int32_t stride = 0;
  int32_t chunk_tokens = 0;
};

Result<ResolvedOptions> resolve_options(ModelEngine& model_engine,
                                        const PerplexityOptions& options) {
  const int32_t context_limit = model_engine.block_manager().options().max_context_tokens;
  ResolvedOptions resolved;
  resolved.context = options.context == 0 ? context_limit : options.context;
  if (resolved.context < 2 || resolved.context > context_limit) {
    return invalid_argument(
        "context {} must be in [2, {}] (the engine's context limit: the model's context length "
        "unless lowered)",
        resolved.context, context_limit);
  }
  resolved.stride = options.stride == 0 ? std::max(1, resolved.context / 2) : options.stride;
  if (resolved.stride < 1 || resolved.stride > resolved.context) {
    return invalid_argument("stride {} must be in [1, {}] (the context)", resolved.stride,
                            resolved.context);
  }
  const exec::StepLimits& limits = model_engine.executor().limits();
  resolved.chunk_tokens = options.chunk_tokens == 0 ? limits.max_logit_rows : options.chunk_tokens;
  if (resolved.chunk_tokens < 1) {
    return invalid_argument("chunk size {} must be at least 1", resolved.chunk_tokens);
  }
  // A chunk asks for a logits row per token and cannot exceed the step size.
  resolved.chunk_tokens =
      std::min({resolved.chunk_tokens, limits.max_logit_rows, limits.max_tokens});
  return resolved;
}

Status check_tokens(std::span<const int32_t> tokens, int64_t vocab_size) {
  if (tokens.size() < 2) {
    return invalid_argument("perplexity needs at least 2 tokens (BOS and one more), got {}",
                            tokens.size());
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      return invalid_argument("token {} is {}, outside the vocabulary [0, {})", i, tokens[i],
                              vocab_size);
    }
  }
  return Status();
}

}  // namespace

Result<std::vector<PerplexityWindow>> plan_perplexity_windows(int64_t num_tokens, int32_t context,
                                                              int32_t stride) {
  if (num_tokens < 2) {
    return invalid_argument("perplexity needs at least 2 tokens, got {}", num_tokens);
  }
  if (context < 2) return invalid_argument("context {} must be at least 2", context);
  if (stride < 1 || stride > context) {
    return invalid_argument("stride {} must be in [1, {}] (the context)", stride, context);
  }
  std::vector<PerplexityWindow> windows;
  int64_t previous_end = 0;
  for (int64_t begin = 0; begin + 1 < num_tokens; begin += stride) {
    const int64_t end = std::min(begin + context, num_tokens);
    windows.push_back(PerplexityWindow{begin, end, std::max(begin + 1, previous_end)});
    previous_end = end;
    if (end == num_tokens) break;
  }
  return windows;
}

Result<std::vector<int32_t>> perplexity_tokens(const tokenizer::Tokenizer& tokenizer,
                                               std::string_view text) {
  if (text.empty()) return invalid_argument("the text is empty; perplexity needs some text");
  tokenizer::EncodeOptions options;
  options.add_special = false;
  options.parse_special = false;
  const std::vector<tokenizer::TokenId> encoded = tokenizer.encode(text, options);
  std::vector<int32_t> tokens;
  tokens.reserve(encoded.size() + 1);
  if (std::optional<tokenizer::TokenId> bos = tokenizer.bos()) {
    tokens.push_back(static_cast<int32_t>(*bos));
  }
  for (tokenizer::TokenId id : encoded) tokens.push_back(static_cast<int32_t>(id));
  return tokens;
}

Result<PerplexityResult> compute_perplexity(ModelEngine& model_engine,
                                            std::span<const int32_t> tokens,
                                            const PerplexityOptions& options) {
  FOLIO_RETURN_IF_ERROR(check_tokens(tokens, model_engine.model().shape().vocab_size));
  FOLIO_ASSIGN_OR_RETURN(const ResolvedOptions resolved, resolve_options(model_engine, options));
  FOLIO_ASSIGN_OR_RETURN(const std::vector<PerplexityWindow> windows,
                         plan_perplexity_windows(static_cast<int64_t>(tokens.size()),
                                                 resolved.context, resolved.stride));

  PerplexityResult result;
  result.num_tokens = static_cast<int64_t>(tokens.size());
  result.num_windows = static_cast<int32_t>(windows.size());
  result.context = resolved.context;
  result.stride = resolved.stride;
  // The adapter, held for the whole run and bound to a table slot once (this is the only
  // sequence, so the binding cannot change).
  lora::AdapterManager* adapters = model_engine.adapters();
  int32_t adapter_slot = 0;
  if (options.adapter_id != 0) {
    if (adapters == nullptr) {
      return invalid_argument("perplexity with an adapter needs an engine started with adapters");
    }
    for (;;) {
      FOLIO_ASSIGN_OR_RETURN(const lora::AdapterReadiness readiness,
                             adapters->acquire(options.adapter_id));
      if (readiness == lora::AdapterReadiness::kReady) break;
      adapters->wait_for_loads();
    }
    adapter_slot = adapters->bind_step(std::span(&options.adapter_id, 1))[0];
  }
  struct AdapterHold {
    lora::AdapterManager* adapters;
    int64_t id;
    ~AdapterHold() {
      if (id != 0) adapters->release(id);
    }
  } hold{adapters, options.adapter_id};
  WindowEvaluator evaluator(model_engine, resolved.chunk_tokens, adapter_slot);
  double nll_sum = 0;
  const auto start = std::chrono::steady_clock::now();
  PerplexityProgress progress;
  progress.num_windows = result.num_windows;
  for (const PerplexityWindow& window : windows) {
    FOLIO_ASSIGN_OR_RETURN(const int64_t evaluated, evaluator.evaluate(tokens, window, nll_sum));
    result.num_evaluated_tokens += evaluated;
    result.num_scored_tokens += window.end - window.first_scored;
    progress.windows_done += 1;
    progress.tokens_evaluated = result.num_evaluated_tokens;
    progress.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (options.on_window) options.on_window(progress);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.mean_nll = nll_sum / static_cast<double>(result.num_scored_tokens);
  result.perplexity = std::exp(result.mean_nll);
  return result;
}

Result<PerplexityResult> compute_text_perplexity(ModelEngine& model_engine, std::string_view text,
                                                 const PerplexityOptions& options) {
  FOLIO_ASSIGN_OR_RETURN(const std::vector<int32_t> tokens,
                         perplexity_tokens(model_engine.model().tokenizer(), text));
  return compute_perplexity(model_engine, tokens, options);
}

}  // namespace folio::engine
