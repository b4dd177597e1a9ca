#include "folio/server/json_grammar_rules.h"

#include <fmt/format.h>

#include "folio/base/check.h"

namespace folio::server {

RuleId JsonGrammarRules::sequence_rule(std::string name, std::vector<GrammarSymbol> symbols) {
  const RuleId rule = builder_.add_rule(std::move(name));
  builder_.add_alternative(rule, std::move(symbols));
  return rule;
}

RuleId JsonGrammarRules::literal_rule(const std::string& text) {
  auto it = literals_.find(text);
  if (it != literals_.end()) return it->second;
  const RuleId rule = builder_.add_literal(text);
  literals_.emplace(text, rule);
  return rule;
}

// ws ::= "" | [ \t\n\r] ws' with at most max_whitespace bytes in all.
RuleId JsonGrammarRules::whitespace() {
  if (whitespace_ != kEmptyLanguage) return whitespace_;
  RuleId shorter = builder_.add_rule("ws0");
  builder_.add_alternative(shorter, {});
  const ByteSet space = ByteSet().add(' ').add('\t').add('\n').add('\r');
  for (int32_t n = 1; n <= options_.max_whitespace; ++n) {
    const RuleId rule = builder_.add_rule(fmt::format("ws{}", n));
    builder_.add_alternative(rule, {});
    builder_.add_alternative(rule, {GrammarSymbol::bytes(space), ref(shorter)});
    shorter = rule;
  }
  whitespace_ = shorter;
  return whitespace_;
}

// `item` repeated between min and max times (max < 0: unbounded).
RuleId JsonGrammarRules::repeat(RuleId item, int64_t min, int64_t max, const std::string& name) {
  std::vector<GrammarSymbol> symbols(static_cast<size_t>(min), ref(item));
  if (max < 0) {
    symbols.push_back(ref(star(item, name)));
  } else if (max > min) {
    symbols.push_back(ref(at_most(item, max - min, name)));
  }
  return sequence_rule(fmt::format("{}{{{},{}}}", name, min, max), std::move(symbols));
}

RuleId JsonGrammarRules::star(RuleId item, const std::string& name) {
  auto it = stars_.find(item);
  if (it != stars_.end()) return it->second;
  const RuleId rule = builder_.add_rule(name + "*");
  builder_.add_alternative(rule, {});
  builder_.add_alternative(rule, {ref(item), ref(rule)});  // tail position: constant depth
  stars_.emplace(item, rule);
  return rule;
}

RuleId JsonGrammarRules::at_most(RuleId item, int64_t count, const std::string& name) {
  std::vector<RuleId>& chain = at_most_[item];
  if (chain.empty()) {
    const RuleId none = builder_.add_rule(name + "{0}");
    builder_.add_alternative(none, {});
    chain.push_back(none);
  }
  while (static_cast<int64_t>(chain.size()) <= count) {
    const RuleId rule = builder_.add_rule(fmt::format("{}{{0,{}}}", name, chain.size()));
    builder_.add_alternative(rule, {});
    builder_.add_alternative(rule, {ref(item), ref(chain.back())});
    chain.push_back(rule);
  }
  return chain[static_cast<size_t>(count)];
}

RuleId JsonGrammarRules::hex_digit() {
  if (hex_digit_ == kEmptyLanguage) {
    hex_digit_ = sequence_rule(
        "hex",
        {GrammarSymbol::bytes(ByteSet::range('0', '9').add_range('a', 'f').add_range('A', 'F'))});
  }
  return hex_digit_;
}

// One character of a JSON string: printable ASCII but " and \, an escape, or a well-formed
// UTF-8 multi-byte character (no overlongs, no surrogates, at most U+10FFFF).
RuleId JsonGrammarRules::string_char() {
  if (string_char_ != kEmptyLanguage) return string_char_;
  const RuleId hex = hex_digit();
  const GrammarSymbol continuation = bytes(0x80, 0xBF);
  const RuleId escape = builder_.add_rule("escape");
  builder_.add_alternative(
      escape,
      {GrammarSymbol::bytes(
          ByteSet().add('"').add('\\').add('/').add('b').add('f').add('n').add('r').add('t'))});
  const GrammarSymbol d_upper_or_lower = GrammarSymbol::bytes(ByteSet().add('d').add('D'));
  builder_.add_alternative(
      escape,
      {byte('u'),
       GrammarSymbol::bytes(ByteSet::range('0', '9').add_range('a', 'c').add_range('A', 'C')),
       ref(hex), ref(hex), ref(hex)});
  builder_.add_alternative(escape,
                           {byte('u'), d_upper_or_lower, bytes('0', '7'), ref(hex), ref(hex)});
  builder_.add_alternative(
      escape, {byte('u'), GrammarSymbol::bytes(ByteSet::range('e', 'f').add_range('E', 'F')),
               ref(hex), ref(hex), ref(hex)});
  // A high surrogate escape must be followed by a low one.
  builder_.add_alternative(
      escape,
      {byte('u'), d_upper_or_lower,
       GrammarSymbol::bytes(ByteSet::range('8', '9').add_range('a', 'b').add_range('A', 'B')),
       ref(hex), ref(hex), byte('\\'), byte('u'), d_upper_or_lower,
       GrammarSymbol::bytes(ByteSet::range('c', 'f').add_range('C', 'F')), ref(hex), ref(hex)});

  const RuleId character = builder_.add_rule("char");
  builder_.add_alternative(
      character, {GrammarSymbol::bytes(
                     ByteSet::range(0x20, 0x21).add_range(0x23, 0x5B).add_range(0x5D, 0x7F))});
  builder_.add_alternative(character, {byte('\\'), ref(escape)});
  builder_.add_alternative(character, {bytes(0xC2, 0xDF), continuation});
  builder_.add_alternative(character, {GrammarSymbol::byte(0xE0), bytes(0xA0, 0xBF), continuation});
  builder_.add_alternative(character,
                           {GrammarSymbol::bytes(ByteSet::range(0xE1, 0xEC).add_range(0xEE, 0xEF)),
                            continuation, continuation});
  builder_.add_alternative(character, {GrammarSymbol::byte(0xED), bytes(0x80, 0x9F), continuation});
  builder_.add_alternative(
      character, {GrammarSymbol::byte(0xF0), bytes(0x90, 0xBF), continuation, continuation});
  builder_.add_alternative(character,
                           {bytes(0xF1, 0xF3), continuation, continuation, continuation});
  builder_.add_alternative(
      character, {GrammarSymbol::byte(0xF4), bytes(0x80, 0x8F), continuation, continuation});
  string_char_ = character;
  return string_char_;
}

RuleId JsonGrammarRules::string_of_length(int64_t min, int64_t max) {
  const auto key = std::make_pair(min, max);
  auto it = strings_.find(key);
  if (it != strings_.end()) return it->second;
  const RuleId characters = repeat(string_char(), min, max, "char");
  const RuleId rule = sequence_rule("string", {byte('"'), ref(characters), byte('"')});
  strings_.emplace(key, rule);
  return rule;
}

RuleId JsonGrammarRules::digits(int64_t min, int64_t max) {
  if (digit_ == kEmptyLanguage) digit_ = sequence_rule("digit", {bytes('0', '9')});
  return repeat(digit_, min, max, "digit");
}

// -? (0 | [1-9][0-9]{0,15})
RuleId JsonGrammarRules::integer() {
  if (integer_ != kEmptyLanguage) return integer_;
  const RuleId minus = builder_.add_rule("minus?");
  builder_.add_alternative(minus, {});
  builder_.add_alternative(minus, {byte('-')});
  const RuleId magnitude = builder_.add_rule("integer-digits");
  builder_.add_alternative(magnitude, {byte('0')});
  builder_.add_alternative(magnitude, {bytes('1', '9'), ref(digits(0, kMaxNumberDigits - 1))});
  integer_ = sequence_rule("integer", {ref(minus), ref(magnitude)});
  return integer_;
}

// integer (. [0-9]{1,16})? ([eE] [+-]? [0-9]{1,2})?
RuleId JsonGrammarRules::number() {
  if (number_ != kEmptyLanguage) return number_;
  const RuleId fraction = builder_.add_rule("fraction?");
  builder_.add_alternative(fraction, {});
  builder_.add_alternative(fraction, {byte('.'), ref(digits(1, kMaxNumberDigits))});
  const RuleId exponent = builder_.add_rule("exponent?");
  builder_.add_alternative(exponent, {});
  const GrammarSymbol e = GrammarSymbol::bytes(ByteSet().add('e').add('E'));
  const RuleId exponent_digits = digits(1, kMaxExponentDigits);
  builder_.add_alternative(exponent, {e, ref(exponent_digits)});
  builder_.add_alternative(
      exponent, {e, GrammarSymbol::bytes(ByteSet().add('+').add('-')), ref(exponent_digits)});
  number_ = sequence_rule("number", {ref(integer()), ref(fraction), ref(exponent)});
  return number_;
}

// Any JSON value at `depth` (objects and arrays only when they may nest there).
RuleId JsonGrammarRules::any_value(int32_t depth) {
  auto it = any_values_.find(depth_key(depth));
  if (it != any_values_.end()) return it->second;
  const RuleId rule = builder_.add_rule(fmt::format("value@{}", depth_key(depth)));
  any_values_.emplace(depth_key(depth), rule);  // before the body: objects recurse here
  if (!too_deep(depth)) {
    builder_.add_alternative(rule, {ref(any_object(depth))});
    builder_.add_alternative(rule, {ref(any_array(depth))});
  }
  for (RuleId scalar : {string_of_length(0, -1), number(), literal_rule("true"),
                        literal_rule("false"), literal_rule("null")}) {
    builder_.add_alternative(rule, {ref(scalar)});
  }
  return rule;
}

// "{" ws "}" | "{" ws member (ws "," ws member)* ws "}", member: string ws ":" ws value.
// Requires: !too_deep(depth).
RuleId JsonGrammarRules::map_object(RuleId value, const std::string& name) {
  const RuleId ws = whitespace();
  const RuleId member = sequence_rule(
      name + "-member", {ref(string_of_length(0, -1)), ref(ws), byte(':'), ref(ws), ref(value)});
  const RuleId more = sequence_rule(name + "-more", {ref(ws), byte(','), ref(ws), ref(member)});
  const RuleId rule = builder_.add_rule(name);
  builder_.add_alternative(rule, {byte('{'), ref(ws), byte('}')});
  builder_.add_alternative(
      rule, {byte('{'), ref(ws), ref(member), ref(star(more, name + "-more")), ref(ws), byte('}')});
  return rule;
}

RuleId JsonGrammarRules::any_object(int32_t depth) {
  FOLIO_CHECK(!too_deep(depth));
  auto it = any_objects_.find(depth_key(depth));
  if (it != any_objects_.end()) return it->second;
  const std::string name = fmt::format("object@{}", depth_key(depth));
  const RuleId rule = map_object(any_value(depth + 1), name);
  any_objects_.emplace(depth_key(depth), rule);
  return rule;
}

// "[" ws "]" | "[" ws item (ws "," ws item){min-1,max-1} ws "]"
RuleId JsonGrammarRules::array_of(RuleId item, int64_t min, int64_t max, const std::string& name) {
  const RuleId ws = whitespace();
  const RuleId rule = builder_.add_rule(name);
  if (min == 0) builder_.add_alternative(rule, {byte('['), ref(ws), byte(']')});
  if (max != 0) {
    const RuleId more = sequence_rule(name + "-more", {ref(ws), byte(','), ref(ws), ref(item)});
    const RuleId rest = repeat(more, min > 0 ? min - 1 : 0, max < 0 ? -1 : max - 1, name + "-more");
    builder_.add_alternative(rule, {byte('['), ref(ws), ref(item), ref(rest), ref(ws), byte(']')});
  }
  return rule;
}

RuleId JsonGrammarRules::any_array(int32_t depth) {
  FOLIO_CHECK(!too_deep(depth));
  auto it = any_arrays_.find(depth_key(depth));
  if (it != any_arrays_.end()) return it->second;
  const RuleId rule =
      array_of(any_value(depth + 1), 0, -1, fmt::format("array@{}", depth_key(depth)));
  any_arrays_.emplace(depth_key(depth), rule);
  return rule;
}

}  // namespace folio::server
