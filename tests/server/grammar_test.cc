// Grammars, their matcher and the JSON schema compiler: texts each hand-written schema must
// accept and must refuse, composition for tool-call envelopes, and the keywords refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "folio/server/grammar.h"
#include "folio/server/grammar_matcher.h"
#include "folio/server/json_schema_grammar.h"

namespace folio::server {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const Grammar> compile(std::string_view schema, const SchemaOptions& options = {}) {
  Result<Grammar> grammar = compile_json_schema(schema, options);
  EXPECT_TRUE(grammar.ok()) << grammar.status();
  if (!grammar.ok()) return nullptr;
  return std::make_shared<const Grammar>(std::move(grammar).value());
}

// Whether the whole text is in the grammar's language.
bool matches(const std::shared_ptr<const Grammar>& grammar, std::string_view text) {
  GrammarMatcher matcher(grammar);
  return matcher.matches(text);
}

constexpr std::string_view kPersonSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer"},
    "email": {"type": "string"},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2},
    "height": {"type": "number"},
    "alive": {"type": "boolean"},
    "spouse": {"type": ["string", "null"]}
  },
  "required": ["name", "age", "tags", "height", "alive", "spouse"],
  "additionalProperties": false
})";

TEST(JsonSchemaGrammarTest, ObjectAcceptsDeclaredOrderOptionalPropertiesAndBoundedWhitespace) {
  auto grammar = compile(kPersonSchema);
  ASSERT_NE(grammar, nullptr);
  const std::vector<std::string> accepted = {
      R"({"name":"Ann","age":3,"tags":["a"],"height":1.5,"alive":true,"spouse":null})",
      R"({"name":"Ann","age":-3,"email":"x@y","tags":["a","b"],"height":-0.5E+10,"alive":false,"spouse":"Bo"})",
      // 20 bytes of whitespace
      "{\n                   \"name\": \"Ann\",\n  \"age\": 0,\n  \"tags\": [ \"b\" ],\n  "
      "\"height\": 1e5,\n"
      "  \"alive\": true,\n  \"spouse\": null\n}",
      R"(  {"name":"","age":10,"tags":["a"],"height":0,"alive":true,"spouse":null})",
  };
  for (const std::string& text : accepted) EXPECT_TRUE(matches(grammar, text)) << text;
  const std::vector<std::string> refused = {
      // a required property missing
      R"({"name":"Ann","tags":["a"],"height":1.5,"alive":true,"spouse":null})",
      // an undeclared property
      R"({"name":"Ann","age":3,"x":1,"tags":["a"],"height":1.5,"alive":true,"spouse":null})",
      // out of declared order
      R"({"age":3,"name":"Ann","tags":["a"],"height":1.5,"alive":true,"spouse":null})",
      // maxLength 8
      R"({"name":"Annabelle","age":3,"tags":["a"],"height":1.5,"alive":true,"spouse":null})",
      // integer with a fraction
      R"({"name":"Ann","age":3.5,"tags":["a"],"height":1.5,"alive":true,"spouse":null})",
      // enum value not listed; minItems 1; maxItems 2
      R"({"name":"Ann","age":3,"tags":["c"],"height":1.5,"alive":true,"spouse":null})",
      R"({"name":"Ann","age":3,"tags":[],"height":1.5,"alive":true,"spouse":null})",
      R"({"name":"Ann","age":3,"tags":["a","b","a"],"height":1.5,"alive":true,"spouse":null})",
      // trailing comma
      R"({"name":"Ann","age":3,"tags":["a"],"height":1.5,"alive":true,"spouse":null,})",
      // number syntax: leading zero, bare dot, missing fraction digits
      R"({"name":"Ann","age":03,"tags":["a"],"height":1.5,"alive":true,"spouse":null})",
      R"({"name":"Ann","age":3,"tags":["a"],"height":.5,"alive":true,"spouse":null})",
      R"({"name":"Ann","age":3,"tags":["a"],"height":1.,"alive":true,"spouse":null})",
      // a boolean spelled otherwise, a type not in the list
      R"({"name":"Ann","age":3,"tags":["a"],"height":1.5,"alive":True,"spouse":null})",
      R"({"name":"Ann","age":3,"tags":["a"],"height":1.5,"alive":true,"spouse":1})",
      // 21 bytes of whitespace (the default bound is 20)
      "{\"name\":\"Ann\",\n                    \"age\":3,\"tags\":[\"a\"],\"height\":1.5,"
      "\"alive\":true,\"spouse\":null}",
      // not an object at all, and an incomplete one
      R"(["Ann"])",
      R"({"name":"Ann","age":3)",
  };
  for (const std::string& text : refused) EXPECT_FALSE(matches(grammar, text)) << text;
}

TEST(JsonSchemaGrammarTest, StringsTakeEscapesAndUtf8ButNotControlsOrBrokenSequences) {
  auto grammar = compile(R"({"type": "string"})");
  ASSERT_NE(grammar, nullptr);
  for (std::string_view text :
       {R"("plain")", R"("q\" b\\ s\/ \b\f\n\r\t")", R"("\u00e9\uFFFF\u0000")", R"("\ud83d\ude00")",
        "\"caf\xC3\xA9 \xE2\x98\x83 \xF0\x9F\x98\x80\"", "\"\x7F\""}) {
    EXPECT_TRUE(matches(grammar, text)) << text;
  }
  for (std::string_view text : {
           "\"tab\there\"",         // a raw control character
           R"("\x41")",             // not a JSON escape
           R"("\ud800")",           // a high surrogate alone
           R"("\udc00")",           // a low surrogate alone
           R"("\ud800\u0041")",     // a high surrogate followed by a non-surrogate
           "\"\xC0\x80\"",          // overlong NUL
           "\"\xED\xA0\x80\"",      // an encoded surrogate
           "\"\xF4\x90\x80\x80\"",  // above U+10FFFF
           "\"\xE2\x98\"",          // a truncated character
           "\"\x80\"",              // a lone continuation byte
           R"("unterminated)",
       }) {
    EXPECT_FALSE(matches(grammar, text)) << text;
  }
}

TEST(JsonSchemaGrammarTest, LengthBoundsCountCodePoints) {
  auto grammar = compile(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  ASSERT_NE(grammar, nullptr);
  EXPECT_FALSE(matches(grammar, "\"\xC3\xA9\""));  // one code point, two bytes
  EXPECT_TRUE(matches(grammar, "\"\xC3\xA9\xC3\xA9\""));
  EXPECT_TRUE(matches(grammar, R"("a\nb")"));  // an escape is one character
  EXPECT_FALSE(matches(grammar, R"("abcd")"));
}

TEST(JsonSchemaGrammarTest, EnumConstAnyOfAndTypeArrays) {
  auto grammar = compile(R"({"anyOf": [
      {"enum": ["red", 1, null, {"k": [true]}, "say \"hi\""]},
      {"type": ["boolean", "array"], "items": {"const": 2.5}, "maxItems": 1}]})");
  ASSERT_NE(grammar, nullptr);
  for (std::string_view text : {R"("red")", "1", "null", R"({"k":[true]})", R"("say \"hi\"")",
                                "false", "[]", "[2.5]", "[ 2.5 ]"}) {
    EXPECT_TRUE(matches(grammar, text)) << text;
  }
  for (std::string_view text : {R"("blue")", "2", "[2.5,2.5]", "[3]", R"({"k":[false]})"}) {
    EXPECT_FALSE(matches(grammar, text)) << text;
  }
}

constexpr std::string_view kTreeSchema = R"({
  "$defs": {"node": {"type": "object",
    "properties": {"v": {"type": "integer"},
                   "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
    "required": ["v"], "additionalProperties": false}},
  "$ref": "#/$defs/node"})";

TEST(JsonSchemaGrammarTest, RecursiveRefNestsToAnyDepthUnlessCapped) {
  std::string deep = R"({"v":0})";
  for (int i = 0; i < 40; ++i) deep = R"({"v":1,"kids":[)" + deep + R"(,{"v":0}]})";
  auto unlimited = compile(kTreeSchema);
  ASSERT_NE(unlimited, nullptr);
  EXPECT_TRUE(matches(unlimited, deep));
  EXPECT_FALSE(matches(unlimited, R"({"v":1,"kids":[{"kids":[]}]})"));  // nested v missing

  SchemaOptions capped;
  capped.max_nesting_depth = 3;  // node, kids, node: the inner node has no kids
  auto shallow = compile(kTreeSchema, capped);
  ASSERT_NE(shallow, nullptr);
  EXPECT_TRUE(matches(shallow, R"({"v":1,"kids":[{"v":2}]})"));
  EXPECT_FALSE(matches(shallow, R"({"v":1,"kids":[{"v":2,"kids":[]}]})"));
}

TEST(JsonSchemaGrammarTest, JsonObjectModeIsAnyObject) {
  auto grammar = std::make_shared<const Grammar>(json_object_grammar());
  for (std::string_view text :
       {"{}", R"({"a":[1,{"b":null}],"c":"d"})", "{ \"x\" : -1.5e-3 , \"y\" : [ ] }"}) {
    EXPECT_TRUE(matches(grammar, text)) << text;
  }
  for (std::string_view text : {"[]", "1", R"("s")", R"({"a":})", R"({a:1})", "{}{}"}) {
    EXPECT_FALSE(matches(grammar, text)) << text;
  }
}

TEST(JsonSchemaGrammarTest, ObjectsWithoutPropertiesAreMapsAnyObjectsOrEmpty) {
  auto map = compile(R"({"type": "object", "additionalProperties": {"type": "integer"}})");
  ASSERT_NE(map, nullptr);
  EXPECT_TRUE(matches(map, R"({"a": 1, "b": -2})"));
  EXPECT_TRUE(matches(map, "{}"));
  EXPECT_FALSE(matches(map, R"({"a": "x"})"));
  auto empty = compile(R"({"type": "object", "additionalProperties": false})");
  ASSERT_NE(empty, nullptr);
  EXPECT_TRUE(matches(empty, "{ }"));
  EXPECT_FALSE(matches(empty, R"({"a": 1})"));
  auto any = compile(R"({"type": "object"})");
  ASSERT_NE(any, nullptr);
  EXPECT_TRUE(matches(any, R"({"a": [1, {"b": "c"}]})"));
  auto anything = compile("{}");
  ASSERT_NE(anything, nullptr);
  EXPECT_TRUE(matches(anything, R"("text")"));
  EXPECT_TRUE(matches(anything, "[1, null]"));
}

TEST(JsonSchemaGrammarTest, WhitespaceBoundIsConfigurable) {
  SchemaOptions compact;
  compact.max_whitespace = 0;
  auto grammar = compile(R"({"type": "array", "items": {"type": "integer"}})", compact);
  ASSERT_NE(grammar, nullptr);
  EXPECT_TRUE(matches(grammar, "[1,2]"));
  EXPECT_FALSE(matches(grammar, "[1, 2]"));
}

TEST(GrammarCompositionTest, ToolCallEnvelopeAroundSchemaArguments) {
  Result<Grammar> arguments = compile_json_schema(
      R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
          "additionalProperties": false})");
  ASSERT_TRUE(arguments.ok()) << arguments.status();
  const Grammar call = sequence({literal("<tool_call>\n{\"name\": \"weather\", \"arguments\": "),
                                 *arguments, literal("}\n</tool_call>")});
  const Grammar other = sequence({literal("<tool_call>\n{\"name\": \"time\", \"arguments\": "),
                                  json_object_grammar(), literal("}\n</tool_call>")});
  auto either = std::make_shared<const Grammar>(alternatives({call, other}));
  EXPECT_TRUE(matches(either,
                      "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
                      "</tool_call>"));
  EXPECT_TRUE(
      matches(either, "<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(
      matches(either, "<tool_call>\n{\"name\": \"weather\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(matches(either, "{\"name\": \"time\", \"arguments\": {}}"));
  EXPECT_TRUE(matches(std::make_shared<const Grammar>(literal("")), ""));
}

TEST(GrammarCompositionTest, TextWithoutAvoidsItsTextAnywhereAndItsFirstBytes) {
  auto without = std::make_shared<const Grammar>(text_without("<tool_call>"));
  for (std::string_view text : {"", "plain", "<tool_cal", "a <tool <tool_call", "<<tool_call",
                                "\xff\x00<tool_callx>", "tool_call>"}) {
    EXPECT_TRUE(matches(without, text)) << text;
  }
  for (std::string_view text :
       {"<tool_call>", "x<tool_call>", "<<tool_call>y", "<tool_<tool_call>"}) {
    EXPECT_FALSE(matches(without, text)) << text;
  }
  // Overlapping prefixes: the automaton falls back to the longest one still matched.
  auto repeats = std::make_shared<const Grammar>(text_without("aab"));
  EXPECT_TRUE(matches(repeats, "aaaaa ba abab"));
  EXPECT_FALSE(matches(repeats, "aaaab"));
  auto opening = std::make_shared<const Grammar>(text_without("", "{ "));
  EXPECT_TRUE(matches(opening, "text {with} braces"));
  EXPECT_TRUE(matches(opening, ""));
  EXPECT_FALSE(matches(opening, "{\"name\": 1}"));
  EXPECT_FALSE(matches(opening, " lead"));
}

TEST(GrammarCompositionTest, TextInterleavedWithCallsHoldsEveryTriggeredCall) {
  Result<Grammar> arguments = compile_json_schema(
      R"({"type": "object", "properties": {"city": {"enum": ["Oslo"]}}, "required": ["city"],
          "additionalProperties": false})");
  ASSERT_TRUE(arguments.ok()) << arguments.status();
  const Grammar call = sequence({literal("<tool_call>\n"), *arguments, literal("\n</tool_call>")});
  GrammarBuilder builder;
  const RuleId text = builder.add_grammar(text_without("<tool_call>"));
  const RuleId one = builder.add_grammar(call);
  const RuleId answer = builder.add_rule("answer");
  builder.add_alternative(answer, {GrammarSymbol::rule(text)});
  builder.add_alternative(
      answer, {GrammarSymbol::rule(text), GrammarSymbol::rule(one), GrammarSymbol::rule(answer)});
  Result<Grammar> built = builder.build(answer);
  ASSERT_TRUE(built.ok()) << built.status();
  auto grammar = std::make_shared<const Grammar>(std::move(built).value());
  EXPECT_TRUE(matches(grammar, "Let me check."));
  EXPECT_TRUE(matches(grammar,
                      "Sure <tool_call>\n{\"city\": \"Oslo\"}\n</tool_call> and "
                      "<tool_call>\n{\"city\": \"Oslo\"}\n</tool_call>done"));
  EXPECT_FALSE(matches(grammar, "Sure <tool_call>\n{\"city\": \"Rome\"}\n</tool_call>"));
  EXPECT_FALSE(matches(grammar, "<tool_call>\n{\"city\": \"Oslo\"}"));
}

TEST(GrammarBuilderTest, RefusesLeftRecursionAndRulesWithoutAlternatives) {
  GrammarBuilder builder;
  const RuleId list = builder.add_rule("list");
  builder.add_alternative(list, {GrammarSymbol::rule(list), GrammarSymbol::byte('x')});
  builder.add_alternative(list, {GrammarSymbol::byte('y')});
  Result<Grammar> grammar = builder.build(list);
  ASSERT_FALSE(grammar.ok());
  EXPECT_THAT(grammar.status().message(), HasSubstr("'list' is left-recursive"));

  GrammarBuilder empty_builder;
  const RuleId root = empty_builder.add_rule("root");
  const RuleId missing = empty_builder.add_rule("missing");
  empty_builder.add_alternative(root, {GrammarSymbol::rule(missing)});
  Result<Grammar> incomplete = empty_builder.build(root);
  ASSERT_FALSE(incomplete.ok());
  EXPECT_THAT(incomplete.status().message(), HasSubstr("'missing' has no alternatives"));
}

TEST(GrammarBuilderTest, ToStringShowsRulesAlternativesAndByteSets) {
  GrammarBuilder builder;
  const RuleId digit = builder.add_rule("digit");
  builder.add_alternative(digit, {GrammarSymbol::bytes(ByteSet::range('0', '9'))});
  const RuleId root = builder.add_rule("number");
  builder.add_alternative(root, {GrammarSymbol::rule(digit), GrammarSymbol::rule(root)});
  builder.add_alternative(root, {});
  Result<Grammar> grammar = builder.build(root);
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  EXPECT_EQ(grammar->to_string(), "digit ::= [0-9]\n*number ::=  <digit>  <number>  | \"\"\n");
}

TEST(GrammarBuilderTest, QuotedBytesEscapeQuotesBackslashesAndNonAscii) {
  EXPECT_EQ(quoted_bytes("a\"b\\c\n\xC3\xA9"), R"("a\"b\\c\x0A\xC3\xA9")");
}

TEST(GrammarMatcherTest, RefusedBytesLeaveTheMatcherWhereItWas) {
  GrammarMatcher matcher(std::make_shared<const Grammar>(literal("abc")));
  EXPECT_TRUE(matcher.accept("ab"));
  EXPECT_FALSE(matcher.accept("x"));
  EXPECT_FALSE(matcher.is_complete());
  EXPECT_TRUE(matcher.accept("c"));
  EXPECT_TRUE(matcher.is_complete());
  EXPECT_FALSE(matcher.can_continue());
}

std::string compile_error(std::string_view schema, const SchemaOptions& options = {}) {
  Result<Grammar> grammar = compile_json_schema(schema, options);
  EXPECT_FALSE(grammar.ok()) << schema;
  return grammar.ok() ? "" : std::string(grammar.status().message());
}

TEST(JsonSchemaGrammarTest, RefusedKeywordsNameTheKeywordAndItsPath) {
  EXPECT_EQ(compile_error(R"({"type": "object", "properties": {"zip": {"type": "string",
                              "pattern": "^[0-9]+$"}}})"),
            "unsupported keyword 'pattern' at #/properties/zip");
  EXPECT_EQ(compile_error(R"({"type": "array", "items": {"type": "string", "format": "date"}})"),
            "unsupported keyword 'format' at #/items");
  EXPECT_EQ(compile_error(R"({"$defs": {"a": {"if": {}, "then": {}}}, "$ref": "#/$defs/a"})"),
            "unsupported keyword 'if' at #/$defs/a");
  EXPECT_EQ(compile_error(R"({"type": "integer", "minimum": 0})"),
            "unsupported keyword 'minimum' at #");
  EXPECT_EQ(compile_error(R"({"type": "object", "patternProperties": {"^x": {}}})"),
            "unsupported keyword 'patternProperties' at #");
  EXPECT_EQ(compile_error(R"({"type": "string", "x-unknown": 1})"),
            "unsupported keyword 'x-unknown' at #");

  // Outside strict mode the narrowing keywords and unknown ones are ignored; pattern is not.
  SchemaOptions lenient;
  lenient.strict = false;
  EXPECT_TRUE(
      compile_json_schema(R"({"type": "string", "format": "date", "x-unknown": 1})", lenient).ok());
  EXPECT_TRUE(compile_json_schema(R"({"type": "integer", "minimum": 0})", lenient).ok());
  EXPECT_EQ(compile_error(R"({"type": "string", "pattern": "a+"})", lenient),
            "unsupported keyword 'pattern' at #");
}

TEST(JsonSchemaGrammarTest, MalformedSchemasGetActionableErrors) {
  EXPECT_THAT(compile_error("{not json"), HasSubstr("not valid JSON"));
  EXPECT_EQ(compile_error(R"({"$ref": "#/$defs/missing"})"),
            "'$ref' #/$defs/missing at # does not resolve");
  EXPECT_EQ(compile_error(R"({"type": "strin"})"), "unknown type 'strin' at #");
  EXPECT_EQ(compile_error(R"({"allOf": [{}, {}]})"),
            "'allOf' at # is supported with exactly one schema");
  EXPECT_EQ(compile_error(R"({"type": "object", "properties": {}, "required": ["a"]})"),
            "required property 'a' at # is not in 'properties'");
  EXPECT_EQ(compile_error(R"({"type": "string", "maxLength": 100000})"),
            "'maxLength' at # is 100000; at most 4096 is supported");
  EXPECT_EQ(compile_error(R"({"enum": []})"), "the JSON schema admits no value");
  EXPECT_EQ(compile_error(R"({"type": "string", "anyOf": [{}]})"),
            "keyword 'type' beside 'anyOf' at # is not supported");
  SchemaOptions capped;
  capped.max_nesting_depth = 1;
  EXPECT_EQ(
      compile_error(R"({"type": "array", "items": {"type": "array"}, "minItems": 1})", capped),
      "the JSON schema admits no value within max_nesting_depth");
}

}  // namespace
}  // namespace folio::server
