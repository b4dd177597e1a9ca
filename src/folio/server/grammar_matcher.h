// GrammarAutomaton: the incremental, byte-level matcher of a Grammar (grammar.h), a pushdown
// automaton whose reachable configurations are discovered lazily and cached as the states of a
// deterministic automaton. GrammarMatcher: one position in it, for callers that feed bytes.
//
// Terms:
//   - A *stack* is a list of grammar positions (element indices): the top is the byte set to
//     match next, the others are where to resume when the rule above them ends. Stacks are
//     persistent linked lists of *nodes* (position, parent node); nodes are hash-consed, so two
//     equal stacks are the same node id and a rule's recursion shares the stack below it.
//   - A *state* is the set of stacks the text so far can be in (the grammar may be ambiguous
//     until more bytes arrive), plus a *complete* mark when the text so far is in the language.
//     States are hash-consed too: equal sets are one state id, so callers can memoize anything
//     that depends only on the set (the token mask, structured_output.h).
//   - next(state, byte) is the state after one more byte, or kDeadState; each answer is cached
//     per state and byte, so a walk that repeats (a string's characters) costs a table lookup.
//   - Expansion: the top of a stack always points at a byte set. A reference pushes its return
//     position and continues at each alternative; the end of an alternative pops. A reference in
//     tail position (last in its alternative) pushes nothing, so repetition written as
//     `rest ::= item rest | ""` runs in constant stack depth and inside a string the state
//     repeats exactly.
//
// Invariants: state ids are dense from 0; a state never changes once interned; num_states()
// only grows until reset_keeping(); the grammar is left-recursion free (Grammar's invariant), so
// expansion terminates.
//
// Thread-safety: none; an automaton belongs to one constraint (one choice of one request).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "folio/server/grammar.h"

namespace folio::server {

using AutomatonState = int32_t;
inline constexpr AutomatonState kDeadState = -1;

class GrammarAutomaton {
 public:
  explicit GrammarAutomaton(std::shared_ptr<const Grammar> grammar);

  const std::shared_ptr<const Grammar>& grammar() const { return grammar_; }
  AutomatonState initial() const { return initial_; }

  // The state after `byte`, or kDeadState when no text in the language continues that way.
  // Requires: state is a live state of this automaton.
  AutomatonState next(AutomatonState state, uint8_t byte) {
    const size_t slot = static_cast<size_t>(state) * 256 + byte;
    if (transitions_[slot] != kUnknown) return transitions_[slot];
    // compute_next may grow transitions_, so the slot is written by index afterwards.
    const AutomatonState computed = compute_next(state, byte);
    transitions_[slot] = computed;
    return computed;
  }
  // The state after every byte of `text`, or kDeadState.
  AutomatonState next(AutomatonState state, std::string_view text);

  // The text so far is in the language.
  bool is_complete(AutomatonState state) const { return states_[state].complete; }
  // Some byte may follow (false only for a complete state that nothing can extend).
  bool can_continue(AutomatonState state) const { return !states_[state].first_bytes.empty(); }
  // The bytes that may follow.
  const ByteSet& first_bytes(AutomatonState state) const { return states_[state].first_bytes; }

  int32_t num_states() const { return static_cast<int32_t>(states_.size()); }
  size_t num_stack_nodes() const { return nodes_.size(); }
  // Approximate heap bytes held by the caches.
  size_t memory_bytes() const;

  // Forgets every state and node except those `state` needs, and returns its new id (the only
  // state then). Bounds memory for long generations; every other state id becomes invalid.
  AutomatonState reset_keeping(AutomatonState state);

 private:
  static constexpr int32_t kUnknown = -2;
  static constexpr int32_t kNoParent = -1;
  static constexpr int32_t kCompleteMark = -1;  // in a state's stack list: the text may end here

  struct Node {
    int32_t position;  // element index; for a top node, a kBytes element
    int32_t parent;    // node id, or kNoParent
  };
  struct StateInfo {
    std::vector<int32_t> stacks;  // sorted top node ids (kCompleteMark first when complete)
    ByteSet first_bytes;
    bool complete;
  };
  struct StacksHash {
    size_t operator()(const std::vector<int32_t>& stacks) const;
  };

  int32_t intern_node(int32_t position, int32_t parent);
  AutomatonState intern_state(std::vector<int32_t> stacks);
  // Appends to `out` the normalized stacks for "continue at position over parent".
  void expand(int32_t position, int32_t parent, std::vector<int32_t>& out);
  AutomatonState compute_next(AutomatonState state, uint8_t byte);

  std::shared_ptr<const Grammar> grammar_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_index_;
  std::vector<StateInfo> states_;
  std::unordered_map<std::vector<int32_t>, AutomatonState, StacksHash> state_index_;
  std::vector<int32_t> transitions_;  // [num_states * 256]: state, kDeadState or kUnknown
  AutomatonState initial_ = kDeadState;
};

// A byte-at-a-time cursor over an automaton it owns: for tests and for callers without a
// vocabulary.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar)
      : automaton_(std::make_unique<GrammarAutomaton>(std::move(grammar))),
        state_(automaton_->initial()) {}

  // Advances past every byte of `text`; false (and no change) when some byte is not allowed.
  bool accept(std::string_view text);
  bool is_complete() const { return automaton_->is_complete(state_); }
  bool can_continue() const { return automaton_->can_continue(state_); }
  // Whether `text` as a whole is in the language (from the matcher's start, state unchanged).
  bool matches(std::string_view text);

 private:
  std::unique_ptr<GrammarAutomaton> automaton_;
  AutomatonState state_;
};

}  // namespace folio::server
