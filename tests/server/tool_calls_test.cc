// Tool calls in generated text: parsing whole answers of each family (single and parallel calls,
// Hermes' key order, whitespace, malformed calls left as content), the stream splitter against
// the whole-text parse under every split (byte by byte and random pieces over randomized
// answers), the call schema and envelope a grammar is built from, tool_choice, and call ids.
#include "folio/server/tool_calls.h"

#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "folio/server/grammar_matcher.h"

namespace folio::server {
namespace {

ToolDefinition tool(std::string name, std::string schema) {
  ToolDefinition definition;
  definition.name = std::move(name);
  definition.parameters_schema = std::move(schema);
  return definition;
}

const std::vector<ToolDefinition> kTools = {
    tool("get_weather", R"({"type":"object","properties":{"city":{"type":"string"}},)"
                        R"("required":["city"]})"),
    tool("get_time", R"({"type": "object", "properties": {}})")};

void expect_call(const ToolCall& call, std::string_view name, std::string_view arguments) {
  EXPECT_TRUE(call.id.empty());
  EXPECT_EQ(call.name, name);
  EXPECT_EQ(call.arguments, arguments);
}

// --- Whole answers ------------------------------------------------------------------------------

TEST(ToolCallsParseTest, ChatMlSingleCallAsQwenWritesIt) {
  const ParsedToolCalls parsed = parse_tool_calls(
      ChatTemplate::kChatMl,
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n"
      "</tool_call>");
  EXPECT_EQ(parsed.content, "");
  ASSERT_EQ(parsed.calls.size(), 1u);
  expect_call(parsed.calls[0], "get_weather", R"({"city":"Zürich"})");
}

// Text before the calls is content; the newlines around and between calls are not.
TEST(ToolCallsParseTest, ChatMlParallelCallsAfterText) {
  const ParsedToolCalls parsed = parse_tool_calls(
      ChatTemplate::kChatMl,
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n"
      "</tool_call>\n");
  EXPECT_EQ(parsed.content, "Let me check.");
  ASSERT_EQ(parsed.calls.size(), 2u);
  expect_call(parsed.calls[0], "get_weather", R"({"city":"Paris"})");
  expect_call(parsed.calls[1], "get_time", "{}");
}

// Hermes 2 Pro writes "arguments" first; the arguments keep the model's key order; whitespace
// inside the envelope is free; absent arguments are {}; "parameters" is accepted too.
TEST(ToolCallsParseTest, ChatMlIsRobustToKeyOrderAndWhitespace) {
  const ParsedToolCalls parsed = parse_tool_calls(
      ChatTemplate::kChatMl,
      "<tool_call>  {\"arguments\": {\"b\": 1, \"a\": [1, 2]}, \"name\": \"f\"}\t</tool_call>"
      "<tool_call>{\"name\":\"g\"}</tool_call>"
      "<tool_call>\n{\"name\": \"h\", \"parameters\": {\"x\": null}}\n</tool_call>");
  EXPECT_EQ(parsed.content, "");
  ASSERT_EQ(parsed.calls.size(), 3u);
  expect_call(parsed.calls[0], "f", R"({"b":1,"a":[1,2]})");
  expect_call(parsed.calls[1], "g", "{}");
  expect_call(parsed.calls[2], "h", R"({"x":null})");
}

// Malformed calls stay in the content verbatim, with the whitespace around them; good calls
// beside them are still parsed.
TEST(ToolCallsParseTest, ChatMlMalformedCallsStayContent) {
  for (const std::string_view malformed :
       {"<tool_call>\n{\"name\": \"f\", \"arguments\": {}\n</tool_call>",      // unbalanced JSON
        "<tool_call>\n{\"arguments\": {}}\n</tool_call>",                      // no name
        "<tool_call>\n{\"name\": \"\", \"arguments\": {}}\n</tool_call>",      // empty name
        "<tool_call>\n{\"name\": 3, \"arguments\": {}}\n</tool_call>",         // name not a string
        "<tool_call>\n{\"name\": \"f\", \"arguments\": \"x\"}\n</tool_call>",  // not an object
        "<tool_call>\n[\"f\"]\n</tool_call>",                                  // not an object
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}"}) {                // unterminated
    const std::string text = "Hi \n" + std::string(malformed) + " \nbye";
    const ParsedToolCalls parsed = parse_tool_calls(ChatTemplate::kChatMl, text);
    EXPECT_EQ(parsed.content, text) << malformed;
    EXPECT_TRUE(parsed.calls.empty()) << malformed;
  }
  const ParsedToolCalls mixed = parse_tool_calls(
      ChatTemplate::kChatMl,
      "<tool_call>{oops}</tool_call>\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"
      "\n after");
  EXPECT_EQ(mixed.content, "<tool_call>{oops}</tool_call>after");
  ASSERT_EQ(mixed.calls.size(), 1u);
  expect_call(mixed.calls[0], "f", "{}");
}

TEST(ToolCallsParseTest, TextWithoutCallsIsContentExactly) {
  for (ChatTemplate chat_template :
       {ChatTemplate::kChatMl, ChatTemplate::kLlama31, ChatTemplate::kGemma}) {
    for (const std::string_view text : {"", "  ", "Hello <tool world\n\n", "{not a call} ",
                                        "{\"answer\": 42}", " <|python_tag|>print(1)"}) {
      const ParsedToolCalls parsed = parse_tool_calls(chat_template, text);
      EXPECT_EQ(parsed.content, text) << chat_template_name(chat_template) << ": " << text;
      EXPECT_TRUE(parsed.calls.empty());
    }
  }
}

// Llama 3.1 writes the call as its whole answer, "parameters" for the arguments, sometimes after
// <|python_tag|>; an object that is not a call, or a call followed by text, is content.
TEST(ToolCallsParseTest, Llama31CallIsTheWholeAnswer) {
  for (const std::string_view text :
       {"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        " \n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n",
        "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"}) {
    const ParsedToolCalls parsed = parse_tool_calls(ChatTemplate::kLlama31, text);
    EXPECT_EQ(parsed.content, "") << text;
    ASSERT_EQ(parsed.calls.size(), 1u) << text;
    expect_call(parsed.calls[0], "get_weather", R"({"city":"Paris"})");
  }
  const std::string_view trailing = "{\"name\": \"f\", \"parameters\": {}} and then some text";
  const ParsedToolCalls parsed = parse_tool_calls(ChatTemplate::kLlama31, trailing);
  EXPECT_EQ(parsed.content, trailing);
  EXPECT_TRUE(parsed.calls.empty());
  // chatml envelopes mean nothing to Llama.
  EXPECT_TRUE(parse_tool_calls(ChatTemplate::kLlama31,
                               "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>")
                  .calls.empty());
}

// --- Streams ------------------------------------------------------------------------------------

// Feeds `text` in pieces of the given sizes (cycled) and collects what the splitter releases.
ParsedToolCalls split_stream(ChatTemplate chat_template, std::string_view text,
                             const std::vector<size_t>& piece_sizes) {
  ToolCallStreamSplitter splitter(chat_template);
  ParsedToolCalls collected;
  const auto collect = [&](ParsedToolCalls released) {
    collected.content += released.content;
    for (ToolCall& call : released.calls) collected.calls.push_back(std::move(call));
  };
  size_t position = 0;
  for (size_t i = 0; position < text.size(); ++i) {
    const size_t size = std::min(piece_sizes[i % piece_sizes.size()], text.size() - position);
    collect(splitter.push(text.substr(position, size)));
    position += size;
  }
  collect(splitter.finish());
  return collected;
}

void expect_same(const ParsedToolCalls& streamed, const ParsedToolCalls& whole,
                 std::string_view text) {
  EXPECT_EQ(streamed.content, whole.content) << text;
  ASSERT_EQ(streamed.calls.size(), whole.calls.size()) << text;
  for (size_t i = 0; i < whole.calls.size(); ++i) {
    EXPECT_EQ(streamed.calls[i].name, whole.calls[i].name) << text;
    EXPECT_EQ(streamed.calls[i].arguments, whole.calls[i].arguments) << text;
  }
}

const std::vector<std::string_view> kAnswers = {
    "",
    "Plain answer, no calls.\n",
    "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
    "\"Zürich\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n"
    "</tool_call>\n",
    "<tool_call>{bad}</tool_call> \n<tool_call>{\"name\":\"f\"}</tool_call>\n\n tail <tool",
    "a <b <tool_cal <tool_call>{\"name\": \"f\", \"arguments\": {}}",
    "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
    "  <|python_tag|> {\"name\": \"f\", \"parameters\": {}}\n",
    "  <|python_t",
    "{\"answer\": 42}",
    "The answer is {\"name\": \"f\", \"parameters\": {}}",
};

TEST(ToolCallStreamSplitterTest, ByteByByteEqualsTheWholeTextParse) {
  for (ChatTemplate chat_template :
       {ChatTemplate::kChatMl, ChatTemplate::kLlama31, ChatTemplate::kPhi3}) {
    for (const std::string_view text : kAnswers) {
      expect_same(split_stream(chat_template, text, {1}), parse_tool_calls(chat_template, text),
                  text);
      expect_same(split_stream(chat_template, text, {text.size() + 1}),
                  parse_tool_calls(chat_template, text), text);
    }
  }
}

// Answers assembled at random from fragments that make calls, near-calls and text, split at
// random: the stream always agrees with the whole-text parse.
TEST(ToolCallStreamSplitterTest, RandomAnswersAndSplitsAgreeWithTheWholeTextParse) {
  const std::vector<std::string_view> fragments = {
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>",
      "<tool_call>{\"name\": \"g\"}</tool_call>",
      "<tool_call>",
      "</tool_call>",
      "{\"name\": \"f\", \"arguments\": {\"x\": 1}}",
      "{\"name\": \"g\", \"parameters\": {}}",
      "{\"arguments\": {}}",
      "\n",
      " ",
      "{",
      "}",
      "<tool",
      "_call>",
      "</tool",
      "<|python_tag|>",
      "text",
      "é"};
  std::mt19937 random(20261126);
  std::uniform_int_distribution<size_t> pick(0, fragments.size() - 1);
  std::uniform_int_distribution<size_t> length(0, 10);
  std::uniform_int_distribution<size_t> piece(1, 7);
  std::uniform_int_distribution<int> coin(0, 1);
  size_t chatml_answers_with_calls = 0;
  size_t llama_answers_with_calls = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text;
    if (trial % 3 == 0) {
      // Shaped like a Llama answer: optional whitespace and tag, a call, maybe something after.
      if (coin(random) == 1) text += " \n";
      if (coin(random) == 1) text += "<|python_tag|>";
      text += fragments[4 + pick(random) % 3];
      if (coin(random) == 1) text += fragments[pick(random)];
    } else {
      for (size_t n = length(random); n > 0; --n) text += fragments[pick(random)];
    }
    std::vector<size_t> pieces(5);
    for (size_t& size : pieces) size = piece(random);
    const ParsedToolCalls chatml = parse_tool_calls(ChatTemplate::kChatMl, text);
    chatml_answers_with_calls += chatml.calls.empty() ? 0 : 1;
    expect_same(split_stream(ChatTemplate::kChatMl, text, pieces), chatml, text);
    const ParsedToolCalls llama = parse_tool_calls(ChatTemplate::kLlama31, text);
    llama_answers_with_calls += llama.calls.empty() ? 0 : 1;
    expect_same(split_stream(ChatTemplate::kLlama31, text, pieces), llama, text);
  }
  // The fragments do make calls, in both families.
  EXPECT_GT(chatml_answers_with_calls, 500u);
  EXPECT_GT(llama_answers_with_calls, 300u);
}

// Text that may open a call is held back, and released as soon as it cannot.
TEST(ToolCallStreamSplitterTest, HoldsBackOnlyWhatMayOpenACall) {
  ToolCallStreamSplitter chatml(ChatTemplate::kChatMl);
  EXPECT_EQ(chatml.push("Hello <tool").content, "Hello");
  EXPECT_EQ(chatml.push("box").content, " <toolbox");
  EXPECT_EQ(chatml.push("\n").content, "");
  const ParsedToolCalls call =
      chatml.push("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(call.content, "");
  ASSERT_EQ(call.calls.size(), 1u);
  EXPECT_EQ(chatml.push("\nDone").content, "Done");
  EXPECT_EQ(chatml.finish().content, "");

  ToolCallStreamSplitter llama(ChatTemplate::kLlama31);
  EXPECT_EQ(llama.push(" ").content, "");
  EXPECT_EQ(llama.push("It").content, " It");  // not a call: everything flows from here on
  EXPECT_EQ(llama.push(" is {").content, " is {");
  EXPECT_TRUE(llama.finish().content.empty());
}

// --- Envelope, schema, tool_choice ----------------------------------------------------------

TEST(ToolCallPlanTest, EnvelopesOfTheToolCallingFamilies) {
  Result<ToolCallFormat> chatml = tool_call_format(ChatTemplate::kChatMl);
  ASSERT_TRUE(chatml.ok());
  EXPECT_EQ(chatml->call_prefix, "<tool_call>\n");
  EXPECT_EQ(chatml->call_suffix, "\n</tool_call>");
  EXPECT_EQ(chatml->trigger, "<tool_call>");
  EXPECT_EQ(chatml->arguments_key, "arguments");
  EXPECT_TRUE(chatml->multiple_calls);
  Result<ToolCallFormat> llama = tool_call_format(ChatTemplate::kLlama31);
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ(llama->arguments_key, "parameters");
  EXPECT_TRUE(llama->call_is_whole_answer);
  EXPECT_FALSE(llama->multiple_calls);
  EXPECT_FALSE(tool_call_format(ChatTemplate::kLlama3).ok());
  EXPECT_FALSE(tool_call_format(ChatTemplate::kMistralV3).ok());
}

// A call the template renders in the envelope, wrapped back, parses to itself: the envelope
// the grammar is given is the one the parser reads.
TEST(ToolCallPlanTest, AnEnvelopedCallParsesBack) {
  for (ChatTemplate chat_template : {ChatTemplate::kChatMl, ChatTemplate::kLlama31}) {
    Result<ToolCallFormat> format = tool_call_format(chat_template);
    ASSERT_TRUE(format.ok());
    const std::string text = format->call_prefix + "{\"name\": \"f\", \"" + format->arguments_key +
                             "\": {\"a\": 1}}" + format->call_suffix;
    const ParsedToolCalls parsed = parse_tool_calls(chat_template, text);
    EXPECT_EQ(parsed.content, "");
    ASSERT_EQ(parsed.calls.size(), 1u);
    expect_call(parsed.calls[0], "f", R"({"a":1})");
  }
}

TEST(ToolCallPlanTest, SchemaPerChoice) {
  Result<ToolCallPlan> automatic =
      plan_tool_calls(ChatTemplate::kChatMl, kTools, ToolChoice{ToolChoice::Mode::kAuto, ""});
  ASSERT_TRUE(automatic.ok()) << automatic.status().to_string();
  EXPECT_EQ(automatic->constraint, ToolCallConstraint::kAfterTrigger);
  EXPECT_TRUE(automatic->parse_calls);
  EXPECT_EQ(
      automatic->call_schema,
      R"({"anyOf":[{"type":"object","properties":{"name":{"const":"get_weather"},)"
      R"("arguments":{"type":"object","properties":{"city":{"type":"string"}},)"
      R"("required":["city"]}},"required":["name","arguments"],"additionalProperties":false},)"
      R"({"type":"object","properties":{"name":{"const":"get_time"},"arguments":{"type":)"
      R"("object","properties":{}}},"required":["name","arguments"],)"
      R"("additionalProperties":false}]})");

  Result<ToolCallPlan> named = plan_tool_calls(ChatTemplate::kLlama31, kTools,
                                               ToolChoice{ToolChoice::Mode::kFunction, "get_time"});
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->constraint, ToolCallConstraint::kFromStart);
  EXPECT_EQ(named->call_schema,
            R"({"type":"object","properties":{"name":{"const":"get_time"},"parameters":{"type":)"
            R"("object","properties":{}}},"required":["name","parameters"],)"
            R"("additionalProperties":false})");

  Result<ToolCallPlan> required =
      plan_tool_calls(ChatTemplate::kChatMl, kTools, ToolChoice{ToolChoice::Mode::kRequired, ""});
  ASSERT_TRUE(required.ok());
  EXPECT_EQ(required->constraint, ToolCallConstraint::kFromStart);
  EXPECT_EQ(required->call_schema, automatic->call_schema);

  Result<ToolCallPlan> none =
      plan_tool_calls(ChatTemplate::kChatMl, kTools, ToolChoice{ToolChoice::Mode::kNone, ""});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->constraint, ToolCallConstraint::kNone);
  EXPECT_FALSE(none->parse_calls);
  EXPECT_TRUE(none->call_schema.empty());

  EXPECT_FALSE(
      plan_tool_calls(ChatTemplate::kGemma, kTools, ToolChoice{ToolChoice::Mode::kAuto, ""}).ok());
  EXPECT_FALSE(plan_tool_calls(ChatTemplate::kChatMl, kTools,
                               ToolChoice{ToolChoice::Mode::kFunction, "missing"})
                   .ok());
  const std::vector<ToolDefinition> broken = {tool("f", "not json")};
  EXPECT_FALSE(
      plan_tool_calls(ChatTemplate::kChatMl, broken, ToolChoice{ToolChoice::Mode::kAuto, ""}).ok());
}

TEST(ToolCallIdTest, OpenAiShapedAndDistinct) {
  std::set<std::string> ids;
  for (uint64_t seed = 0; seed < 1000; ++seed) {
    const std::string id = make_tool_call_id(seed);
    ASSERT_EQ(id.size(), 5u + 24u);
    EXPECT_TRUE(id.starts_with("call_"));
    for (char c : id.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << id;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 1000u);
  EXPECT_EQ(make_tool_call_id(7), make_tool_call_id(7));
}

// The grammars the server constrains answers with: every call they allow is held to the
// schema, and "auto" leaves text free except that the trigger always opens a call.
bool grammar_matches(const Grammar& grammar, std::string_view text) {
  GrammarMatcher matcher(std::make_shared<const Grammar>(grammar));
  return matcher.matches(text);
}

TEST(ToolCallGrammarTest, RequiredAndAutoHoldEveryCallToItsSchema) {
  const std::string weather =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
  const std::string time = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  const std::string wrong =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"town\": \"Oslo\"}}\n</tool_call>";

  Result<ToolCallPlan> required =
      plan_tool_calls(ChatTemplate::kChatMl, kTools, ToolChoice{ToolChoice::Mode::kRequired, ""});
  ASSERT_TRUE(required.ok()) << required.status();
  Result<Grammar> parallel = tool_call_grammar(*required, /*parallel_tool_calls=*/true);
  ASSERT_TRUE(parallel.ok()) << parallel.status();
  EXPECT_TRUE(grammar_matches(*parallel, weather));
  EXPECT_TRUE(grammar_matches(*parallel, weather + "\n" + time));
  EXPECT_FALSE(grammar_matches(*parallel, wrong));
  EXPECT_FALSE(grammar_matches(*parallel, "text " + weather));
  Result<Grammar> single = tool_call_grammar(*required, /*parallel_tool_calls=*/false);
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_TRUE(grammar_matches(*single, time));
  EXPECT_FALSE(grammar_matches(*single, weather + "\n" + time));

  Result<ToolCallPlan> automatic =
      plan_tool_calls(ChatTemplate::kChatMl, kTools, ToolChoice{ToolChoice::Mode::kAuto, ""});
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  Result<Grammar> chatml = tool_call_grammar(*automatic, true);
  ASSERT_TRUE(chatml.ok()) << chatml.status();
  EXPECT_TRUE(grammar_matches(*chatml, "No call needed."));
  EXPECT_TRUE(grammar_matches(*chatml, "Checking. " + weather + " and " + time + " done"));
  EXPECT_FALSE(grammar_matches(*chatml, "Checking. " + wrong));
  EXPECT_FALSE(grammar_matches(*chatml, "Checking. <tool_call>\n{\"name\": \"other\"}"));

  Result<ToolCallPlan> llama =
      plan_tool_calls(ChatTemplate::kLlama31, kTools, ToolChoice{ToolChoice::Mode::kAuto, ""});
  ASSERT_TRUE(llama.ok()) << llama.status();
  Result<Grammar> whole = tool_call_grammar(*llama, true);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(grammar_matches(*whole, "It is sunny {probably}."));
  EXPECT_TRUE(grammar_matches(*whole, "{\"name\": \"get_time\", \"parameters\": {}}"));
  EXPECT_FALSE(grammar_matches(*whole, "{\"name\": \"get_time\", \"arguments\": {}}"));
  EXPECT_FALSE(grammar_matches(*whole, "{\"name\": \"get_time\", \"parameters\": {}} and more"));

  Result<ToolCallPlan> none =
      plan_tool_calls(ChatTemplate::kChatMl, kTools, ToolChoice{ToolChoice::Mode::kNone, ""});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(tool_call_grammar(*none, true).ok());
}

}  // namespace
}  // namespace folio::server
