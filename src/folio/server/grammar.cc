#include "folio/server/grammar.h"

#include <algorithm>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "folio/base/check.h"

namespace folio::server {

ByteSet ByteSet::single(uint8_t byte) {
  return ByteSet().add(byte);
}

ByteSet ByteSet::range(uint8_t first, uint8_t last) {
  return ByteSet().add_range(first, last);
}

ByteSet& ByteSet::add(uint8_t byte) {
  words_[byte >> 6] |= uint64_t{1} << (byte & 63);
  return *this;
}

ByteSet& ByteSet::remove(uint8_t byte) {
  words_[byte >> 6] &= ~(uint64_t{1} << (byte & 63));
  return *this;
}

ByteSet& ByteSet::add_range(uint8_t first, uint8_t last) {
  for (int byte = first; byte <= last; ++byte) add(static_cast<uint8_t>(byte));
  return *this;
}

ByteSet& ByteSet::add_all(const ByteSet& other) {
  for (size_t i = 0; i < words_.size(); ++i) words_[i] |= other.words_[i];
  return *this;
}

RuleId GrammarBuilder::add_rule(std::string name) {
  rules_.push_back(Rule{.name = std::move(name), .alternatives = {}});
  return static_cast<RuleId>(rules_.size() - 1);
}

void GrammarBuilder::add_alternative(RuleId rule, std::vector<GrammarSymbol> symbols) {
  FOLIO_CHECK(rule >= 0 && rule < num_rules(), "rule {} was never added", rule);
  for (const GrammarSymbol& symbol : symbols) {
    FOLIO_CHECK(symbol.kind == GrammarSymbol::Kind::kBytes ||
                    (symbol.rule_id >= 0 && symbol.rule_id < num_rules()),
                "reference to rule {} that was never added", symbol.rule_id);
  }
  rules_[rule].alternatives.push_back(std::move(symbols));
}

RuleId GrammarBuilder::add_literal(std::string_view text) {
  const RuleId rule = add_rule(fmt::format("literal {}", quoted_bytes(text)));
  std::vector<GrammarSymbol> symbols;
  symbols.reserve(text.size());
  for (char c : text) symbols.push_back(GrammarSymbol::byte(static_cast<uint8_t>(c)));
  add_alternative(rule, std::move(symbols));
  return rule;
}

RuleId GrammarBuilder::add_grammar(const Grammar& grammar) {
  const RuleId offset = num_rules();
  for (RuleId rule = 0; rule < grammar.num_rules(); ++rule) add_rule(grammar.rule_name(rule));
  for (RuleId rule = 0; rule < grammar.num_rules(); ++rule) {
    for (int32_t start : grammar.alternatives(rule)) {
      std::vector<GrammarSymbol> symbols;
      for (int32_t i = start; grammar.elements()[i].kind != Grammar::Element::Kind::kEnd; ++i) {
        const Grammar::Element& element = grammar.elements()[i];
        switch (element.kind) {
          case Grammar::Element::Kind::kBytes:
            symbols.push_back(GrammarSymbol::bytes(grammar.byte_sets()[element.value]));
            break;
          case Grammar::Element::Kind::kRule:
            symbols.push_back(GrammarSymbol::rule(element.value + offset));
            break;
          case Grammar::Element::Kind::kEnd:
            break;
        }
      }
      add_alternative(rule + offset, std::move(symbols));
    }
  }
  return grammar.root() + offset;
}

namespace {

// Which rules derive the empty string (a fixpoint over the alternatives).
std::vector<bool> nullable_rules(const auto& rules) {
  std::vector<bool> nullable(rules.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < rules.size(); ++r) {
      if (nullable[r]) continue;
      for (const auto& alternative : rules[r].alternatives) {
        bool all_nullable = true;
        for (const GrammarSymbol& symbol : alternative) {
          if (symbol.kind == GrammarSymbol::Kind::kBytes || !nullable[symbol.rule_id]) {
            all_nullable = false;
            break;
          }
        }
        if (all_nullable) {
          nullable[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  return nullable;
}

}  // namespace

Result<Grammar> GrammarBuilder::build(RuleId root) const {
  FOLIO_CHECK(root >= 0 && root < num_rules(), "root rule {} was never added", root);
  // Reachable rules must have alternatives.
  std::vector<bool> reachable(rules_.size(), false);
  std::vector<RuleId> pending = {root};
  reachable[root] = true;
  while (!pending.empty()) {
    const RuleId rule = pending.back();
    pending.pop_back();
    if (rules_[rule].alternatives.empty()) {
      return invalid_argument("grammar rule '{}' has no alternatives", rules_[rule].name);
    }
    for (const auto& alternative : rules_[rule].alternatives) {
      for (const GrammarSymbol& symbol : alternative) {
        if (symbol.kind == GrammarSymbol::Kind::kRule && !reachable[symbol.rule_id]) {
          reachable[symbol.rule_id] = true;
          pending.push_back(symbol.rule_id);
        }
      }
    }
  }

  // Left recursion: an edge r -> s when s can be the first thing r consumes through; a cycle
  // among reachable rules means the matcher's expansion would never stop.
  const std::vector<bool> nullable = nullable_rules(rules_);
  std::vector<std::vector<RuleId>> first_edges(rules_.size());
  for (size_t r = 0; r < rules_.size(); ++r) {
    for (const auto& alternative : rules_[r].alternatives) {
      for (const GrammarSymbol& symbol : alternative) {
        if (symbol.kind == GrammarSymbol::Kind::kBytes) break;
        first_edges[r].push_back(symbol.rule_id);
        if (!nullable[symbol.rule_id]) break;
      }
    }
  }
  enum class Visit : uint8_t { kNew, kOnPath, kDone };
  std::vector<Visit> visit(rules_.size(), Visit::kNew);
  for (size_t start = 0; start < rules_.size(); ++start) {
    if (!reachable[start] || visit[start] != Visit::kNew) continue;
    // Iterative depth-first search: (rule, next edge index).
    std::vector<std::pair<RuleId, size_t>> path = {{static_cast<RuleId>(start), 0}};
    visit[start] = Visit::kOnPath;
    while (!path.empty()) {
      auto& [rule, next] = path.back();
      if (next == first_edges[rule].size()) {
        visit[rule] = Visit::kDone;
        path.pop_back();
        continue;
      }
      const RuleId target = first_edges[rule][next++];
      switch (visit[target]) {
        case Visit::kOnPath:
          return invalid_argument("grammar rule '{}' is left-recursive", rules_[target].name);
        case Visit::kNew:
          visit[target] = Visit::kOnPath;
          path.emplace_back(target, 0);
          break;
        case Visit::kDone:
          break;
      }
    }
  }

  Grammar grammar;
  grammar.root_ = root;
  std::map<std::array<uint64_t, 4>, int32_t> set_index;
  auto add_element = [&](Grammar::Element::Kind kind, int32_t value) {
    grammar.elements_.push_back(Grammar::Element{.kind = kind, .value = value});
  };
  add_element(Grammar::Element::Kind::kRule, root);
  add_element(Grammar::Element::Kind::kEnd, -1);
  grammar.rule_alternatives_.resize(rules_.size());
  for (size_t r = 0; r < rules_.size(); ++r) {
    grammar.rule_names_.push_back(rules_[r].name);
    for (const auto& alternative : rules_[r].alternatives) {
      grammar.rule_alternatives_[r].push_back(static_cast<int32_t>(grammar.elements_.size()));
      for (const GrammarSymbol& symbol : alternative) {
        switch (symbol.kind) {
          case GrammarSymbol::Kind::kBytes: {
            auto [it, inserted] = set_index.emplace(
                symbol.set.words(), static_cast<int32_t>(grammar.byte_sets_.size()));
            if (inserted) grammar.byte_sets_.push_back(symbol.set);
            add_element(Grammar::Element::Kind::kBytes, it->second);
            break;
          }
          case GrammarSymbol::Kind::kRule:
            add_element(Grammar::Element::Kind::kRule, symbol.rule_id);
            break;
        }
      }
      add_element(Grammar::Element::Kind::kEnd, -1);
    }
  }
  return grammar;
}

namespace {

std::string byte_set_to_string(const ByteSet& set) {
  std::string text = "[";
  for (int byte = 0; byte < 256; ++byte) {
    if (!set.contains(static_cast<uint8_t>(byte))) continue;
    int last = byte;
    while (last + 1 < 256 && set.contains(static_cast<uint8_t>(last + 1))) ++last;
    auto spell = [](int b) {
      return (b >= 0x21 && b < 0x7f && b != '\\' && b != ']' && b != '-')
                 ? std::string(1, static_cast<char>(b))
                 : fmt::format("\\x{:02X}", b);
    };
    text += spell(byte);
    if (last > byte) text += fmt::format("-{}", spell(last));
    byte = last;
  }
  return text + "]";
}

}  // namespace

std::string Grammar::to_string() const {
  std::string text;
  for (RuleId rule = 0; rule < num_rules(); ++rule) {
    text += fmt::format("{}{} ::=", rule == root_ ? "*" : "", rule_names_[rule]);
    const char* separator = " ";
    for (int32_t start : rule_alternatives_[rule]) {
      text += separator;
      separator = " | ";
      if (elements_[start].kind == Element::Kind::kEnd) text += "\"\"";
      for (int32_t i = start; elements_[i].kind != Element::Kind::kEnd; ++i) {
        switch (elements_[i].kind) {
          case Element::Kind::kBytes:
            text += byte_set_to_string(byte_sets_[elements_[i].value]);
            break;
          case Element::Kind::kRule:
            text += fmt::format(" <{}> ", rule_names_[elements_[i].value]);
            break;
          case Element::Kind::kEnd:
            break;
        }
      }
    }
    text += "\n";
  }
  return text;
}

std::string quoted_bytes(std::string_view bytes) {
  std::string quoted = "\"";
  for (char c : bytes) {
    const auto byte = static_cast<uint8_t>(c);
    if (c == '"' || c == '\\') {
      quoted += '\\';
      quoted += c;
    } else if (byte >= 0x20 && byte < 0x7F) {
      quoted += c;
    } else {
      quoted += fmt::format("\\x{:02X}", byte);
    }
  }
  return quoted + "\"";
}

Grammar literal(std::string_view text) {
  GrammarBuilder builder;
  const RuleId root = builder.add_literal(text);
  Result<Grammar> grammar = builder.build(root);
  FOLIO_CHECK(grammar.ok(), "a literal always builds: {}", grammar.status().to_string());
  return std::move(grammar).value();
}

Grammar sequence(const std::vector<Grammar>& parts) {
  GrammarBuilder builder;
  std::vector<GrammarSymbol> symbols;
  for (const Grammar& part : parts)
    symbols.push_back(GrammarSymbol::rule(builder.add_grammar(part)));
  const RuleId root = builder.add_rule("sequence");
  builder.add_alternative(root, std::move(symbols));
  // Each part is free of left recursion and the new root is referenced by nothing, so the
  // composition is too.
  Result<Grammar> grammar = builder.build(root);
  FOLIO_CHECK(grammar.ok(), "a sequence of grammars always builds: {}",
              grammar.status().to_string());
  return std::move(grammar).value();
}

Grammar alternatives(const std::vector<Grammar>& options) {
  FOLIO_CHECK(!options.empty(), "alternatives() needs at least one grammar");
  GrammarBuilder builder;
  std::vector<RuleId> roots;
  for (const Grammar& option : options) roots.push_back(builder.add_grammar(option));
  const RuleId root = builder.add_rule("alternatives");
  for (RuleId option_root : roots)
    builder.add_alternative(root, {GrammarSymbol::rule(option_root)});
  Result<Grammar> grammar = builder.build(root);
  FOLIO_CHECK(grammar.ok(), "alternatives of grammars always build: {}",
              grammar.status().to_string());
  return std::move(grammar).value();
}

Grammar text_without(std::string_view forbidden, std::string_view forbidden_first) {
  // One state per matched prefix length of `forbidden` (one state when it is empty).
  const auto length = static_cast<int32_t>(forbidden.size());
  const int32_t num_states = std::max(length, 1);
  // next[state][byte]: the longest prefix of `forbidden` that is a suffix of the text after
  // reading `byte` with `state` bytes matched (Knuth-Morris-Pratt, as a full table); `length`
  // means the text now contains it.
  std::vector<std::array<int32_t, 256>> next(static_cast<size_t>(num_states));
  std::vector<int32_t> failure(static_cast<size_t>(num_states), 0);
  for (int32_t state = 0; state < length; ++state) {
    for (int32_t byte = 0; byte < 256; ++byte) {
      if (static_cast<uint8_t>(forbidden[state]) == byte) {
        next[state][byte] = state + 1;
      } else {
        next[state][byte] = state == 0 ? 0 : next[failure[state]][byte];
      }
    }
    if (state + 1 < length) {
      failure[state + 1] =
          state == 0 ? 0 : next[failure[state]][static_cast<uint8_t>(forbidden[state])];
    }
  }
  if (length == 0) next[0].fill(0);
  GrammarBuilder builder;
  std::vector<RuleId> states;
  for (int32_t state = 0; state < num_states; ++state) {
    states.push_back(builder.add_rule(fmt::format("without_{}", state)));
  }
  for (int32_t state = 0; state < num_states; ++state) {
    builder.add_alternative(states[state], {});  // the text may end here
    std::vector<ByteSet> to(static_cast<size_t>(num_states));
    for (int32_t byte = 0; byte < 256; ++byte) {
      const int32_t target = next[state][byte];
      if (length == 0 || target < length) to[target].add(static_cast<uint8_t>(byte));
    }
    for (int32_t target = 0; target < num_states; ++target) {
      if (to[target].empty()) continue;
      builder.add_alternative(
          states[state], {GrammarSymbol::bytes(to[target]), GrammarSymbol::rule(states[target])});
    }
  }
  RuleId root = states[0];
  if (!forbidden_first.empty()) {
    // A first byte outside `forbidden_first`, then the same text.
    ByteSet first;
    for (int32_t byte = 0; byte < 256; ++byte) {
      const bool refused = forbidden_first.find(static_cast<char>(byte)) != std::string_view::npos;
      if (!refused && (length == 0 || next[0][byte] < length))
        first.add(static_cast<uint8_t>(byte));
    }
    root = builder.add_rule("without_start");
    builder.add_alternative(root, {});
    for (int32_t target = 0; target < num_states; ++target) {
      ByteSet set;
      for (int32_t byte = 0; byte < 256; ++byte) {
        if (first.contains(static_cast<uint8_t>(byte)) && next[0][byte] == target) {
          set.add(static_cast<uint8_t>(byte));
        }
      }
      if (!set.empty()) {
        builder.add_alternative(root,
                                {GrammarSymbol::bytes(set), GrammarSymbol::rule(states[target])});
      }
    }
  }
  Result<Grammar> grammar = builder.build(root);
  FOLIO_CHECK(grammar.ok(), "text_without always builds: {}", grammar.status().to_string());
  return std::move(grammar).value();
}

}  // namespace folio::server
