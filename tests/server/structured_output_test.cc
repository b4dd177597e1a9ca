// StructuredOutput over real vocabularies: random generations driven only by the mask (a random
// allowed token each step, as sampling at temperature 1 over random logits would) always parse
// with nlohmann::json and validate against their schema with an independent validator written
// here; the mask never empties before the text is complete; refused tokens change nothing;
// clones are independent.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "folio/gguf/gguf_file.h"
#include "folio/server/json_schema_grammar.h"
#include "folio/server/structured_output.h"
#include "folio/server/vocabulary_index.h"
#include "folio/tokenizer/spm_vocabulary_builder.h"
#include "folio/tokenizer/tokenizer.h"

namespace folio::server {
namespace {

using Json = nlohmann::json;

// ---- An independent JSON Schema validator for the subset the compiler supports. ----

int64_t code_points(const std::string& text) {
  int64_t count = 0;
  for (unsigned char c : text) count += (c & 0xC0) != 0x80;
  return count;
}

bool has_type(const Json& value, const std::string& type) {
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  if (type == "string") return value.is_string();
  if (type == "boolean") return value.is_boolean();
  if (type == "null") return value.is_null();
  if (type == "number") return value.is_number();
  if (type == "integer") {
    return value.is_number_integer() ||
           (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>());
  }
  return false;
}

bool validate(const Json& value, const Json& schema, const Json& root) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.contains("$ref")) {
    const std::string pointer = schema["$ref"].get<std::string>().substr(1);
    return validate(value, root.at(Json::json_pointer(pointer)), root);
  }
  if (schema.contains("anyOf")) {
    bool any = false;
    for (const Json& option : schema["anyOf"]) any = any || validate(value, option, root);
    if (!any) return false;
  }
  if (schema.contains("oneOf")) {
    int matching = 0;
    for (const Json& option : schema["oneOf"]) matching += validate(value, option, root);
    if (matching != 1) return false;
  }
  if (schema.contains("const") && !(value == schema["const"])) return false;
  if (schema.contains("enum")) {
    bool listed = false;
    for (const Json& option : schema["enum"]) listed = listed || value == option;
    if (!listed) return false;
  }
  if (schema.contains("type")) {
    const Json& type = schema["type"];
    bool typed = false;
    if (type.is_string()) {
      typed = has_type(value, type.get<std::string>());
    } else {
      for (const Json& t : type) typed = typed || has_type(value, t.get<std::string>());
    }
    if (!typed) return false;
  }
  if (value.is_string()) {
    const int64_t length = code_points(value.get<std::string>());
    if (schema.contains("minLength") && length < schema["minLength"].get<int64_t>()) return false;
    if (schema.contains("maxLength") && length > schema["maxLength"].get<int64_t>()) return false;
  }
  if (value.is_array()) {
    const auto size = static_cast<int64_t>(value.size());
    if (schema.contains("minItems") && size < schema["minItems"].get<int64_t>()) return false;
    if (schema.contains("maxItems") && size > schema["maxItems"].get<int64_t>()) return false;
    if (schema.contains("items")) {
      for (const Json& item : value) {
        if (!validate(item, schema["items"], root)) return false;
      }
    }
  }
  if (value.is_object()) {
    const Json properties = schema.value("properties", Json::object());
    if (schema.contains("required")) {
      for (const Json& name : schema["required"]) {
        if (!value.contains(name.get<std::string>())) return false;
      }
    }
    for (const auto& [key, member] : value.items()) {
      if (properties.contains(key)) {
        if (!validate(member, properties[key], root)) return false;
      } else if (schema.contains("additionalProperties") &&
                 !validate(member, schema["additionalProperties"], root)) {
        return false;
      }
    }
  }
  return true;
}

TEST(SchemaValidatorTest, RefusesWhatItShould) {
  const Json schema = Json::parse(R"({"type": "object", "properties": {
      "a": {"type": "integer"}, "b": {"type": "string", "maxLength": 2}},
      "required": ["a"], "additionalProperties": false})");
  EXPECT_TRUE(validate(Json::parse(R"({"a": 1, "b": "xy"})"), schema, schema));
  EXPECT_FALSE(validate(Json::parse(R"({"b": "xy"})"), schema, schema));
  EXPECT_FALSE(validate(Json::parse(R"({"a": 1.5})"), schema, schema));
  EXPECT_FALSE(validate(Json::parse(R"({"a": 1, "b": "xyz"})"), schema, schema));
  EXPECT_FALSE(validate(Json::parse(R"({"a": 1, "c": 0})"), schema, schema));
}

// ---- Vocabularies ----

struct TestVocabulary {
  std::string name;
  std::shared_ptr<const VocabularyIndex> index;
  std::vector<int32_t> end_tokens;
};

TestVocabulary generated_vocabulary() {
  Result<tokenizer::Vocabulary> vocabulary = tokenizer::build_llama_vocabulary(32000);
  EXPECT_TRUE(vocabulary.ok());
  Result<tokenizer::Tokenizer> tokenizer = tokenizer::Tokenizer::from_vocabulary(*vocabulary);
  EXPECT_TRUE(tokenizer.ok());
  Result<std::shared_ptr<const VocabularyIndex>> index = VocabularyIndex::create(*tokenizer);
  EXPECT_TRUE(index.ok());
  // The index's end-of-generation tokens are the vocabulary's EOS (</s>, id 2).
  EXPECT_EQ((*index)->end_of_generation_tokens(), std::vector<int32_t>{*tokenizer->eos()});
  return TestVocabulary{
      .name = "generated-spm-32000", .index = *index, .end_tokens = {*tokenizer->eos()}};
}

std::string shared_data_directory() {
  if (const char* directory = std::getenv("FOLIO_SHARED_DATA_DIR")) return directory;
  return FOLIO_SHARED_DATA_DIR;
}

// A vocabulary from ../shared/data (GPT-2's byte-level BPE, 50,257 tokens with many
// JSON-punctuation merges; Llama 2's SentencePiece, 32,000 tokens with byte fallback), when the
// directory is beside the checkout.
std::optional<TestVocabulary> shared_vocabulary(const std::string& file) {
  Result<gguf::GgufFile> gguf = gguf::GgufFile::open(shared_data_directory() + "/" + file);
  if (!gguf.ok()) return std::nullopt;
  Result<tokenizer::Tokenizer> tokenizer = tokenizer::Tokenizer::from_gguf(*gguf);
  if (!tokenizer.ok()) return std::nullopt;
  Result<std::shared_ptr<const VocabularyIndex>> index = VocabularyIndex::create(*tokenizer);
  if (!index.ok()) return std::nullopt;
  return TestVocabulary{
      .name = file, .index = *index, .end_tokens = (*index)->end_of_generation_tokens()};
}

// ---- The random driver ----

struct GenerationOutcome {
  std::string text;
  bool ended_by_token = false;
  int64_t tokens = 0;
};

// Draws allowed tokens until an end token is drawn or must_end(). Each draw is uniform over
// one pool of allowed tokens: every allowed token (40%), those of at most two bytes (30%), those
// that may close something (a quote, bracket, brace or comma in their bytes, or an end token;
// 30%), so that strings and containers end after a bounded number of steps on average.
struct TokenPools {
  explicit TokenPools(const VocabularyIndex& vocabulary) {
    for (int32_t t = 0; t < vocabulary.vocab_size(); ++t) {
      const std::string_view bytes = vocabulary.token_bytes(t);
      is_short.push_back(bytes.size() <= 2);
      // End tokens have no bytes.
      is_closing.push_back(bytes.empty() || bytes.find_first_of("\"]},") != std::string_view::npos);
    }
  }
  std::vector<bool> is_short;
  std::vector<bool> is_closing;
};

GenerationOutcome generate(StructuredOutput& constraint, const VocabularyIndex& vocabulary,
                           const TokenPools& pools, std::mt19937_64& rng, int64_t max_tokens) {
  GenerationOutcome outcome;
  std::vector<float> logits(static_cast<size_t>(vocabulary.vocab_size()) + 7);  // padded rows
  std::vector<int32_t> allowed;
  std::vector<int32_t> short_allowed;
  std::vector<int32_t> closing_allowed;
  while (!constraint.must_end() && outcome.tokens < max_tokens) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    constraint.mask_logits(logits);
    allowed.clear();
    short_allowed.clear();
    closing_allowed.clear();
    for (size_t t = 0; t < logits.size(); ++t) {
      if (std::isinf(logits[t])) continue;
      allowed.push_back(static_cast<int32_t>(t));
      if (t < pools.is_short.size() && pools.is_short[t])
        short_allowed.push_back(static_cast<int32_t>(t));
      if (t < pools.is_closing.size() && pools.is_closing[t])
        closing_allowed.push_back(static_cast<int32_t>(t));
    }
    // No dead ends: something is always allowed until the text may end.
    EXPECT_FALSE(allowed.empty()) << "dead end after " << outcome.text;
    if (allowed.empty()) return outcome;
    for (int32_t t : allowed) EXPECT_LT(t, vocabulary.vocab_size());
    const int pick = std::uniform_int_distribution<int>(0, 9)(rng);
    const std::vector<int32_t>& pool = (pick < 3 && !closing_allowed.empty()) ? closing_allowed
                                       : (pick < 6 && !short_allowed.empty()) ? short_allowed
                                                                              : allowed;
    const int32_t token = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
    const Status status = constraint.accept(token);
    EXPECT_TRUE(status.ok()) << status;
    if (!status.ok()) return outcome;
    ++outcome.tokens;
    if (!vocabulary.is_generable(token)) {
      outcome.ended_by_token = true;
      break;
    }
    outcome.text += vocabulary.token_bytes(token);
  }
  return outcome;
}

struct PropertyCase {
  std::string name;
  std::string schema;  // empty: json_object mode
  SchemaOptions options;
  int generations;
  bool end_tokens_drawn;  // some generations must end by drawing an end token
};

std::vector<PropertyCase> property_cases() {
  SchemaOptions defaults;
  SchemaOptions capped;
  capped.max_nesting_depth = 5;
  SchemaOptions object_depth;
  object_depth.max_nesting_depth = 3;
  return {
      {"nested object", R"({"type": "object", "properties": {
          "name": {"type": "string", "maxLength": 12},
          "age": {"type": "integer"},
          "email": {"type": "string", "minLength": 1, "maxLength": 6},
          "tags": {"type": "array", "items": {"enum": ["a", "b c", "q\"\\"]}, "maxItems": 3},
          "address": {"type": "object", "properties": {
              "street": {"type": "string", "maxLength": 8},
              "zip": {"type": ["string", "null"], "maxLength": 5}},
            "required": ["street", "zip"], "additionalProperties": false},
          "score": {"type": "number"},
          "active": {"type": "boolean"},
          "nothing": {"type": "null"}},
        "required": ["name", "age", "tags", "address", "active"],
        "additionalProperties": false})",
       defaults, 300, false},
      {"array of objects", R"({"type": "array", "minItems": 1, "maxItems": 4, "items": {
          "type": "object", "properties": {
            "id": {"type": "integer"},
            "label": {"enum": ["x", 1, null, true, {"k": [1, 2.5]}, "\u00e9\n"]}},
          "required": ["id"]}})",
       defaults, 300, false},
      {"escapes and unicode", R"({"type": "object", "properties": {
          "s": {"type": "string", "maxLength": 6},
          "c": {"const": "tab\tquote\"back\\slash \u00e9 \u2603 \ud83d\ude00"}},
        "required": ["s", "c"], "additionalProperties": false})",
       defaults, 300, false},
      {"anyOf and oneOf", R"({"type": "object", "properties": {
          "shape": {"anyOf": [
            {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
             "required": ["kind", "r"], "additionalProperties": false},
            {"type": "object", "properties": {"kind": {"const": "rect"},
               "w": {"type": "integer"}, "h": {"type": "integer"}},
             "required": ["kind", "w", "h"], "additionalProperties": false},
            {"type": "string", "maxLength": 3}]},
          "unit": {"oneOf": [{"const": "cm"}, {"type": "integer"}, {"type": "null"}]}},
        "required": ["shape", "unit"], "additionalProperties": false})",
       defaults, 300, false},
      {"recursive ref with a depth cap", R"({"$defs": {"node": {"type": "object", "properties": {
            "value": {"type": "integer"},
            "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}}},
          "required": ["value"], "additionalProperties": false}},
        "$ref": "#/$defs/node"})",
       capped, 300, false},
      {"json_object", "", object_depth, 60, false},
      // A top-level number can always take another digit, so only an end token ends it.
      {"top-level scalar", R"({"type": ["integer", "boolean"]})", defaults, 300, true},
  };
}

void run_property_case(const PropertyCase& test_case, const TestVocabulary& vocabulary,
                       const StructuredOutputOptions& options = {}) {
  SCOPED_TRACE(test_case.name + " over " + vocabulary.name);
  std::shared_ptr<const Grammar> grammar;
  Json schema = Json::parse(R"({"type": "object"})");
  if (test_case.schema.empty()) {
    grammar = std::make_shared<const Grammar>(json_object_grammar(test_case.options));
  } else {
    Result<Grammar> compiled = compile_json_schema(test_case.schema, test_case.options);
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    grammar = std::make_shared<const Grammar>(std::move(compiled).value());
    schema = Json::parse(test_case.schema);
  }
  Result<std::unique_ptr<engine::TokenConstraint>> prototype =
      make_structured_output(grammar, vocabulary.index, vocabulary.end_tokens, options);
  ASSERT_TRUE(prototype.ok()) << prototype.status();
  std::mt19937_64 rng(0x5eed + test_case.generations);
  const TokenPools pools(*vocabulary.index);
  int64_t total_tokens = 0;
  int ended_by_token = 0;
  for (int generation = 0; generation < test_case.generations; ++generation) {
    // Each generation starts from a clone of the untouched prototype, as n > 1 choices do.
    std::unique_ptr<engine::TokenConstraint> constraint = (*prototype)->clone();
    auto& structured = static_cast<StructuredOutput&>(*constraint);
    const GenerationOutcome outcome = generate(structured, *vocabulary.index, pools, rng, 4000);
    ASSERT_LT(outcome.tokens, 4000) << "did not finish: " << outcome.text.substr(0, 400);
    total_tokens += outcome.tokens;
    ended_by_token += outcome.ended_by_token;
    Json parsed;
    try {
      parsed = Json::parse(outcome.text);
    } catch (const Json::exception& error) {
      ADD_FAILURE() << "does not parse (" << error.what() << "): " << outcome.text;
      continue;
    }
    EXPECT_TRUE(validate(parsed, schema, schema)) << outcome.text;
  }
  if (test_case.end_tokens_drawn) {
    EXPECT_GT(ended_by_token, 0);
  }
  std::cout << "[ " << test_case.name << " / " << vocabulary.name << " ] " << test_case.generations
            << " generations, " << total_tokens << " tokens, " << ended_by_token
            << " ended by an end token (the others by must_end)\n";
}

// One test per schema, so ctest runs them side by side.
class RandomGenerationTest : public ::testing::TestWithParam<size_t> {};

TEST_P(RandomGenerationTest, ValidatesOverAGeneratedSentencePieceVocabulary) {
  static const TestVocabulary vocabulary = generated_vocabulary();
  run_property_case(property_cases()[GetParam()], vocabulary);
}

TEST_P(RandomGenerationTest, ValidatesOverGpt2Vocabulary) {
  static const std::optional<TestVocabulary> vocabulary =
      shared_vocabulary("ggml-vocab-gpt-2.gguf");
  if (!vocabulary) {
    GTEST_SKIP() << "ggml-vocab-gpt-2.gguf is absent (../shared/data is not beside this checkout; "
                    "set FOLIO_SHARED_DATA_DIR)";
  }
  run_property_case(property_cases()[GetParam()], *vocabulary);
}

TEST_P(RandomGenerationTest, ValidatesOverLlama2Vocabulary) {
  static const std::optional<TestVocabulary> vocabulary =
      shared_vocabulary("ggml-vocab-llama-spm.gguf");
  if (!vocabulary) {
    GTEST_SKIP() << "ggml-vocab-llama-spm.gguf is absent (../shared/data is not beside this "
                    "checkout; set FOLIO_SHARED_DATA_DIR)";
  }
  run_property_case(property_cases()[GetParam()], *vocabulary);
}

// A tiny automaton budget and memo make the automaton start over (keeping only the current
// state) every few tokens and the memo empty itself; generations stay valid.
TEST(StructuredOutputTest, AutomatonResetsAndMemoEvictionKeepGenerationsValid) {
  static const TestVocabulary vocabulary = generated_vocabulary();
  StructuredOutputOptions small;
  small.max_automaton_states = 24;
  small.max_memoized_masks = 2;
  PropertyCase test_case = property_cases()[0];
  test_case.generations = 60;
  run_property_case(test_case, vocabulary, small);
  test_case = property_cases()[4];  // recursion: deep stacks survive the reset
  test_case.generations = 60;
  run_property_case(test_case, vocabulary, small);
}

INSTANTIATE_TEST_SUITE_P(Schemas, RandomGenerationTest,
                         ::testing::Range<size_t>(0, property_cases().size()));

// ---- Contract details ----

std::unique_ptr<StructuredOutput> make(std::string_view schema, const TestVocabulary& vocabulary,
                                       const StructuredOutputOptions& options = {}) {
  Result<Grammar> grammar = compile_json_schema(schema);
  EXPECT_TRUE(grammar.ok()) << grammar.status();
  Result<std::unique_ptr<engine::TokenConstraint>> constraint =
      make_structured_output(std::make_shared<const Grammar>(std::move(grammar).value()),
                             vocabulary.index, vocabulary.end_tokens, options);
  EXPECT_TRUE(constraint.ok()) << constraint.status();
  return std::unique_ptr<StructuredOutput>(static_cast<StructuredOutput*>(constraint->release()));
}

// The token whose bytes are exactly `bytes`.
int32_t token_of(const VocabularyIndex& vocabulary, std::string_view bytes) {
  for (int32_t t = 0; t < vocabulary.vocab_size(); ++t) {
    if (vocabulary.token_bytes(t) == bytes) return t;
  }
  ADD_FAILURE() << "no token spells " << bytes;
  return -1;
}

TEST(StructuredOutputTest, EndTokensOnlyWhenCompleteAndMustEndWhenNothingCanFollow) {
  const TestVocabulary vocabulary = generated_vocabulary();
  auto constraint = make(R"({"enum": [1, 12]})", vocabulary);
  const int32_t eos = vocabulary.end_tokens[0];
  EXPECT_FALSE(constraint->is_allowed(eos));
  EXPECT_EQ(constraint->accept(eos).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(constraint->accept(token_of(*vocabulary.index, "1")).ok());
  EXPECT_TRUE(constraint->is_allowed(eos));  // "1" is complete, "12" may still come
  EXPECT_FALSE(constraint->must_end());
  ASSERT_TRUE(constraint->accept(token_of(*vocabulary.index, "2")).ok());
  EXPECT_TRUE(constraint->must_end());
  EXPECT_TRUE(constraint->is_allowed(eos));
  ASSERT_TRUE(constraint->accept(eos).ok());
  EXPECT_TRUE(constraint->must_end());
  EXPECT_EQ(constraint->accept(token_of(*vocabulary.index, "1")).code(),
            StatusCode::kInvalidArgument);
}

TEST(StructuredOutputTest, RefusedTokensChangeNothingAndSpecialTokensAreNeverAllowed) {
  const TestVocabulary vocabulary = generated_vocabulary();
  auto constraint = make(R"({"type": "array", "items": {"type": "integer"}})", vocabulary);
  const std::vector<uint64_t> before = constraint->allowed_tokens();
  EXPECT_EQ(constraint->accept(token_of(*vocabulary.index, "a")).code(),
            StatusCode::kInvalidArgument);
  // A lone continuation byte (byte token <0x80>): the message spells it safely.
  const Status lone_byte = constraint->accept(token_of(*vocabulary.index, "\x80"));
  EXPECT_THAT(lone_byte.message(), ::testing::HasSubstr("(\"\\x80\") does not continue"));
  EXPECT_EQ(constraint->accept(1).code(), StatusCode::kInvalidArgument);  // BOS, a control token
  EXPECT_EQ(constraint->accept(0).code(), StatusCode::kInvalidArgument);  // <unk>
  EXPECT_EQ(constraint->accept(vocabulary.index->vocab_size()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(constraint->allowed_tokens(), before);
  EXPECT_FALSE(constraint->is_allowed(0));
  EXPECT_FALSE(constraint->is_allowed(1));
  // Every allowed token is accepted by a copy; every other generable token is refused.
  for (int32_t t = 0; t < vocabulary.index->vocab_size(); t += 7) {
    auto copy = constraint->clone();
    EXPECT_EQ(copy->accept(t).ok(), constraint->is_allowed(t)) << t;
  }
}

TEST(StructuredOutputTest, ClonesAreIndependentAndShortcutMemoizedMasksEqualFullWalks) {
  const TestVocabulary vocabulary = generated_vocabulary();
  const std::vector<std::string> schemas = {
      R"({"type": "object", "properties": {"k": {"type": "string"},
          "n": {"type": "array", "items": {"type": "number"}}}, "required": ["k", "n"],
          "additionalProperties": false})",
      // Bounded strings: the shortcut holds only far enough from maxLength (the longest plain
      // token here has 13 bytes) and past minLength.
      R"({"type": "array", "minItems": 3, "items": {"type": "string", "maxLength": 30}})",
      R"({"type": "object", "properties": {"a": {"type": "string", "maxLength": 14},
          "b": {"type": "string", "minLength": 20}}, "required": ["a", "b"],
          "additionalProperties": false})",
  };
  StructuredOutputOptions full_walks;  // no memo, every mask a walk of the whole trie
  full_walks.memoize_masks = false;
  full_walks.plain_token_shortcut = false;
  std::mt19937_64 rng(7);
  for (const std::string& schema : schemas) {
    SCOPED_TRACE(schema);
    auto memoized = make(schema, vocabulary);
    auto fresh = make(schema, vocabulary, full_walks);
    std::unique_ptr<engine::TokenConstraint> snapshot;
    std::vector<int32_t> drawn;
    for (int step = 0; step < 150 && !memoized->must_end(); ++step) {
      const std::vector<uint64_t> mask = memoized->allowed_tokens();
      ASSERT_EQ(mask, fresh->allowed_tokens()) << "step " << step;
      std::vector<int32_t> allowed;
      std::vector<int32_t> short_allowed;
      for (int32_t t = 0; t < vocabulary.index->vocab_size(); ++t) {
        if (((mask[t / 64] >> (t % 64)) & 1u) == 0 || vocabulary.index->token_bytes(t).empty()) {
          continue;  // end tokens are left out: the walk goes on past complete texts
        }
        allowed.push_back(t);
        if (vocabulary.index->token_bytes(t).size() == 1) short_allowed.push_back(t);
      }
      if (allowed.empty()) break;
      const std::vector<int32_t>& pool =
          (rng() % 2 == 0 && !short_allowed.empty()) ? short_allowed : allowed;
      const int32_t token = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
      if (step == 10) snapshot = memoized->clone();
      if (step >= 10) drawn.push_back(token);
      ASSERT_TRUE(memoized->accept(token).ok());
      ASSERT_TRUE(fresh->accept(token).ok());
    }
    EXPECT_GT(memoized->stats().masks_memoized, 0);
    EXPECT_GT(memoized->stats().plain_shortcuts, 0);
    EXPECT_EQ(fresh->stats().plain_shortcuts, 0);
    // The clone taken at step 10 was not moved by the original; replaying the same tokens
    // brings it to the same mask.
    ASSERT_NE(snapshot, nullptr);
    auto& replay = static_cast<StructuredOutput&>(*snapshot);
    for (int32_t token : drawn) ASSERT_TRUE(replay.accept(token).ok());
    EXPECT_EQ(replay.allowed_tokens(), memoized->allowed_tokens());
  }
}

TEST(StructuredOutputTest, FactoryRefusesBadArguments) {
  const TestVocabulary vocabulary = generated_vocabulary();
  auto grammar = std::make_shared<const Grammar>(json_object_grammar());
  EXPECT_EQ(make_structured_output(nullptr, vocabulary.index, {2}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(make_structured_output(grammar, nullptr, {2}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(make_structured_output(grammar, vocabulary.index, {-1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(make_structured_output(grammar, vocabulary.index, {32000}).status().code(),
            StatusCode::kInvalidArgument);
  // A grammar complete at once that nothing extends: only an end token may come, so without
  // end tokens nothing can be generated at all.
  auto empty = std::make_shared<const Grammar>(literal(""));
  Result<std::unique_ptr<engine::TokenConstraint>> only_end =
      make_structured_output(empty, vocabulary.index, {2});
  ASSERT_TRUE(only_end.ok()) << only_end.status();
  EXPECT_TRUE((*only_end)->must_end());
  EXPECT_EQ(make_structured_output(empty, vocabulary.index, {}).status().code(),
            StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace folio::server
