#include "folio/server/structured_output.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "folio/base/check.h"

namespace folio::server {

namespace {

void set_bit(std::vector<uint64_t>& bits, int32_t index) {
  bits[static_cast<size_t>(index) >> 6] |= uint64_t{1} << (index & 63);
}

bool test_bit(const std::vector<uint64_t>& bits, int32_t index) {
  return (bits[static_cast<size_t>(index) >> 6] >> (index & 63)) & 1u;
}

}  // namespace

StructuredOutput::StructuredOutput(std::shared_ptr<const Grammar> grammar,
                                   std::shared_ptr<const VocabularyIndex> vocabulary,
                                   std::vector<int32_t> end_tokens,
                                   const StructuredOutputOptions& options)
    : grammar_(std::move(grammar)),
      vocabulary_(std::move(vocabulary)),
      end_tokens_(std::move(end_tokens)),
      options_(options),
      automaton_(std::make_unique<GrammarAutomaton>(grammar_)),
      state_(automaton_->initial()) {
  FOLIO_CHECK(vocabulary_ != nullptr);
  for (int32_t token : end_tokens_) {
    FOLIO_CHECK(token >= 0 && token < vocabulary_->vocab_size(), "end token {} out of range",
                token);
  }
}

StructuredOutput::StructuredOutput(const StructuredOutput& other)
    : engine::TokenConstraint(),
      grammar_(other.grammar_),
      vocabulary_(other.vocabulary_),
      end_tokens_(other.end_tokens_),
      options_(other.options_),
      automaton_(std::make_unique<GrammarAutomaton>(*other.automaton_)),
      state_(other.state_),
      ended_(other.ended_),
      mask_(other.mask_),
      mask_state_(other.mask_state_),
      memo_(other.memo_),
      allows_plain_(other.allows_plain_),
      stats_(other.stats_) {}

std::unique_ptr<engine::TokenConstraint> StructuredOutput::clone() const {
  return std::make_unique<StructuredOutput>(*this);
}

bool StructuredOutput::is_end_token(int32_t token) const {
  return std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end();
}

bool StructuredOutput::is_complete() const {
  return !ended_ && automaton_->is_complete(state_);
}

bool StructuredOutput::must_end() const {
  return ended_ || (automaton_->is_complete(state_) && !automaton_->can_continue(state_));
}

bool StructuredOutput::allows_every_plain_token(AutomatonState state) {
  if (static_cast<size_t>(state) >= allows_plain_.size()) {
    allows_plain_.resize(static_cast<size_t>(automaton_->num_states()), -1);
  }
  if (allows_plain_[state] < 0) {
    // Breadth first over plain bytes: the states reachable by j plain bytes, for j up to the
    // longest plain token; any dead end refuses some plain token. When the reachable set
    // repeats, every longer plain string stays alive too (inside an unbounded string the set
    // is {state} at once). More than a few states in play: give up and walk.
    constexpr size_t kMaxFrontier = 4;
    const ByteSet plain = VocabularyIndex::plain_bytes();
    std::vector<AutomatonState> frontier = {state};
    std::vector<AutomatonState> reached;
    bool allowed = true;
    for (int32_t length = 0; allowed && length < vocabulary_->plain_max_length(); ++length) {
      reached.clear();
      for (AutomatonState from : frontier) {
        for (int byte = 0; byte < 256 && allowed; ++byte) {
          if (!plain.contains(static_cast<uint8_t>(byte))) continue;
          const AutomatonState to = automaton_->next(from, static_cast<uint8_t>(byte));
          allowed = to != kDeadState;
          reached.push_back(to);
        }
      }
      std::sort(reached.begin(), reached.end());
      reached.erase(std::unique(reached.begin(), reached.end()), reached.end());
      if (reached.size() > kMaxFrontier) allowed = false;
      if (reached == frontier) break;
      frontier.swap(reached);
    }
    // next() adds automaton states but never resizes allows_plain_, so indexing again is safe.
    allows_plain_[state] = allowed ? 1 : 0;
  }
  return allows_plain_[state] == 1;
}

void StructuredOutput::compute_allowed_tokens(std::vector<uint64_t>& mask) {
  ++stats_.masks_computed;
  const bool shortcut = options_.plain_token_shortcut && allows_every_plain_token(state_);
  const VocabularyIndex::Trie& trie =
      shortcut ? vocabulary_->non_plain_trie() : vocabulary_->trie();
  if (shortcut) {
    ++stats_.plain_shortcuts;
    mask = vocabulary_->plain_tokens();
  } else {
    mask.assign((static_cast<size_t>(vocabulary_->vocab_size()) + 63) / 64, 0);
  }
  const std::vector<VocabularyIndex::TrieNode>& nodes = trie.nodes;
  const std::vector<int32_t>& tokens = trie.tokens;
  walk_states_.resize(static_cast<size_t>(trie.max_depth) + 1);
  walk_states_[0] = state_;
  GrammarAutomaton& automaton = *automaton_;
  const auto num_nodes = static_cast<int32_t>(nodes.size());
  int64_t visited = 0;
  for (int32_t i = 1; i < num_nodes;) {
    const VocabularyIndex::TrieNode& node = nodes[i];
    ++visited;
    const AutomatonState next = automaton.next(walk_states_[node.depth - 1], node.byte);
    if (next == kDeadState) {
      i = node.subtree_end;  // no token with this prefix can be allowed
      continue;
    }
    walk_states_[node.depth] = next;
    for (int32_t k = node.tokens_begin; k < node.tokens_end; ++k) set_bit(mask, tokens[k]);
    ++i;
  }
  stats_.trie_nodes_visited += visited;
  const bool complete = automaton.is_complete(state_);
  for (int32_t token : end_tokens_) {
    mask[static_cast<size_t>(token) >> 6] &= ~(uint64_t{1} << (token & 63));
  }
  if (complete) {
    for (int32_t token : end_tokens_) set_bit(mask, token);
  }
}

const std::vector<uint64_t>& StructuredOutput::allowed_tokens() {
  if (ended_) {
    // After an end token only end tokens remain: must_end() is already true.
    mask_.assign((static_cast<size_t>(vocabulary_->vocab_size()) + 63) / 64, 0);
    for (int32_t token : end_tokens_) set_bit(mask_, token);
    mask_state_ = kDeadState;
    return mask_;
  }
  if (!options_.memoize_masks) {
    if (mask_state_ != state_) {
      compute_allowed_tokens(mask_);
      mask_state_ = state_;
    }
    return mask_;
  }
  auto it = memo_.find(state_);
  if (it != memo_.end()) {
    ++stats_.masks_memoized;
    return it->second;
  }
  if (static_cast<int32_t>(memo_.size()) >= options_.max_memoized_masks) memo_.clear();
  std::vector<uint64_t>& mask = memo_[state_];
  compute_allowed_tokens(mask);
  return mask;
}

bool StructuredOutput::is_allowed(int32_t token) {
  if (token < 0 || token >= vocabulary_->vocab_size()) return false;
  return test_bit(allowed_tokens(), token);
}

void StructuredOutput::mask_logits(std::span<float> logits) {
  const std::vector<uint64_t>& allowed = allowed_tokens();
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  const size_t vocab = std::min(logits.size(), static_cast<size_t>(vocabulary_->vocab_size()));
  for (size_t word = 0; word * 64 < vocab; ++word) {
    const uint64_t bits = allowed[word];
    if (bits == ~uint64_t{0}) continue;
    const size_t end = std::min(vocab, word * 64 + 64);
    if (bits == 0) {  // the common case outside strings: a plain fill the compiler vectorizes
      std::fill(logits.begin() + static_cast<ptrdiff_t>(word * 64),
                logits.begin() + static_cast<ptrdiff_t>(end), kMasked);
      continue;
    }
    // Visit only the refused bits: a per-bit test would branch on a pattern no predictor learns.
    uint64_t refused = ~bits;
    if (end - word * 64 < 64) refused &= (uint64_t{1} << (end - word * 64)) - 1;
    while (refused != 0) {
      logits[word * 64 + static_cast<size_t>(__builtin_ctzll(refused))] = kMasked;
      refused &= refused - 1;
    }
  }
  // Rows padded past the tokenizer's vocabulary are never valid tokens.
  for (size_t t = vocab; t < logits.size(); ++t) logits[t] = kMasked;
}

Status StructuredOutput::accept(int32_t token) {
  if (token < 0 || token >= vocabulary_->vocab_size()) {
    return invalid_argument("token {} is outside the vocabulary of {} tokens", token,
                            vocabulary_->vocab_size());
  }
  if (ended_) return invalid_argument("token {} after the structured output ended", token);
  if (is_end_token(token)) {
    if (!automaton_->is_complete(state_)) {
      return invalid_argument("end token {} before the structured output is complete", token);
    }
    ended_ = true;
    return Status();
  }
  const std::string_view bytes = vocabulary_->token_bytes(token);
  if (bytes.empty()) {
    return invalid_argument(
        "token {} (a special or empty token) cannot appear in structured output", token);
  }
  const AutomatonState next = automaton_->next(state_, bytes);
  if (next == kDeadState) {
    return invalid_argument("token {} ({}) does not continue the structured output", token,
                            quoted_bytes(bytes));
  }
  state_ = next;
  if (automaton_->num_states() > options_.max_automaton_states) {
    state_ = automaton_->reset_keeping(state_);
    memo_.clear();
    allows_plain_.clear();
    mask_state_ = kDeadState;
  }
  return Status();
}

Result<std::unique_ptr<engine::TokenConstraint>> make_structured_output(
    std::shared_ptr<const Grammar> grammar, std::shared_ptr<const VocabularyIndex> vocabulary,
    std::vector<int32_t> end_tokens, const StructuredOutputOptions& options) {
  if (grammar == nullptr) return invalid_argument("structured output needs a grammar");
  if (vocabulary == nullptr) return invalid_argument("structured output needs a vocabulary index");
  for (int32_t token : end_tokens) {
    if (token < 0 || token >= vocabulary->vocab_size()) {
      return invalid_argument("end token {} is outside the vocabulary of {} tokens", token,
                              vocabulary->vocab_size());
    }
  }
  auto constraint = std::make_unique<StructuredOutput>(std::move(grammar), std::move(vocabulary),
                                                       std::move(end_tokens), options);
  const std::vector<uint64_t>& allowed = constraint->allowed_tokens();
  if (std::all_of(allowed.begin(), allowed.end(), [](uint64_t word) { return word == 0; })) {
    return failed_precondition(
        "no token of the vocabulary can start the structured output (and it may not be empty)");
  }
  return std::unique_ptr<engine::TokenConstraint>(std::move(constraint));
}

}  // namespace folio::server
