#include "folio/server/grammar_matcher.h"

#include <algorithm>
#include <utility>

#include "folio/base/check.h"

namespace folio::server {

using Kind = Grammar::Element::Kind;

size_t GrammarAutomaton::StacksHash::operator()(const std::vector<int32_t>& stacks) const {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (int32_t id : stacks) {
    hash ^= static_cast<uint32_t>(id);
    hash *= 0x100000001b3ull;
  }
  return static_cast<size_t>(hash);
}

GrammarAutomaton::GrammarAutomaton(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)) {
  FOLIO_CHECK(grammar_ != nullptr);
  std::vector<int32_t> stacks;
  expand(0, kNoParent, stacks);  // element 0 references the root
  initial_ = intern_state(std::move(stacks));
}

int32_t GrammarAutomaton::intern_node(int32_t position, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(position)) << 32) |
                       static_cast<uint32_t>(parent);
  auto [it, inserted] = node_index_.emplace(key, static_cast<int32_t>(nodes_.size()));
  if (inserted) nodes_.push_back(Node{.position = position, .parent = parent});
  return it->second;
}

void GrammarAutomaton::expand(int32_t position, int32_t parent, std::vector<int32_t>& out) {
  const std::vector<Grammar::Element>& elements = grammar_->elements();
  const Grammar::Element& element = elements[position];
  switch (element.kind) {
    case Kind::kBytes:
      out.push_back(intern_node(position, parent));
      return;
    case Kind::kEnd:
      if (parent == kNoParent) {
        out.push_back(kCompleteMark);
      } else {
        const Node resume = nodes_[parent];
        expand(resume.position, resume.parent, out);
      }
      return;
    case Kind::kRule: {
      // Tail call: returning to a kEnd would only pop again, so the caller's frame is reused.
      const int32_t return_to =
          elements[position + 1].kind == Kind::kEnd ? parent : intern_node(position + 1, parent);
      for (int32_t start : grammar_->alternatives(element.value)) expand(start, return_to, out);
      return;
    }
  }
}

AutomatonState GrammarAutomaton::intern_state(std::vector<int32_t> stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.empty()) return kDeadState;
  auto it = state_index_.find(stacks);
  if (it != state_index_.end()) return it->second;
  StateInfo info{.stacks = stacks, .first_bytes = ByteSet(), .complete = false};
  for (int32_t stack : stacks) {
    if (stack == kCompleteMark) {
      info.complete = true;
      continue;
    }
    const Grammar::Element& top = grammar_->elements()[nodes_[stack].position];
    info.first_bytes.add_all(grammar_->byte_sets()[top.value]);
  }
  const auto id = static_cast<AutomatonState>(states_.size());
  states_.push_back(std::move(info));
  transitions_.resize(transitions_.size() + 256, kUnknown);
  state_index_.emplace(std::move(stacks), id);
  return id;
}

AutomatonState GrammarAutomaton::compute_next(AutomatonState state, uint8_t byte) {
  if (!states_[state].first_bytes.contains(byte)) return kDeadState;
  std::vector<int32_t> out;
  for (int32_t stack : states_[state].stacks) {  // expand() adds nodes, never states
    if (stack == kCompleteMark) continue;
    const Node node = nodes_[stack];
    const Grammar::Element& top = grammar_->elements()[node.position];
    if (grammar_->byte_sets()[top.value].contains(byte))
      expand(node.position + 1, node.parent, out);
  }
  return intern_state(std::move(out));
}

AutomatonState GrammarAutomaton::next(AutomatonState state, std::string_view text) {
  for (char c : text) {
    if (state == kDeadState) return kDeadState;
    state = next(state, static_cast<uint8_t>(c));
  }
  return state;
}

size_t GrammarAutomaton::memory_bytes() const {
  size_t bytes = nodes_.capacity() * sizeof(Node) + transitions_.capacity() * sizeof(int32_t) +
                 node_index_.size() * 32;
  for (const StateInfo& info : states_) bytes += sizeof(StateInfo) + 2 * info.stacks.size() * 4;
  return bytes + state_index_.size() * 48;
}

AutomatonState GrammarAutomaton::reset_keeping(AutomatonState state) {
  FOLIO_CHECK(state >= 0 && state < num_states());
  const std::vector<Node> old_nodes = std::move(nodes_);
  const std::vector<int32_t> old_stacks = states_[state].stacks;
  nodes_.clear();
  node_index_.clear();
  states_.clear();
  state_index_.clear();
  transitions_.clear();
  // Re-interns an old node's chain, bottom first, into the fresh tables.
  auto copy_node = [&](int32_t old_id) {
    std::vector<int32_t> chain;
    for (int32_t id = old_id; id != kNoParent; id = old_nodes[id].parent) chain.push_back(id);
    int32_t parent = kNoParent;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      parent = intern_node(old_nodes[*it].position, parent);
    }
    return parent;
  };
  std::vector<int32_t> stacks;
  for (int32_t stack : old_stacks)
    stacks.push_back(stack == kCompleteMark ? stack : copy_node(stack));
  const AutomatonState kept = intern_state(std::move(stacks));
  // The initial state is re-derived lazily only if asked for again; keep it valid.
  std::vector<int32_t> initial_stacks;
  expand(0, kNoParent, initial_stacks);
  initial_ = intern_state(std::move(initial_stacks));
  return kept;
}

bool GrammarMatcher::accept(std::string_view text) {
  const AutomatonState next = automaton_->next(state_, text);
  if (next == kDeadState) return false;
  state_ = next;
  return true;
}

bool GrammarMatcher::matches(std::string_view text) {
  const AutomatonState end = automaton_->next(automaton_->initial(), text);
  return end != kDeadState && automaton_->is_complete(end);
}

}  // namespace folio::server
