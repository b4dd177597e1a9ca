#include "folio/server/json_schema_grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "folio/base/check.h"

namespace folio::server {

namespace {

using Json = nlohmann::ordered_json;

// A schema (or branch) that admits no value here: dropped from alternations, fatal when
// required.
constexpr RuleId kEmptyLanguage = -1;
// Largest minLength / maxLength / minItems / maxItems compiled (each unit of a bound is a rule).
constexpr int64_t kMaxBound = 4096;
// Digits of the integer and fraction parts of a number, and of its exponent.
constexpr int64_t kMaxNumberDigits = 16;
constexpr int64_t kMaxExponentDigits = 2;

const std::set<std::string, std::less<>> kHandledKeywords = {
    "type",      "properties", "required", "additionalProperties",
    "items",     "minItems",   "maxItems", "minLength",
    "maxLength", "enum",       "const",    "anyOf",
    "oneOf",     "allOf",      "$ref"};
const std::set<std::string, std::less<>> kAnnotations = {
    "title",    "description", "default",  "examples",  "$schema", "$id",
    "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",   "definitions"};
// Keywords that only narrow values Folio already produces: ignored when not strict.
const std::set<std::string, std::less<>> kNarrowingKeywords = {
    "format",     "minimum",       "maximum",       "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "minProperties", "maxProperties", "uniqueItems"};
// Keywords that change which values are valid in ways the grammar cannot follow: always refused.
const std::set<std::string, std::less<>> kStructuralKeywords = {"pattern",
                                                                "patternProperties",
                                                                "prefixItems",
                                                                "contains",
                                                                "minContains",
                                                                "maxContains",
                                                                "not",
                                                                "if",
                                                                "then",
                                                                "else",
                                                                "dependentSchemas",
                                                                "dependentRequired",
                                                                "dependencies",
                                                                "propertyNames",
                                                                "unevaluatedProperties",
                                                                "unevaluatedItems",
                                                                "additionalItems",
                                                                "$dynamicRef",
                                                                "$recursiveRef"};

std::string escape_pointer_token(std::string_view token) {
  std::string escaped;
  for (char c : token) {
    if (c == '~') {
      escaped += "~0";
    } else if (c == '/') {
      escaped += "~1";
    } else {
      escaped += c;
    }
  }
  return escaped;
}

bool value_has_type(const Json& value, std::string_view type) {
  if (type == "string") return value.is_string();
  if (type == "number") return value.is_number();
  if (type == "integer") {
    return value.is_number_integer() ||
           (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>());
  }
  if (type == "boolean") return value.is_boolean();
  if (type == "null") return value.is_null();
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  return false;
}

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, const SchemaOptions& options) : root_(root), options_(options) {}

  Result<Grammar> compile_schema() {
    FOLIO_ASSIGN_OR_RETURN(RuleId value, compile_node(root_, "#", 0));
    if (value == kEmptyLanguage) {
      return invalid_argument("the JSON schema admits no value{}",
                              options_.max_nesting_depth > 0 ? " within max_nesting_depth" : "");
    }
    return finish(value);
  }

  Result<Grammar> compile_any_object() { return finish(any_object(0)); }

 private:
  Result<Grammar> finish(RuleId value) {
    const RuleId root = sequence_rule("root", {ref(whitespace()), ref(value)});
    return builder_.build(root);
  }

  static GrammarSymbol ref(RuleId rule) { return GrammarSymbol::rule(rule); }
  static GrammarSymbol byte(char c) { return GrammarSymbol::byte(static_cast<uint8_t>(c)); }
  static GrammarSymbol bytes(uint8_t first, uint8_t last) {
    return GrammarSymbol::bytes(ByteSet::range(first, last));
  }

  RuleId sequence_rule(std::string name, std::vector<GrammarSymbol> symbols) {
    const RuleId rule = builder_.add_rule(std::move(name));
    builder_.add_alternative(rule, std::move(symbols));
    return rule;
  }

  RuleId literal_rule(const std::string& text) {
    auto it = literals_.find(text);
    if (it != literals_.end()) return it->second;
    const RuleId rule = builder_.add_literal(text);
    literals_.emplace(text, rule);
    return rule;
  }

  // ws ::= "" | [ \t\n\r] ws' with at most max_whitespace bytes in all.
  RuleId whitespace() {
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
  RuleId repeat(RuleId item, int64_t min, int64_t max, const std::string& name) {
    std::vector<GrammarSymbol> symbols(static_cast<size_t>(min), ref(item));
    if (max < 0) {
      symbols.push_back(ref(star(item, name)));
    } else if (max > min) {
      symbols.push_back(ref(at_most(item, max - min, name)));
    }
    return sequence_rule(fmt::format("{}{{{},{}}}", name, min, max), std::move(symbols));
  }

  RuleId star(RuleId item, const std::string& name) {
    auto it = stars_.find(item);
    if (it != stars_.end()) return it->second;
    const RuleId rule = builder_.add_rule(name + "*");
    builder_.add_alternative(rule, {});
    builder_.add_alternative(rule, {ref(item), ref(rule)});  // tail position: constant depth
    stars_.emplace(item, rule);
    return rule;
  }

  RuleId at_most(RuleId item, int64_t count, const std::string& name) {
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

  RuleId hex_digit() {
    if (hex_digit_ == kEmptyLanguage) {
      hex_digit_ = sequence_rule(
          "hex",
          {GrammarSymbol::bytes(ByteSet::range('0', '9').add_range('a', 'f').add_range('A', 'F'))});
    }
    return hex_digit_;
  }

  // One character of a JSON string: printable ASCII but " and \, an escape, or a well-formed
  // UTF-8 multi-byte character (no overlongs, no surrogates, at most U+10FFFF).
  RuleId string_char() {
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
    builder_.add_alternative(character,
                             {GrammarSymbol::byte(0xE0), bytes(0xA0, 0xBF), continuation});
    builder_.add_alternative(
        character, {GrammarSymbol::bytes(ByteSet::range(0xE1, 0xEC).add_range(0xEE, 0xEF)),
                    continuation, continuation});
    builder_.add_alternative(character,
                             {GrammarSymbol::byte(0xED), bytes(0x80, 0x9F), continuation});
    builder_.add_alternative(
        character, {GrammarSymbol::byte(0xF0), bytes(0x90, 0xBF), continuation, continuation});
    builder_.add_alternative(character,
                             {bytes(0xF1, 0xF3), continuation, continuation, continuation});
    builder_.add_alternative(
        character, {GrammarSymbol::byte(0xF4), bytes(0x80, 0x8F), continuation, continuation});
    string_char_ = character;
    return string_char_;
  }

  RuleId string_of_length(int64_t min, int64_t max) {
    const auto key = std::make_pair(min, max);
    auto it = strings_.find(key);
    if (it != strings_.end()) return it->second;
    const RuleId characters = repeat(string_char(), min, max, "char");
    const RuleId rule = sequence_rule("string", {byte('"'), ref(characters), byte('"')});
    strings_.emplace(key, rule);
    return rule;
  }

  RuleId digits(int64_t min, int64_t max) {
    if (digit_ == kEmptyLanguage) digit_ = sequence_rule("digit", {bytes('0', '9')});
    return repeat(digit_, min, max, "digit");
  }

  // -? (0 | [1-9][0-9]{0,15})
  RuleId integer() {
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
  RuleId number() {
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

  bool too_deep(int32_t depth) const {
    return options_.max_nesting_depth > 0 && depth >= options_.max_nesting_depth;
  }
  int32_t depth_key(int32_t depth) const { return options_.max_nesting_depth > 0 ? depth : 0; }

  // Any JSON value at `depth` (objects and arrays only when they may nest there).
  RuleId any_value(int32_t depth) {
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
  RuleId map_object(RuleId value, const std::string& name) {
    const RuleId ws = whitespace();
    const RuleId member = sequence_rule(
        name + "-member", {ref(string_of_length(0, -1)), ref(ws), byte(':'), ref(ws), ref(value)});
    const RuleId more = sequence_rule(name + "-more", {ref(ws), byte(','), ref(ws), ref(member)});
    const RuleId rule = builder_.add_rule(name);
    builder_.add_alternative(rule, {byte('{'), ref(ws), byte('}')});
    builder_.add_alternative(rule, {byte('{'), ref(ws), ref(member),
                                    ref(star(more, name + "-more")), ref(ws), byte('}')});
    return rule;
  }

  RuleId any_object(int32_t depth) {
    FOLIO_CHECK(!too_deep(depth));
    auto it = any_objects_.find(depth_key(depth));
    if (it != any_objects_.end()) return it->second;
    const std::string name = fmt::format("object@{}", depth_key(depth));
    const RuleId rule = map_object(any_value(depth + 1), name);
    any_objects_.emplace(depth_key(depth), rule);
    return rule;
  }

  // "[" ws "]" | "[" ws item (ws "," ws item){min-1,max-1} ws "]"
  RuleId array_of(RuleId item, int64_t min, int64_t max, const std::string& name) {
    const RuleId ws = whitespace();
    const RuleId rule = builder_.add_rule(name);
    if (min == 0) builder_.add_alternative(rule, {byte('['), ref(ws), byte(']')});
    if (max != 0) {
      const RuleId more = sequence_rule(name + "-more", {ref(ws), byte(','), ref(ws), ref(item)});
      const RuleId rest =
          repeat(more, min > 0 ? min - 1 : 0, max < 0 ? -1 : max - 1, name + "-more");
      builder_.add_alternative(rule,
                               {byte('['), ref(ws), ref(item), ref(rest), ref(ws), byte(']')});
    }
    return rule;
  }

  RuleId any_array(int32_t depth) {
    FOLIO_CHECK(!too_deep(depth));
    auto it = any_arrays_.find(depth_key(depth));
    if (it != any_arrays_.end()) return it->second;
    const RuleId rule =
        array_of(any_value(depth + 1), 0, -1, fmt::format("array@{}", depth_key(depth)));
    any_arrays_.emplace(depth_key(depth), rule);
    return rule;
  }

  Status check_keywords(const Json& node, const std::string& path) const {
    for (const auto& [key, value] : node.items()) {
      if (kHandledKeywords.contains(key) || kAnnotations.contains(key)) continue;
      if (kNarrowingKeywords.contains(key) && !options_.strict) continue;
      if (!kNarrowingKeywords.contains(key) && !kStructuralKeywords.contains(key) &&
          !options_.strict) {
        continue;  // unknown keyword, ignored outside strict mode
      }
      return invalid_argument("unsupported keyword '{}' at {}", key, path);
    }
    return Status();
  }

  // Refuses keywords beside `keyword` that would be ignored (only annotations may accompany it).
  static Status check_alone(const Json& node, std::string_view keyword, const std::string& path) {
    for (const auto& [key, value] : node.items()) {
      if (key == keyword || kAnnotations.contains(key) || kNarrowingKeywords.contains(key))
        continue;
      if (kHandledKeywords.contains(key)) {
        return invalid_argument("keyword '{}' beside '{}' at {} is not supported", key, keyword,
                                path);
      }
    }
    return Status();
  }

  Result<int64_t> bound(const Json& node, const char* keyword, int64_t fallback,
                        const std::string& path) const {
    if (!node.contains(keyword)) return fallback;
    const Json& value = node[keyword];
    if (!value.is_number_integer() || value.get<int64_t>() < 0) {
      return invalid_argument("'{}' at {} must be a non-negative integer", keyword, path);
    }
    if (value.get<int64_t>() > kMaxBound) {
      return invalid_argument("'{}' at {} is {}; at most {} is supported", keyword, path,
                              value.get<int64_t>(), kMaxBound);
    }
    return value.get<int64_t>();
  }

  Result<RuleId> compile_node(const Json& node, const std::string& path, int32_t depth) {
    const auto key = std::make_pair(path, depth_key(depth));
    auto it = compiled_.find(key);
    if (it != compiled_.end()) return it->second;
    if (node.is_boolean()) return node.get<bool>() ? any_value(depth) : kEmptyLanguage;
    if (!node.is_object())
      return invalid_argument("the schema at {} is not an object or a boolean", path);
    // Declared before the body, so a recursive $ref finds it.
    const RuleId rule = builder_.add_rule(path);
    compiled_.emplace(key, rule);
    FOLIO_ASSIGN_OR_RETURN(RuleId body, compile_body(node, path, depth));
    if (body == kEmptyLanguage) {
      compiled_[key] = kEmptyLanguage;
      return kEmptyLanguage;
    }
    builder_.add_alternative(rule, {ref(body)});
    return rule;
  }

  Result<RuleId> compile_body(const Json& node, const std::string& path, int32_t depth) {
    FOLIO_RETURN_IF_ERROR(check_keywords(node, path));
    if (node.contains("$ref")) {
      FOLIO_RETURN_IF_ERROR(check_alone(node, "$ref", path));
      const Json& reference = node["$ref"];
      if (!reference.is_string() || !reference.get<std::string>().starts_with('#')) {
        return invalid_argument("'$ref' at {} must be a local reference (\"#/$defs/...\")", path);
      }
      const std::string target_path = reference.get<std::string>();
      const Json* target = nullptr;
      try {
        target = &root_.at(Json::json_pointer(target_path.substr(1)));
      } catch (const nlohmann::json::exception&) {
        return invalid_argument("'$ref' {} at {} does not resolve", target_path, path);
      }
      return compile_node(*target, target_path, depth);
    }
    if (node.contains("allOf")) {
      FOLIO_RETURN_IF_ERROR(check_alone(node, "allOf", path));
      const Json& all = node["allOf"];
      if (!all.is_array() || all.size() != 1) {
        return invalid_argument("'allOf' at {} is supported with exactly one schema", path);
      }
      return compile_node(all[0], path + "/allOf/0", depth);
    }
    for (const char* keyword : {"anyOf", "oneOf"}) {
      if (!node.contains(keyword)) continue;
      FOLIO_RETURN_IF_ERROR(check_alone(node, keyword, path));
      const Json& options = node[keyword];
      if (!options.is_array() || options.empty()) {
        return invalid_argument("'{}' at {} must be a non-empty array", keyword, path);
      }
      std::vector<RuleId> branches;
      for (size_t i = 0; i < options.size(); ++i) {
        FOLIO_ASSIGN_OR_RETURN(
            RuleId branch,
            compile_node(options[i], fmt::format("{}/{}/{}", path, keyword, i), depth));
        if (branch != kEmptyLanguage) branches.push_back(branch);
      }
      return alternation(branches, path + "/" + keyword);
    }

    std::vector<std::string> types;
    if (node.contains("type")) {
      const Json& type = node["type"];
      if (type.is_string()) {
        types.push_back(type.get<std::string>());
      } else if (type.is_array() && !type.empty()) {
        for (const Json& entry : type) {
          if (!entry.is_string()) return invalid_argument("'type' at {} lists a non-string", path);
          types.push_back(entry.get<std::string>());
        }
      } else {
        return invalid_argument("'type' at {} must be a string or a non-empty array", path);
      }
      for (const std::string& type_name : types) {
        static const std::set<std::string, std::less<>> kTypes = {
            "object", "array", "string", "number", "integer", "boolean", "null"};
        if (!kTypes.contains(type_name)) {
          return invalid_argument("unknown type '{}' at {}", type_name, path);
        }
      }
    }

    if (node.contains("const") || node.contains("enum")) {
      std::vector<const Json*> values;
      if (node.contains("const")) {
        values.push_back(&node["const"]);
      } else {
        const Json& options = node["enum"];
        if (!options.is_array()) return invalid_argument("'enum' at {} must be an array", path);
        for (const Json& value : options) values.push_back(&value);
      }
      std::vector<RuleId> branches;
      for (const Json* value : values) {
        const bool typed =
            types.empty() || std::any_of(types.begin(), types.end(),
                                         [&](const auto& t) { return value_has_type(*value, t); });
        if (typed) branches.push_back(literal_rule(value->dump()));
      }
      return alternation(branches, path + "/enum");
    }

    if (types.empty()) {
      // No type: what the keywords imply, or any value.
      if (node.contains("properties") || node.contains("required") ||
          node.contains("additionalProperties")) {
        types.push_back("object");
      } else if (node.contains("items") || node.contains("minItems") || node.contains("maxItems")) {
        types.push_back("array");
      } else if (node.contains("minLength") || node.contains("maxLength")) {
        types.push_back("string");
      } else {
        return any_value(depth);
      }
    }
    std::vector<RuleId> branches;
    for (const std::string& type : types) {
      FOLIO_ASSIGN_OR_RETURN(RuleId branch, compile_type(node, type, path, depth));
      if (branch != kEmptyLanguage) branches.push_back(branch);
    }
    return alternation(branches, path);
  }

  RuleId alternation(const std::vector<RuleId>& branches, const std::string& name) {
    if (branches.empty()) return kEmptyLanguage;
    if (branches.size() == 1) return branches[0];
    const RuleId rule = builder_.add_rule(name);
    for (RuleId branch : branches) builder_.add_alternative(rule, {ref(branch)});
    return rule;
  }

  Result<RuleId> compile_type(const Json& node, const std::string& type, const std::string& path,
                              int32_t depth) {
    if (type == "string") {
      FOLIO_ASSIGN_OR_RETURN(int64_t min, bound(node, "minLength", 0, path));
      FOLIO_ASSIGN_OR_RETURN(int64_t max, bound(node, "maxLength", -1, path));
      if (max >= 0 && min > max) return kEmptyLanguage;
      return string_of_length(min, max);
    }
    if (type == "number") return number();
    if (type == "integer") return integer();
    if (type == "boolean") {
      return alternation({literal_rule("true"), literal_rule("false")}, "boolean");
    }
    if (type == "null") return literal_rule("null");
    if (type == "array") return compile_array(node, path, depth);
    FOLIO_CHECK(type == "object", "type names were checked: {}", type);
    return compile_object(node, path, depth);
  }

  Result<RuleId> compile_array(const Json& node, const std::string& path, int32_t depth) {
    FOLIO_ASSIGN_OR_RETURN(int64_t min, bound(node, "minItems", 0, path));
    FOLIO_ASSIGN_OR_RETURN(int64_t max, bound(node, "maxItems", -1, path));
    if (too_deep(depth) || (max >= 0 && min > max)) return kEmptyLanguage;
    RuleId item = kEmptyLanguage;
    if (!node.contains("items")) {
      item = any_value(depth + 1);
    } else if (node["items"].is_array()) {
      return invalid_argument("'items' at {} is an array (a tuple); use one schema", path);
    } else {
      FOLIO_ASSIGN_OR_RETURN(item, compile_node(node["items"], path + "/items", depth + 1));
    }
    if (item == kEmptyLanguage) {
      if (min > 0) return kEmptyLanguage;
      max = 0;
    }
    return array_of(item, min, max, path + "/array");
  }

  Result<RuleId> compile_object(const Json& node, const std::string& path, int32_t depth) {
    if (too_deep(depth)) return kEmptyLanguage;
    std::vector<std::string> required;
    if (node.contains("required")) {
      const Json& names = node["required"];
      if (!names.is_array()) return invalid_argument("'required' at {} must be an array", path);
      for (const Json& name : names) {
        if (!name.is_string()) return invalid_argument("'required' at {} lists a non-string", path);
        required.push_back(name.get<std::string>());
      }
    }
    const Json* additional =
        node.contains("additionalProperties") ? &node["additionalProperties"] : nullptr;
    if (!node.contains("properties")) {
      if (!required.empty()) {
        return invalid_argument("'required' without 'properties' at {} is not supported", path);
      }
      if (additional == nullptr || (additional->is_boolean() && additional->get<bool>())) {
        return any_object(depth);
      }
      if (additional->is_boolean()) {
        return sequence_rule(path + "/empty", {byte('{'), ref(whitespace()), byte('}')});
      }
      FOLIO_ASSIGN_OR_RETURN(RuleId value,
                             compile_node(*additional, path + "/additionalProperties", depth + 1));
      if (value == kEmptyLanguage) {
        return sequence_rule(path + "/empty", {byte('{'), ref(whitespace()), byte('}')});
      }
      return map_object(value, path + "/map");
    }
    const Json& properties = node["properties"];
    if (!properties.is_object())
      return invalid_argument("'properties' at {} must be an object", path);
    for (const std::string& name : required) {
      if (!properties.contains(name)) {
        return invalid_argument("required property '{}' at {} is not in 'properties'", name, path);
      }
    }
    struct Member {
      RuleId rule;
      bool required;
    };
    std::vector<Member> members;
    const RuleId ws = whitespace();
    for (const auto& [name, schema] : properties.items()) {
      const std::string property_path = path + "/properties/" + escape_pointer_token(name);
      FOLIO_ASSIGN_OR_RETURN(RuleId value, compile_node(schema, property_path, depth + 1));
      const bool is_required = std::find(required.begin(), required.end(), name) != required.end();
      if (value == kEmptyLanguage) {
        if (is_required) return kEmptyLanguage;
        continue;
      }
      const RuleId member = sequence_rule(
          property_path + "/member",
          {ref(literal_rule(Json(name).dump())), ref(ws), byte(':'), ref(ws), ref(value)});
      members.push_back(Member{.rule = member, .required = is_required});
    }
    // rest[i][emitted]: the members from i on, `emitted` saying whether one came before (so the
    // next needs a comma). Built from the end.
    RuleId rest_none = builder_.add_rule(path + "/end");
    builder_.add_alternative(rest_none, {});
    RuleId rest_first = rest_none;  // nothing emitted yet
    RuleId rest_after = rest_none;  // something emitted
    for (size_t i = members.size(); i-- > 0;) {
      const RuleId first = builder_.add_rule(fmt::format("{}/members{}", path, i));
      const RuleId after = builder_.add_rule(fmt::format("{}/members{}+", path, i));
      builder_.add_alternative(first, {ref(ws), ref(members[i].rule), ref(rest_after)});
      builder_.add_alternative(
          after, {ref(ws), byte(','), ref(ws), ref(members[i].rule), ref(rest_after)});
      if (!members[i].required) {
        builder_.add_alternative(first, {ref(rest_first)});
        builder_.add_alternative(after, {ref(rest_after)});
      }
      rest_first = first;
      rest_after = after;
    }
    return sequence_rule(path + "/object", {byte('{'), ref(rest_first), ref(ws), byte('}')});
  }

  const Json& root_;
  SchemaOptions options_;
  GrammarBuilder builder_;
  std::map<std::pair<std::string, int32_t>, RuleId> compiled_;
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

}  // namespace

Result<Grammar> compile_parsed_json_schema(const nlohmann::ordered_json& schema,
                                           const SchemaOptions& options) {
  if (options.max_whitespace < 0 || options.max_nesting_depth < 0) {
    return invalid_argument("max_whitespace and max_nesting_depth must be non-negative");
  }
  SchemaCompiler compiler(schema, options);
  return compiler.compile_schema();
}

Result<Grammar> compile_json_schema(std::string_view schema_json, const SchemaOptions& options) {
  Json schema;
  try {
    schema = Json::parse(schema_json);
  } catch (const nlohmann::json::exception& error) {
    return invalid_argument("the JSON schema is not valid JSON: {}", error.what());
  }
  return compile_parsed_json_schema(schema, options);
}

Grammar json_object_grammar(const SchemaOptions& options) {
  FOLIO_CHECK(options.max_whitespace >= 0 && options.max_nesting_depth >= 0);
  const Json empty;
  SchemaCompiler compiler(empty, options);
  Result<Grammar> grammar = compiler.compile_any_object();
  FOLIO_CHECK(grammar.ok(), "the JSON object grammar always builds: {}",
              grammar.status().to_string());
  return std::move(grammar).value();
}

}  // namespace folio::server
