// Grammar: a context-free grammar over bytes, the form structured output is compiled to (a JSON
// schema, a tool call's literal envelope around its arguments) and the input of the matcher
// (grammar_matcher.h).
//
// Terms: a *rule* has one or more *alternatives*; an alternative is a sequence of *symbols*;
// a symbol is a *byte set* (matches one byte in the set) or a *reference* to a rule. A grammar
// has a *root* rule; the language is every byte string the root derives. Text is bytes: UTF-8
// is spelled out as byte sequences by whoever builds the grammar (json_schema_grammar.h does).
//
// Grammars are built with GrammarBuilder (rules by id, so rules may refer to each other and to
// themselves) or composed from other grammars: literal("..."), sequence({...}),
// alternatives({...}). Composition copies the operands' rules, so a composed grammar owns
// everything it needs.
//
// Invariants of a built Grammar (GrammarBuilder::build refuses anything else):
//   - every referenced rule is defined and has at least one alternative;
//   - no rule is left-recursive (derives itself before consuming a byte), so the matcher's
//     expansion of a position always terminates;
//   - element layout: each alternative is its symbols followed by a kEnd element; element 0 is
//     a reference to the root and element 1 a kEnd (the matcher starts there).
//
// Thread-safety: a Grammar is immutable once built; share it freely (shared_ptr<const Grammar>).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "folio/base/result.h"

namespace folio::server {

// A set of bytes, 256 bits.
class ByteSet {
 public:
  ByteSet() = default;
  static ByteSet single(uint8_t byte);
  // Every byte in [first, last].
  static ByteSet range(uint8_t first, uint8_t last);
  ByteSet& add(uint8_t byte);
  ByteSet& remove(uint8_t byte);
  ByteSet& add_range(uint8_t first, uint8_t last);
  ByteSet& add_all(const ByteSet& other);

  bool contains(uint8_t byte) const { return (words_[byte >> 6] >> (byte & 63)) & 1u; }
  bool empty() const { return (words_[0] | words_[1] | words_[2] | words_[3]) == 0; }
  const std::array<uint64_t, 4>& words() const { return words_; }

  friend bool operator==(const ByteSet&, const ByteSet&) = default;

 private:
  std::array<uint64_t, 4> words_{};
};

using RuleId = int32_t;

// One symbol of an alternative.
struct GrammarSymbol {
  enum class Kind : uint8_t { kBytes, kRule };
  static GrammarSymbol bytes(const ByteSet& set) { return GrammarSymbol(Kind::kBytes, set, -1); }
  static GrammarSymbol byte(uint8_t value) { return bytes(ByteSet::single(value)); }
  static GrammarSymbol rule(RuleId id) { return GrammarSymbol(Kind::kRule, ByteSet(), id); }

  Kind kind;
  ByteSet set;     // kBytes
  RuleId rule_id;  // kRule

 private:
  GrammarSymbol(Kind k, const ByteSet& s, RuleId r) : kind(k), set(s), rule_id(r) {}
};

class Grammar;

// Builds a grammar rule by rule. Rules are declared first (so they can be referenced before,
// or while, they are defined) and given alternatives afterwards.
class GrammarBuilder {
 public:
  // A new rule with no alternatives yet; the name is for error messages and debugging.
  RuleId add_rule(std::string name);
  // Appends an alternative (an empty one derives the empty string).
  void add_alternative(RuleId rule, std::vector<GrammarSymbol> symbols);
  // A rule deriving exactly `text`.
  RuleId add_literal(std::string_view text);
  // Copies every rule of `grammar` in; returns the id its root has here.
  RuleId add_grammar(const Grammar& grammar);

  int32_t num_rules() const { return static_cast<int32_t>(rules_.size()); }

  // kInvalidArgument naming the rule: a referenced rule without alternatives, left recursion.
  Result<Grammar> build(RuleId root) const;

 private:
  struct Rule {
    std::string name;
    std::vector<std::vector<GrammarSymbol>> alternatives;
  };
  std::vector<Rule> rules_;
};

class Grammar {
 public:
  // Matcher-facing layout (see the invariants above).
  struct Element {
    enum class Kind : uint8_t { kBytes, kRule, kEnd };
    Kind kind;
    int32_t value;  // kBytes: index into byte_sets(); kRule: rule id; kEnd: unused (-1)
  };

  const std::vector<Element>& elements() const { return elements_; }
  const std::vector<ByteSet>& byte_sets() const { return byte_sets_; }
  // The element index where each alternative of `rule` starts.
  const std::vector<int32_t>& alternatives(RuleId rule) const { return rule_alternatives_[rule]; }
  int32_t num_rules() const { return static_cast<int32_t>(rule_alternatives_.size()); }
  const std::string& rule_name(RuleId rule) const { return rule_names_[rule]; }
  RuleId root() const { return root_; }

  // The grammar in a BNF-like text (one rule per line), for debugging and error reports.
  std::string to_string() const;

 private:
  friend class GrammarBuilder;
  Grammar() = default;

  std::vector<Element> elements_;
  std::vector<ByteSet> byte_sets_;
  std::vector<std::vector<int32_t>> rule_alternatives_;
  std::vector<std::string> rule_names_;
  RuleId root_ = 0;
};

// `bytes` quoted for a message: printable ASCII as is, '"' and '\\' escaped, any other byte
// as \xNN (so text that is not UTF-8 prints safely).
std::string quoted_bytes(std::string_view bytes);

// Composition. Each result is a new grammar; the operands are copied, not referenced.
// Exactly `text` (the empty grammar, matching only "", when text is empty).
Grammar literal(std::string_view text);
// The operands one after the other.
Grammar sequence(const std::vector<Grammar>& parts);
// Any one of the operands. Requires: at least one operand.
Grammar alternatives(const std::vector<Grammar>& options);
// Any bytes (the empty text included) that do not contain `forbidden` (when not empty) and,
// with `forbidden_first` non-empty, do not start with one of its bytes: the free text around
// tool calls. Built as the string-matching automaton of `forbidden` (a rule per matched prefix
// length; a byte that would complete it has no transition).
Grammar text_without(std::string_view forbidden, std::string_view forbidden_first = {});

}  // namespace folio::server
