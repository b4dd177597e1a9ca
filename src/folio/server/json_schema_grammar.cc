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
#include "folio/server/json_grammar_rules.h"

namespace folio::server {

namespace {

using Json = nlohmann::ordered_json;

// A schema (or branch) that admits no value here: dropped from alternations, fatal when
// required.
constexpr RuleId kEmptyLanguage = JsonGrammarRules::kEmptyLanguage;
// Largest minLength / maxLength / minItems / maxItems compiled (each unit of a bound is a rule).
constexpr int64_t kMaxBound = 4096;

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

  Result<Grammar> compile_any_object() { return finish(rules_.any_object(0)); }

 private:
  Result<Grammar> finish(RuleId value) {
    const RuleId root = rules_.sequence_rule("root", {ref(rules_.whitespace()), ref(value)});
    return builder_.build(root);
  }

  static GrammarSymbol ref(RuleId rule) { return GrammarSymbol::rule(rule); }
  static GrammarSymbol byte(char c) { return GrammarSymbol::byte(static_cast<uint8_t>(c)); }

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
    const auto key = std::make_pair(path, rules_.depth_key(depth));
    auto it = compiled_.find(key);
    if (it != compiled_.end()) return it->second;
    if (node.is_boolean()) return node.get<bool>() ? rules_.any_value(depth) : kEmptyLanguage;
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

  // The schema's own rule: $ref, allOf, anyOf/oneOf, enum/const or its types, in that order.
  Result<RuleId> compile_body(const Json& node, const std::string& path, int32_t depth) {
    FOLIO_RETURN_IF_ERROR(check_keywords(node, path));
    if (node.contains("$ref")) return compile_reference(node, path, depth);
    if (node.contains("allOf")) {
      FOLIO_RETURN_IF_ERROR(check_alone(node, "allOf", path));
      const Json& all = node["allOf"];
      if (!all.is_array() || all.size() != 1) {
        return invalid_argument("'allOf' at {} is supported with exactly one schema", path);
      }
      return compile_node(all[0], path + "/allOf/0", depth);
    }
    for (const char* keyword : {"anyOf", "oneOf"}) {
      if (node.contains(keyword)) return compile_branches(node, keyword, path, depth);
    }
    FOLIO_ASSIGN_OR_RETURN(std::vector<std::string> types, declared_types(node, path));
    if (node.contains("const") || node.contains("enum")) return compile_values(node, types, path);
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
        return rules_.any_value(depth);
      }
    }
    std::vector<RuleId> branches;
    for (const std::string& type : types) {
      FOLIO_ASSIGN_OR_RETURN(RuleId branch, compile_type(node, type, path, depth));
      if (branch != kEmptyLanguage) branches.push_back(branch);
    }
    return alternation(branches, path);
  }

  Result<RuleId> compile_reference(const Json& node, const std::string& path, int32_t depth) {
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
    // Keyed by the target's pointer, so every reference (and recursion) shares one rule.
    return compile_node(*target, target_path, depth);
  }

  // anyOf / oneOf: the alternation of the branches that admit a value here.
  Result<RuleId> compile_branches(const Json& node, const char* keyword, const std::string& path,
                                  int32_t depth) {
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
    return alternation(branches, fmt::format("{}/{}", path, keyword));
  }

  // `type` as a list (empty when absent).
  static Result<std::vector<std::string>> declared_types(const Json& node,
                                                         const std::string& path) {
    std::vector<std::string> types;
    if (!node.contains("type")) return types;
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
    static const std::set<std::string, std::less<>> kTypes = {
        "object", "array", "string", "number", "integer", "boolean", "null"};
    for (const std::string& name : types) {
      if (!kTypes.contains(name)) return invalid_argument("unknown type '{}' at {}", name, path);
    }
    return types;
  }

  // const / enum: each value's serialization, keeping only values of the declared types.
  Result<RuleId> compile_values(const Json& node, const std::vector<std::string>& types,
                                const std::string& path) {
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
          types.empty() || std::any_of(types.begin(), types.end(), [&](const std::string& type) {
            return value_has_type(*value, type);
          });
      if (typed) branches.push_back(rules_.literal_rule(value->dump()));
    }
    return alternation(branches, path + "/enum");
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
      return rules_.string_of_length(min, max);
    }
    if (type == "number") return rules_.number();
    if (type == "integer") return rules_.integer();
    if (type == "boolean") {
      return alternation({rules_.literal_rule("true"), rules_.literal_rule("false")}, "boolean");
    }
    if (type == "null") return rules_.literal_rule("null");
    if (type == "array") return compile_array(node, path, depth);
    FOLIO_CHECK(type == "object", "type names were checked: {}", type);
    return compile_object(node, path, depth);
  }

  Result<RuleId> compile_array(const Json& node, const std::string& path, int32_t depth) {
    FOLIO_ASSIGN_OR_RETURN(int64_t min, bound(node, "minItems", 0, path));
    FOLIO_ASSIGN_OR_RETURN(int64_t max, bound(node, "maxItems", -1, path));
    if (rules_.too_deep(depth) || (max >= 0 && min > max)) return kEmptyLanguage;
    RuleId item = kEmptyLanguage;
    if (!node.contains("items")) {
      item = rules_.any_value(depth + 1);
    } else if (node["items"].is_array()) {
      return invalid_argument("'items' at {} is an array (a tuple); use one schema", path);
    } else {
      FOLIO_ASSIGN_OR_RETURN(item, compile_node(node["items"], path + "/items", depth + 1));
    }
    if (item == kEmptyLanguage) {
      if (min > 0) return kEmptyLanguage;
      max = 0;
    }
    return rules_.array_of(item, min, max, path + "/array");
  }

  // An object without `properties`: any object, "{}" (additionalProperties false), or a map
  // whose values follow the additionalProperties schema.
  Result<RuleId> compile_open_object(const Json& node, const std::string& path, int32_t depth) {
    const Json* additional =
        node.contains("additionalProperties") ? &node["additionalProperties"] : nullptr;
    if (additional == nullptr || (additional->is_boolean() && additional->get<bool>())) {
      return rules_.any_object(depth);
    }
    RuleId value = kEmptyLanguage;
    if (!additional->is_boolean()) {
      FOLIO_ASSIGN_OR_RETURN(value,
                             compile_node(*additional, path + "/additionalProperties", depth + 1));
    }
    if (value == kEmptyLanguage) {
      return rules_.sequence_rule(path + "/empty",
                                  {byte('{'), ref(rules_.whitespace()), byte('}')});
    }
    return rules_.map_object(value, path + "/map");
  }

  // An object with `properties`: the declared members in order, the required ones always.
  Result<RuleId> compile_object(const Json& node, const std::string& path, int32_t depth) {
    if (rules_.too_deep(depth)) return kEmptyLanguage;
    std::vector<std::string> required;
    if (node.contains("required")) {
      const Json& names = node["required"];
      if (!names.is_array()) return invalid_argument("'required' at {} must be an array", path);
      for (const Json& name : names) {
        if (!name.is_string()) return invalid_argument("'required' at {} lists a non-string", path);
        required.push_back(name.get<std::string>());
      }
    }
    if (!node.contains("properties")) {
      if (!required.empty()) {
        return invalid_argument("'required' without 'properties' at {} is not supported", path);
      }
      return compile_open_object(node, path, depth);
    }
    const Json& properties = node["properties"];
    if (!properties.is_object()) {
      return invalid_argument("'properties' at {} must be an object", path);
    }
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
    const RuleId ws = rules_.whitespace();
    for (const auto& [name, schema] : properties.items()) {
      const std::string property_path = path + "/properties/" + escape_pointer_token(name);
      FOLIO_ASSIGN_OR_RETURN(RuleId value, compile_node(schema, property_path, depth + 1));
      const bool is_required = std::find(required.begin(), required.end(), name) != required.end();
      if (value == kEmptyLanguage) {
        if (is_required) return kEmptyLanguage;
        continue;
      }
      const RuleId member = rules_.sequence_rule(
          property_path + "/member",
          {ref(rules_.literal_rule(Json(name).dump())), ref(ws), byte(':'), ref(ws), ref(value)});
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
    return rules_.sequence_rule(path + "/object", {byte('{'), ref(rest_first), ref(ws), byte('}')});
  }

  const Json& root_;
  SchemaOptions options_;
  GrammarBuilder builder_;
  JsonGrammarRules rules_{builder_, options_};
  std::map<std::pair<std::string, int32_t>, RuleId> compiled_;
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
