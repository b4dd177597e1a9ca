// StructuredOutput: the engine::TokenConstraint (engine/token_constraint.h) that keeps a
// generation inside a Grammar (grammar.h; a JSON schema compiled by json_schema_grammar.h, or a
// tool call's envelope composed around one).
//
// Terms: the *mask* is the set of tokens allowed next. A generable token (vocabulary_index.h)
// is allowed when the text so far plus its bytes is a prefix of some text in the language (the
// automaton has a live state after its bytes); an end token is allowed exactly when the text so
// far is complete; control, unknown and unused tokens that are not end tokens never are.
//
// Computing a mask walks the vocabulary's trie with the automaton (grammar_matcher.h): a
// refused prefix skips its subtree, and the automaton caches every transition, so a walk that
// repeats is table lookups. Where every plain token (printable ASCII but '"' and '\\') is
// allowed, as inside a JSON string far enough from its maxLength, only the other tokens' trie
// is walked. A mask depends only on the
// automaton state, and states are hash-consed, so masks are memoized by state (inside a string,
// after a key, at a value start: the same states come back) — up to `max_memoized_masks` masks, the
// memo emptied when full.
//
// must_end(): the text is complete and no byte may follow (or an end token was accepted).
//
// Invariants: the current state is live (accept never moves to a dead state: a refused token
// leaves everything unchanged); every token the mask allows can be accepted; when the state is
// not complete, the mask allows at least one token unless the vocabulary cannot spell any byte
// the grammar allows next (a vocabulary with byte tokens or all 256 byte pieces always can).
//
// Thread-safety: one instance per choice, on the engine's driving thread (as TokenConstraint);
// clone() copies every cache, so clones share nothing mutable. The grammar and the vocabulary
// index are immutable and shared.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "folio/base/result.h"
#include "folio/engine/token_constraint.h"
#include "folio/server/grammar.h"
#include "folio/server/grammar_matcher.h"
#include "folio/server/vocabulary_index.h"

namespace folio::server {

struct StructuredOutputOptions {
  bool memoize_masks = true;
  // In a state from which every string of plain bytes (VocabularyIndex::plain_bytes) as long as
  // the longest plain token stays alive, such as inside a JSON string, allow every plain token
  // at once and walk only the others.
  bool plain_token_shortcut = true;
  int32_t max_memoized_masks = 64;  // 4 KiB each at a 32k vocabulary
  // Past this many cached automaton states (about 1 KiB each) the automaton keeps only the
  // current one and starts over; bounds memory on long generations.
  int32_t max_automaton_states = 16384;
};

struct StructuredOutputStats {
  int64_t masks_computed = 0;  // trie walks
  int64_t masks_memoized = 0;  // answered from the memo
  int64_t trie_nodes_visited = 0;
  int64_t plain_shortcuts = 0;  // walks that took the plain-token shortcut
};

class StructuredOutput final : public engine::TokenConstraint {
 public:
  // Prefer make_structured_output (it validates the arguments).
  StructuredOutput(std::shared_ptr<const Grammar> grammar,
                   std::shared_ptr<const VocabularyIndex> vocabulary,
                   std::vector<int32_t> end_tokens, const StructuredOutputOptions& options);
  StructuredOutput(const StructuredOutput& other);
  StructuredOutput& operator=(const StructuredOutput&) = delete;

  void mask_logits(std::span<float> logits) override;
  Status accept(int32_t token) override;
  bool must_end() const override;
  std::unique_ptr<engine::TokenConstraint> clone() const override;

  // The allowed tokens as a bitset over the vocabulary (bit t of word t / 64).
  const std::vector<uint64_t>& allowed_tokens();
  // Walks the trie for the current state now, bypassing the memo (benchmarks and tests compare
  // the two). Same bitset layout as allowed_tokens().
  void compute_allowed_tokens(std::vector<uint64_t>& mask);
  bool is_allowed(int32_t token);
  // The text so far is a complete match (an end token may come next).
  bool is_complete() const;
  const StructuredOutputStats& stats() const { return stats_; }
  const GrammarAutomaton& automaton() const { return *automaton_; }

 private:
  bool is_end_token(int32_t token) const;
  // Whether every plain token is allowed from `state` (cached per state).
  bool allows_every_plain_token(AutomatonState state);

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const VocabularyIndex> vocabulary_;
  std::vector<int32_t> end_tokens_;
  StructuredOutputOptions options_;
  std::unique_ptr<GrammarAutomaton> automaton_;
  AutomatonState state_;
  bool ended_ = false;  // an end token was accepted
  // Without the memo: the mask of `mask_state_` (kDeadState: none yet); after an end token, the
  // end tokens only.
  std::vector<uint64_t> mask_;
  AutomatonState mask_state_ = kDeadState;
  std::unordered_map<AutomatonState, std::vector<uint64_t>> memo_;
  std::vector<AutomatonState> walk_states_;  // per trie depth, reused between walks
  std::vector<int8_t> allows_plain_;         // per automaton state: -1 unknown, 0 no, 1 yes
  StructuredOutputStats stats_;
};

// The constraint for one choice. kInvalidArgument: a null grammar or vocabulary, an end token
// outside the vocabulary; kFailedPrecondition when no token can start the grammar's text (the
// vocabulary cannot spell it).
Result<std::unique_ptr<engine::TokenConstraint>> make_structured_output(
    std::shared_ptr<const Grammar> grammar, std::shared_ptr<const VocabularyIndex> vocabulary,
    std::vector<int32_t> end_tokens, const StructuredOutputOptions& options = {});

}  // namespace folio::server
