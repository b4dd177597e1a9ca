// JsonGrammarRules: the rules of JSON itself, added to a GrammarBuilder (grammar.h) on first
// use and shared by everything that needs them: bounded whitespace, strings (escapes, UTF-8,
// length bounds), numbers, literals, bounded repetition, and any value / object / array at a
// nesting depth. json_schema_grammar.cc builds schema-specific rules on top.
//
// Terms: `kEmptyLanguage` stands for "no value fits here" (a branch dropped by the depth cap);
// depth counts the objects and arrays around a value, and with max_nesting_depth > 0 a value at
// that depth may not be an object or an array (too_deep).
//
// Invariants: every rule returned is defined in the builder; a primitive is added at most once
// (later calls return the same rule); repetition is right-recursive in tail position, so the
// matcher's stacks stay flat.
//
// Thread-safety: none; one per grammar being built.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "folio/server/grammar.h"
#include "folio/server/json_schema_grammar.h"

namespace folio::server {

class JsonGrammarRules {
 public:
  static constexpr RuleId kEmptyLanguage = -1;
  // Digits of a number's integer and fraction parts, and of its exponent: every number parses
  // as a finite double and every integer fits int64.
  static constexpr int64_t kMaxNumberDigits = 16;
  static constexpr int64_t kMaxExponentDigits = 2;

  // Both must outlive this object.
  JsonGrammarRules(GrammarBuilder& builder, const SchemaOptions& options)
      : builder_(builder), options_(options) {}

  GrammarBuilder& builder() { return builder_; }

  RuleId sequence_rule(std::string name, std::vector<GrammarSymbol> symbols);
  // Exactly `text`, one rule per distinct text.
  RuleId literal_rule(const std::string& text);
  // "" or up to max_whitespace bytes of [ \t\n\r].
  RuleId whitespace();
  // `item` repeated between min and max times (max < 0: unbounded).
  RuleId repeat(RuleId item, int64_t min, int64_t max, const std::string& name);
  // A JSON string of min..max characters (max < 0: unbounded).
  RuleId string_of_length(int64_t min, int64_t max);
  RuleId integer();
  RuleId number();

  bool too_deep(int32_t depth) const {
    return options_.max_nesting_depth > 0 && depth >= options_.max_nesting_depth;
  }
  // The depth as far as rules differ: without a cap every depth is the same.
  int32_t depth_key(int32_t depth) const { return options_.max_nesting_depth > 0 ? depth : 0; }

  // Any JSON value at `depth` (objects and arrays only when they may nest there).
  RuleId any_value(int32_t depth);
  // Requires: !too_deep(depth).
  RuleId any_object(int32_t depth);
  RuleId any_array(int32_t depth);
  // An object of any string keys, each value `value`. Requires: !too_deep of its depth.
  RuleId map_object(RuleId value, const std::string& name);
  // An array of min..max `item`s (max < 0: unbounded).
  RuleId array_of(RuleId item, int64_t min, int64_t max, const std::string& name);

 private:
  static GrammarSymbol ref(RuleId rule) { return GrammarSymbol::rule(rule); }
  static GrammarSymbol byte(char c) { return GrammarSymbol::byte(static_cast<uint8_t>(c)); }
  static GrammarSymbol bytes(uint8_t first, uint8_t last) {
    return GrammarSymbol::bytes(ByteSet::range(first, last));
  }
  RuleId star(RuleId item, const std::string& name);
  RuleId at_most(RuleId item, int64_t count, const std::string& name);
  RuleId hex_digit();
  RuleId string_char();
  RuleId digits(int64_t min, int64_t max);

  GrammarBuilder& builder_;
  const SchemaOptions& options_;
  std::map<std::string, RuleId> literals_;
  std::map<RuleId, RuleId> stars_;
  std::map<RuleId, std::vector<RuleId>> at_most_;
  std::map<std::pair<int64_t, int64_t>, RuleId> strings_;
  std::map<int32_t, RuleId> any_values_;
  std::map<int32_t, RuleId> any_objects_;
  std::map<int32_t, RuleId> any_arrays_;
  RuleId whitespace_ = kEmptyLanguage;
  RuleId hex_digit_ = kEmptyLanguage;
  RuleId string_char_ = kEmptyLanguage;
  RuleId digit_ = kEmptyLanguage;
  RuleId integer_ = kEmptyLanguage;
  RuleId number_ = kEmptyLanguage;
};

}  // namespace folio::server
