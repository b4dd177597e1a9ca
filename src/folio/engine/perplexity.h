// Perplexity: how well a model predicts a text, the engine's end-to-end correctness check
// (docs/notes/perplexity.md). Perplexity = exp(mean negative log-likelihood per token); a model
// that predicts every token with probability 1/k has perplexity k.
//
// Definition (the one the PyTorch reference and the training scripts compute):
//   tokens = [BOS] + encode(text)   (the whole text at once, no special-token parsing)
//   With N tokens, context C and stride S: for begin = 0, S, 2S, ... while begin + 1 < N:
//     end = min(begin + C, N); the model sees tokens [begin, end) as one fresh sequence
//     (positions 0 .. end - begin - 1) and scores every position p in
//     [max(begin + 1, previous end), end) with -log softmax(logits at p - 1)[token p],
//     computed in double from the f32 logits; previous end = end; stop once end == N.
//   Perplexity = exp(mean NLL over every scored token).
// Each window scores only tokens no earlier window scored, so with S < C every token after the
// first is scored exactly once, with at least C - S tokens of context once the first window is
// past. With S == C the windows do not overlap and the first token of each later window has no
// context inside its window, so it is not scored.
//
// A window runs through the real engine machinery: a sequence in the paged KV cache (allocated
// for the whole window, never served from or offered to the prefix cache, freed after it) and
// the graph executor, in chunks of at most `chunk_tokens` (chunked prefill), each asking for the
// logits of its scored positions. A window's last token is the input to no scored position, so
// it is not run: a window costs end - begin - 1 evaluated tokens.
//
// Thread-safety: compute_perplexity drives the engine's executor and block manager on the
// calling thread, so the engine's loop thread must not be running meanwhile.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "folio/base/result.h"
#include "folio/engine/model_engine.h"
#include "folio/tokenizer/tokenizer.h"

namespace folio::engine {

// One window of the evaluation: tokens [begin, end) run as one sequence; positions
// [first_scored, end) are scored.
struct PerplexityWindow {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t first_scored = 0;

  friend bool operator==(const PerplexityWindow&, const PerplexityWindow&) = default;
};

struct PerplexityProgress {
  int32_t windows_done = 0;
  int32_t num_windows = 0;
  int64_t tokens_evaluated = 0;  // so far, overlap included
  double seconds = 0;            // since the first window began
};

struct PerplexityOptions {
  int32_t context = 0;       // C; 0: the engine's context limit (the model's context length)
  int32_t stride = 0;        // S; 0: C / 2
  int32_t chunk_tokens = 0;  // most tokens per executor step; 0: the executor's logit rows
  // The adapter the model runs with (0: the base model); needs an engine with adapters.
  int64_t adapter_id = 0;
  // Called after every window (on the calling thread); may be empty.
  std::function<void(const PerplexityProgress&)> on_window;
};

struct PerplexityResult {
  double perplexity = 0;  // exp(mean_nll)
  double mean_nll = 0;    // nats per scored token
  int64_t num_tokens = 0;
  int64_t num_scored_tokens = 0;
  int32_t num_windows = 0;
  int64_t num_evaluated_tokens = 0;  // run through the model, overlap included
  int32_t context = 0;               // C and S as resolved from the options
  int32_t stride = 0;
  double seconds = 0;  // wall time of the windows

  double tokens_per_second() const { return seconds > 0 ? num_evaluated_tokens / seconds : 0; }
};

// The windows of the definition above. Errors (kInvalidArgument): fewer than 2 tokens, context
// < 2, stride < 1 or > context.
Result<std::vector<PerplexityWindow>> plan_perplexity_windows(int64_t num_tokens, int32_t context,
                                                              int32_t stride);

// tokens = [BOS] + encode(text) without special-token parsing (no BOS when the vocabulary has
// none). Errors: an empty text.
Result<std::vector<int32_t>> perplexity_tokens(const tokenizer::Tokenizer& tokenizer,
                                               std::string_view text);

// The perplexity of `tokens` (BOS included) under `model_engine`'s model. Errors
// (kInvalidArgument, nothing changed): fewer than 2 tokens, a token outside the vocabulary, a
// context < 2 or above the engine's context limit, a stride < 1 or above the context, a
// chunk size < 1; kResourceExhausted when a window does not fit the KV cache; any executor error.
// Requires: the engine's loop thread is not running.
Result<PerplexityResult> compute_perplexity(ModelEngine& model_engine,
                                            std::span<const int32_t> tokens,
                                            const PerplexityOptions& options);

// compute_perplexity over perplexity_tokens(model's tokenizer, text).
Result<PerplexityResult> compute_text_perplexity(ModelEngine& model_engine, std::string_view text,
                                                 const PerplexityOptions& options);

}  // namespace folio::engine
