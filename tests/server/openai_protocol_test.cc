// The OpenAI protocol layer without sockets: every kind of bad body is a kInvalidArgument naming
// the field, good bodies fill the request, and every formatted answer is JSON of the shape the
// OpenAI clients read.
#include "folio/server/openai_protocol.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace folio::server {
namespace {

using Json = nlohmann::json;

Result<GenerationRequest> parse_completion(std::string_view body) {
  return parse_generation_request(Endpoint::kCompletions, body, ProtocolLimits{});
}
Result<GenerationRequest> parse_chat(std::string_view body) {
  return parse_generation_request(Endpoint::kChatCompletions, body, ProtocolLimits{});
}

void expect_rejected(Endpoint endpoint, std::string_view body, std::string_view mention) {
  Result<GenerationRequest> parsed = parse_generation_request(endpoint, body, ProtocolLimits{});
  ASSERT_FALSE(parsed.ok()) << body;
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << body;
  EXPECT_NE(parsed.status().message().find(mention), std::string_view::npos)
      << body << " -> " << parsed.status().message();
}

TEST(OpenAiProtocolTest, ParsesACompletionWithEverySupportedField) {
  Result<GenerationRequest> parsed = parse_completion(R"({
      "model": "m", "prompt": "Hello", "max_tokens": 7, "temperature": 0, "top_p": 0.5,
      "n": 1, "stream": true, "stream_options": {"include_usage": true}, "stop": ["x", "yz"],
      "seed": 42, "presence_penalty": 0.5, "frequency_penalty": -0.5, "logit_bias": {},
      "logprobs": null, "echo": false, "best_of": 1, "user": "u", "top_k": 5, "min_p": 0.1,
      "repetition_penalty": 1.1, "ignore_eos": true, "priority": -3})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->model, "m");
  EXPECT_EQ(parsed->priority, -3);
  ASSERT_EQ(parsed->prompts.size(), 1u);
  EXPECT_EQ(parsed->prompts[0].text, "Hello");
  EXPECT_EQ(parsed->max_tokens, 7);
  EXPECT_EQ(parsed->sampling.temperature, 0.0f);
  EXPECT_EQ(parsed->sampling.top_p, 0.5f);
  EXPECT_EQ(parsed->sampling.top_k, 5);
  EXPECT_FLOAT_EQ(parsed->sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(parsed->sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(parsed->sampling.presence_penalty, 0.5f);
  EXPECT_EQ(parsed->sampling.frequency_penalty, -0.5f);
  EXPECT_EQ(parsed->sampling.seed, 42u);
  EXPECT_TRUE(parsed->stream);
  EXPECT_TRUE(parsed->include_usage);
  EXPECT_TRUE(parsed->ignore_eos);
  EXPECT_EQ(parsed->stop, (std::vector<std::string>{"x", "yz"}));
}

TEST(OpenAiProtocolTest, DefaultsAndNullsLeaveOpenAiDefaults) {
  Result<GenerationRequest> parsed =
      parse_completion(R"({"model": "m", "prompt": ["one"], "max_tokens": null, "stop": null})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->prompts.size(), 1u);
  EXPECT_EQ(parsed->prompts[0].text, "one");
  EXPECT_FALSE(parsed->max_tokens.has_value());
  EXPECT_EQ(parsed->sampling.temperature, 1.0f);
  EXPECT_FALSE(parsed->stream);
  EXPECT_FALSE(parsed->priority.has_value());  // the server's --default-priority
}

TEST(OpenAiProtocolTest, TokenPromptsAreAccepted) {
  Result<GenerationRequest> parsed = parse_completion(R"({"model": "m", "prompt": [1, 2, 3]})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->prompts.size(), 1u);
  EXPECT_EQ(parsed->prompts[0].tokens, (std::vector<int32_t>{1, 2, 3}));
  parsed = parse_completion(R"({"model": "m", "prompt": [[4, 5]]})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->prompts.size(), 1u);
  EXPECT_EQ(parsed->prompts[0].tokens, (std::vector<int32_t>{4, 5}));
}

TEST(OpenAiProtocolTest, ListsOfPromptsAreAccepted) {
  Result<GenerationRequest> parsed =
      parse_completion(R"({"model": "m", "prompt": ["a", [7, 8], "c"], "n": 2})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->prompts.size(), 3u);
  EXPECT_EQ(parsed->prompts[0].text, "a");
  EXPECT_EQ(parsed->prompts[1].tokens, (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(parsed->prompts[2].text, "c");
  EXPECT_EQ(parsed->n, 2);
  EXPECT_EQ(parsed->best_of, 2);
  expect_rejected(Endpoint::kCompletions, R"({"model": "m", "prompt": ["a", []]})", "prompt[]");
  expect_rejected(Endpoint::kCompletions, R"({"model": "m", "prompt": ["a", 3]})", "prompt[]");
  expect_rejected(Endpoint::kCompletions, R"({"model": "m", "prompt": "a", "priority": 1.5})",
                  "priority");
  expect_rejected(Endpoint::kCompletions, R"({"model": "m", "prompt": "a", "priority": 2000000})",
                  "priority");
  // 3 prompts x 8 choices is above the default limit of 16.
  expect_rejected(Endpoint::kCompletions, R"({"model": "m", "prompt": ["a", "b", "c"], "n": 8})",
                  "limit");
}

TEST(OpenAiProtocolTest, ParsesChatMessagesAndTextParts) {
  Result<GenerationRequest> parsed = parse_chat(R"({"model": "m", "messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": "Hello", "name": "bot"}],
      "max_completion_tokens": 3, "tool_choice": "none", "response_format": {"type": "text"}})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->messages.size(), 3u);
  EXPECT_EQ(parsed->messages[0].role, "system");
  EXPECT_EQ(parsed->messages[1].content, "Hi there");
  EXPECT_EQ(parsed->messages[2].role, "assistant");
  EXPECT_EQ(parsed->max_tokens, 3);
}

TEST(OpenAiProtocolTest, MalformedBodiesAreRejected) {
  expect_rejected(Endpoint::kCompletions, "{\"model\": \"m\", ", "not valid JSON");
  expect_rejected(Endpoint::kCompletions, "", "not valid JSON");
  expect_rejected(Endpoint::kCompletions, "[1, 2]", "JSON object");
  expect_rejected(Endpoint::kCompletions, "\"text\"", "JSON object");
}

TEST(OpenAiProtocolTest, WrongTypesNameTheField) {
  const Endpoint completions = Endpoint::kCompletions;
  expect_rejected(completions, R"({"model": 3, "prompt": "x"})", "model");
  expect_rejected(completions, R"({"model": "m", "prompt": 3})", "prompt");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "max_tokens": "5"})", "max_tokens");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "max_tokens": 2.5})", "max_tokens");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "temperature": "hot"})",
                  "temperature");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "stream": "yes"})", "stream");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "stop": [1]})", "stop");
  expect_rejected(completions, R"({"model": "m", "prompt": [1, "a"]})", "prompt");
  expect_rejected(completions, R"({"model": "m", "prompt": [-1]})", "prompt");
  expect_rejected(Endpoint::kChatCompletions, R"({"model": "m", "messages": {}})", "messages");
  expect_rejected(Endpoint::kChatCompletions, R"({"model": "m", "messages": [{"role": "user",
      "content": 5}]})",
                  "content");
  expect_rejected(Endpoint::kChatCompletions, R"({"model": "m", "messages": [{"role": 1,
      "content": "x"}]})",
                  "role");
}

TEST(OpenAiProtocolTest, OutOfRangeValuesAreRejected) {
  const Endpoint completions = Endpoint::kCompletions;
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "max_tokens": -1})", "max_tokens");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "max_tokens": 0})", "max_tokens");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "max_tokens": 1000000000000})",
                  "max_tokens");
  expect_rejected(completions,
                  R"({"model": "m", "prompt": "x", "max_tokens": 18446744073709551615})",
                  "max_tokens");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "temperature": 2.5})",
                  "temperature");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "top_p": 0})", "top_p");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "presence_penalty": 3})",
                  "presence_penalty");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "stop": ["a","b","c","d","e"]})",
                  "stop");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "stop": ""})", "stop");
  expect_rejected(completions, R"({"model": "m", "prompt": []})", "prompt");
}

TEST(OpenAiProtocolTest, MissingRequiredFieldsAndEmptyMessagesAreRejected) {
  expect_rejected(Endpoint::kCompletions, R"({"prompt": "x"})", "model");
  expect_rejected(Endpoint::kCompletions, R"({"model": "m"})", "prompt");
  expect_rejected(Endpoint::kChatCompletions, R"({"model": "m"})", "messages");
  expect_rejected(Endpoint::kChatCompletions, R"({"model": "m", "messages": []})", "empty");
  expect_rejected(Endpoint::kChatCompletions, R"({"model": "m", "messages": [{"role": "user"}]})",
                  "content");
  expect_rejected(Endpoint::kChatCompletions,
                  R"({"model": "m", "messages": [{"role": "tool", "content": "x"}]})",
                  "tool_call_id");
  expect_rejected(Endpoint::kChatCompletions,
                  R"({"model": "m", "messages": [{"role": "robot", "content": "x"}]})", "role");
}

TEST(OpenAiProtocolTest, UnsupportedAndUnknownFieldsAreRejected) {
  const Endpoint completions = Endpoint::kCompletions;
  const Endpoint chat = Endpoint::kChatCompletions;
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "n": 2, "best_of": 1})", "best_of");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "n": 0})", "'n'");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "n": 17})", "'n'");
  expect_rejected(completions,
                  R"({"model": "m", "prompt": "x", "best_of": 3, "n": 2, "stream": true})",
                  "streamed");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "logprobs": 21})", "logprobs");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "echo": 1})", "echo");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "max_tokens": 0})", "echo");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "logit_bias": {"a": 5}})",
                  "logit_bias");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "logit_bias": {"1": 101}})",
                  "logit_bias");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "logit_bias": {"-1": 1}})",
                  "logit_bias");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "suffix": "end"})", "suffix");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "temprature": 0})", "temprature");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "messages": []})", "messages");
  expect_rejected(completions, R"({"model": "m", "prompt": "x", "stream_options": {}})",
                  "stream_options");
  const std::string messages = R"("messages": [{"role": "user", "content": "x"}])";
  expect_rejected(chat, R"({"model": "m", )" + messages + R"(, "tools": [{"type": "function"}]})",
                  "tools[0].function");
  expect_rejected(chat, R"({"model": "m", )" + messages + R"(, "tools": [{"type": "code"}]})",
                  "tools[0].type");
  expect_rejected(chat,
                  R"({"model": "m", )" + messages +
                      R"(, "tools": [{"type": "function", "function": {"name": "a b"}}]})",
                  "tools[0].function.name");
  expect_rejected(chat,
                  R"({"model": "m", )" + messages +
                      R"(, "tools": [{"type": "function", "function": {"name": "f"}},
                         {"type": "function", "function": {"name": "f"}}]})",
                  "twice");
  expect_rejected(chat, R"({"model": "m", )" + messages + R"(, "tool_choice": "required"})",
                  "tools");
  expect_rejected(chat,
                  R"({"model": "m", )" + messages +
                      R"(, "tools": [{"type": "function", "function": {"name": "f"}}],
                         "tool_choice": {"type": "function", "function": {"name": "g"}}})",
                  "'g'");
  expect_rejected(chat, R"({"model": "m", )" + messages + R"(, "tool_choice": "sometimes"})",
                  "tool_choice");
  expect_rejected(chat, R"({"model": "m", )" + messages + R"(, "top_logprobs": 3})", "logprobs");
  expect_rejected(chat, R"({"model": "m", )" + messages + R"(, "logprobs": 3})", "logprobs");
  expect_rejected(chat,
                  R"({"model": "m", )" + messages + R"(, "logprobs": true, "top_logprobs": 21})",
                  "top_logprobs");
  expect_rejected(chat, R"({"model": "m", )" + messages + R"(, "echo": true})", "echo");
  expect_rejected(chat, R"({"model": "m", )" + messages + R"(, "best_of": 2})", "best_of");
  expect_rejected(chat, R"({"model": "m", )" + messages + R"(, "prompt": "x"})", "prompt");
  expect_rejected(chat,
                  R"({"model": "m", )" + messages + R"(, "response_format": {"type": "xml"}})",
                  "response_format.type");
  expect_rejected(
      chat, R"({"model": "m", )" + messages + R"(, "response_format": {"type": "json_schema"}})",
      "json_schema");
  expect_rejected(chat,
                  R"({"model": "m", )" + messages +
                      R"(, "response_format": {"type": "json_schema",
                         "json_schema": {"schema": {}}}})",
                  "name");
  expect_rejected(chat, R"({"model": "m", "messages": [{"role": "user", "content": "x",
      "tool_calls": []}]})",
                  "tool_calls");
  expect_rejected(chat, R"({"model": "m", "messages": [{"role": "assistant", "tool_calls":
      [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]})",
                  "arguments");
  expect_rejected(chat, R"({"model": "m", "messages": [{"role": "user", "content": [{"type":
      "image_url", "image_url": {"url": "x"}}]}]})",
                  "parts");
}

TEST(OpenAiProtocolTest, ParsesTheFieldsOfLogprobsEchoBiasAndChoices) {
  Result<GenerationRequest> parsed = parse_completion(R"({"model": "m", "prompt": "x",
      "logprobs": 5, "echo": true, "max_tokens": 0, "n": 2, "best_of": 4,
      "logit_bias": {"12": -100, "3": 2.5}})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->logprobs, 5);
  EXPECT_TRUE(parsed->echo);
  EXPECT_EQ(parsed->max_tokens, 0);
  EXPECT_EQ(parsed->n, 2);
  EXPECT_EQ(parsed->best_of, 4);
  EXPECT_EQ(parsed->logit_bias, (std::vector<std::pair<int32_t, float>>{{3, 2.5f}, {12, -100.0f}}));
  parsed = parse_completion(R"({"model": "m", "prompt": "x", "logprobs": 0})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->logprobs, 0);
  const std::string messages = R"("messages": [{"role": "user", "content": "x"}])";
  // Chat: top_logprobs may come before logprobs.
  parsed = parse_chat(R"({"model": "m", "top_logprobs": 3, "logprobs": true, )" + messages + "}");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->logprobs, 3);
  parsed = parse_chat(R"({"model": "m", "logprobs": true, )" + messages + "}");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->logprobs, 0);
  parsed = parse_chat(R"({"model": "m", "logprobs": false, )" + messages + "}");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->logprobs.has_value());
}

TEST(OpenAiProtocolTest, ParsesToolsToolChoiceToolMessagesAndResponseFormats) {
  Result<GenerationRequest> parsed = parse_chat(R"({"model": "m", "messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
      "parallel_tool_calls": false})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->messages.size(), 3u);
  ASSERT_EQ(parsed->messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(parsed->messages[1].tool_calls[0].id, "call_1");
  EXPECT_EQ(parsed->messages[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(parsed->messages[1].tool_calls[0].arguments), (Json{{"city", "Paris"}}));
  EXPECT_EQ(parsed->messages[1].content, "");
  EXPECT_EQ(parsed->messages[2].role, "tool");
  EXPECT_EQ(parsed->messages[2].tool_call_id, "call_1");
  ASSERT_EQ(parsed->tools.size(), 1u);
  EXPECT_EQ(parsed->tools[0].name, "get_weather");
  EXPECT_EQ(parsed->tools[0].description, "d");
  EXPECT_EQ(Json::parse(parsed->tools[0].parameters_schema)["properties"]["city"]["type"],
            "string");
  EXPECT_EQ(parsed->tool_choice.mode, ToolChoice::Mode::kAuto);  // tools given, no choice
  EXPECT_FALSE(parsed->parallel_tool_calls);

  parsed = parse_chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "f"}}})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tool_choice.mode, ToolChoice::Mode::kFunction);
  EXPECT_EQ(parsed->tool_choice.function, "f");
  EXPECT_EQ(parsed->tools[0].parameters_schema, "{}");

  // Schemas keep the client's key order: it is the order the model is shown and writes.
  parsed = parse_chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters":
          {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {}}}}}]})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tools[0].parameters_schema,
            R"({"type":"object","properties":{"zeta":{"type":"string"},"alpha":{}}})");

  parsed = parse_chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "s", "strict": true,
          "schema": {"type": "object"}}}})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->response_format.type, ResponseFormat::Type::kJsonSchema);
  EXPECT_EQ(parsed->response_format.name, "s");
  EXPECT_TRUE(parsed->response_format.strict);
  EXPECT_EQ(Json::parse(parsed->response_format.schema), (Json{{"type", "object"}}));
  EXPECT_EQ(parsed->tool_choice.mode, ToolChoice::Mode::kNone);  // no tools

  parsed = parse_chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_object"}})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->response_format.type, ResponseFormat::Type::kJsonObject);
}

TEST(OpenAiProtocolTest, ResponsesHaveTheOpenAiShape) {
  const ResponseHeader header{"cmpl-1", 1700000000, "m"};
  GenerationResult result;
  result.text = "out";
  result.reason = engine::FinishReason::kLength;
  result.prompt_tokens = 3;
  result.completion_tokens = 4;
  const Json completion = Json::parse(format_response(Endpoint::kCompletions, header, result));
  EXPECT_EQ(completion["object"], "text_completion");
  EXPECT_EQ(completion["choices"][0]["text"], "out");
  EXPECT_EQ(completion["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(completion["usage"]["total_tokens"], 7);
  const Json chat = Json::parse(format_response(Endpoint::kChatCompletions, header, result));
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(chat["choices"][0]["message"]["content"], "out");
  EXPECT_EQ(chat["usage"]["prompt_tokens"], 3);
}

// The JSON of one "data: ...\n\n" event.
Json event_json(const std::string& event);

TEST(OpenAiProtocolTest, ChoicesLogprobsAndToolCallsHaveTheOpenAiShape) {
  const ResponseHeader header{"cmpl-1", 1700000000, "m"};
  ResponseBody body;
  body.prompt_tokens = 2;
  body.completion_tokens = 3;
  ChoiceResult first;
  first.index = 0;
  first.text = "ab";
  first.has_logprobs = true;
  first.logprobs = {TokenLogprob{"a", std::nullopt, {}},
                    TokenLogprob{"b", -0.5, {{"b", -0.5}, {"\xe2", -1.5}}}};
  ChoiceResult second;
  second.index = 1;
  second.reason = engine::FinishReason::kLength;
  body.choices = {first, second};
  const Json completion = Json::parse(format_response(Endpoint::kCompletions, header, body));
  ASSERT_EQ(completion["choices"].size(), 2u);
  EXPECT_EQ(completion["choices"][1]["index"], 1);
  EXPECT_EQ(completion["choices"][1]["finish_reason"], "length");
  EXPECT_TRUE(completion["choices"][1]["logprobs"].is_null());
  const Json& logprobs = completion["choices"][0]["logprobs"];
  EXPECT_EQ(logprobs["tokens"], (Json{"a", "b"}));
  EXPECT_TRUE(logprobs["token_logprobs"][0].is_null());
  EXPECT_EQ(logprobs["token_logprobs"][1], -0.5);
  EXPECT_TRUE(logprobs["top_logprobs"][0].is_null());
  EXPECT_EQ(logprobs["top_logprobs"][1]["b"], -0.5);
  EXPECT_EQ(logprobs["top_logprobs"][1]["\xEF\xBF\xBD"], -1.5);  // a partial character
  EXPECT_EQ(logprobs["text_offset"], (Json{0, 1}));
  EXPECT_EQ(completion["usage"]["total_tokens"], 5);

  body.choices[0].logprobs[0].logprob = -2.0;
  body.choices[0].tool_calls = {ToolCall{"call_1", "f", R"({"x": 1})"}};
  body.choices[0].text.clear();
  const Json chat = Json::parse(format_response(Endpoint::kChatCompletions, header, body));
  const Json& choice = chat["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  EXPECT_EQ(choice["message"]["tool_calls"][0],
            (Json{{"id", "call_1"},
                  {"type", "function"},
                  {"function", {{"name", "f"}, {"arguments", R"({"x": 1})"}}}}));
  const Json& content = choice["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[1]["token"], "b");
  EXPECT_EQ(content[1]["bytes"], (Json{98}));
  EXPECT_EQ(content[1]["top_logprobs"][1]["bytes"], (Json{0xe2}));
  EXPECT_EQ(content[1]["top_logprobs"][1]["logprob"], -1.5);
}

TEST(OpenAiProtocolTest, StreamedChoicesCarryTheirIndexLogprobsAndToolCalls) {
  const ResponseHeader header{"chatcmpl-1", 1700000000, "m"};
  const std::vector<TokenLogprob> tokens = {TokenLogprob{"x", -0.25, {}}};
  const std::vector<ToolCall> calls = {ToolCall{"call_9", "f", "{}"}};
  ChoiceDelta delta;
  delta.index = 2;
  delta.has_logprobs = true;
  delta.logprobs = tokens;
  delta.tool_calls = calls;
  delta.first_tool_call = 1;
  const Json chunk = event_json(format_chunk(Endpoint::kChatCompletions, header, delta));
  const Json& choice = chunk["choices"][0];
  EXPECT_EQ(choice["index"], 2);
  EXPECT_TRUE(choice["delta"]["content"].is_null());
  EXPECT_EQ(choice["delta"]["tool_calls"][0]["index"], 1);
  EXPECT_EQ(choice["delta"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(choice["logprobs"]["content"][0]["logprob"], -0.25);
  const Json text = event_json(format_chunk(Endpoint::kCompletions, header, delta));
  EXPECT_EQ(text["choices"][0]["logprobs"]["tokens"], (Json{"x"}));
  const Json finish = event_json(format_finish_chunk(Endpoint::kChatCompletions, header, 2,
                                                     engine::FinishReason::kStop, true));
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(finish["choices"][0]["index"], 2);
}

TEST(OpenAiProtocolTest, TokenizeAndDetokenizeBodies) {
  Result<TokenizeRequest> tokenize =
      parse_tokenize_request(R"({"prompt": "hi", "add_special_tokens": false})", {});
  ASSERT_TRUE(tokenize.ok()) << tokenize.status();
  EXPECT_EQ(tokenize->prompt, "hi");
  EXPECT_FALSE(tokenize->add_special_tokens);
  tokenize = parse_tokenize_request(
      R"({"model": "m", "messages": [{"role": "user", "content": "x"}]})", {});
  ASSERT_TRUE(tokenize.ok()) << tokenize.status();
  EXPECT_EQ(tokenize->model, "m");
  ASSERT_EQ(tokenize->messages.size(), 1u);
  for (const char* bad : {R"({})", R"({"prompt": 1})", R"({"prompt": "a", "messages": []})",
                          R"({"prompt": "a", "extra": 1})"}) {
    EXPECT_EQ(parse_tokenize_request(bad, {}).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(Json::parse(format_tokenize_response(std::vector<int32_t>{1, 2}, 64)),
            (Json{{"count", 2}, {"max_model_len", 64}, {"tokens", {1, 2}}}));
  Result<DetokenizeRequest> detokenize = parse_detokenize_request(R"({"tokens": [5, 6]})", {});
  ASSERT_TRUE(detokenize.ok()) << detokenize.status();
  EXPECT_EQ(detokenize->tokens, (std::vector<int32_t>{5, 6}));
  for (const char* bad : {R"({})", R"({"tokens": [-1]})", R"({"tokens": "1"})"}) {
    EXPECT_EQ(parse_detokenize_request(bad, {}).status().code(), StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_EQ(Json::parse(format_detokenize_response("hey")), (Json{{"prompt", "hey"}}));
}

Json event_json(const std::string& event) {
  EXPECT_EQ(event.rfind("data: ", 0), 0u);
  EXPECT_EQ(event.substr(event.size() - 2), "\n\n");
  return Json::parse(event.substr(6, event.size() - 8));
}

TEST(OpenAiProtocolTest, ChunksHaveTheOpenAiShape) {
  const ResponseHeader header{"chatcmpl-1", 1700000000, "m"};
  const Json first =
      event_json(format_text_chunk(Endpoint::kChatCompletions, header, "", /*first=*/true));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  const Json text =
      event_json(format_text_chunk(Endpoint::kChatCompletions, header, "ab", /*first=*/false));
  EXPECT_EQ(text["choices"][0]["delta"]["content"], "ab");
  EXPECT_FALSE(text["choices"][0]["delta"].contains("role"));
  const Json finish = event_json(
      format_finish_chunk(Endpoint::kChatCompletions, header, engine::FinishReason::kStop));
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(finish["choices"][0]["delta"].empty());
  GenerationResult result;
  result.prompt_tokens = 2;
  result.completion_tokens = 5;
  const Json usage = event_json(format_usage_chunk(Endpoint::kCompletions, header, result));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 5);
}

TEST(OpenAiProtocolTest, ErrorBodiesAndInvalidBytesNeverThrow) {
  const Json error = Json::parse(format_error_body("bad \xff input", kInvalidRequestError));
  EXPECT_EQ(error["error"]["type"], "invalid_request_error");
  EXPECT_EQ(error["error"]["message"], "bad \xEF\xBF\xBD input");
  EXPECT_TRUE(error["error"]["code"].is_null());
}

TEST(OpenAiProtocolTest, ModelListShowsAdaptersWithTheirParent) {
  const Json models = Json::parse(format_model_list(
      {ModelEntry{"base", "base", std::nullopt}, ModelEntry{"sql", "base", "base"}}, 7));
  EXPECT_EQ(models["object"], "list");
  ASSERT_EQ(models["data"].size(), 2u);
  EXPECT_EQ(models["data"][0]["id"], "base");
  EXPECT_EQ(models["data"][0]["object"], "model");
  EXPECT_EQ(models["data"][0]["created"], 7);
  EXPECT_TRUE(models["data"][0]["parent"].is_null());
  EXPECT_EQ(models["data"][1]["id"], "sql");
  EXPECT_EQ(models["data"][1]["parent"], "base");
  EXPECT_EQ(models["data"][1]["root"], "base");
  const Json deleted = Json::parse(format_deleted_model("sql"));
  EXPECT_EQ(deleted, (Json{{"id", "sql"}, {"object", "model"}, {"deleted", true}}));
}

TEST(OpenAiProtocolTest, AdapterRouteBodiesAreValidated) {
  Result<LoadAdapterRequest> load =
      parse_load_adapter_request(R"({"lora_name": "sql", "lora_path": "/a/sql.gguf"})");
  ASSERT_TRUE(load.ok()) << load.status();
  EXPECT_EQ(load->name, "sql");
  EXPECT_EQ(load->path, "/a/sql.gguf");
  EXPECT_EQ(load->scale, 1.0f);
  load = parse_load_adapter_request(R"({"lora_name": "s", "lora_path": "p", "scale": 0.5})");
  ASSERT_TRUE(load.ok()) << load.status();
  EXPECT_EQ(load->scale, 0.5f);
  for (const char* body :
       {"{", "[]", R"({"lora_path": "p"})", R"({"lora_name": "s"})",
        R"({"lora_name": "", "lora_path": "p"})", R"({"lora_name": 3, "lora_path": "p"})",
        R"({"lora_name": "s", "lora_path": "p", "scale": "big"})",
        R"({"lora_name": "s", "lora_path": "p", "scale": 1e300})",
        R"({"lora_name": "s", "lora_path": "p", "inplace": true})"}) {
    SCOPED_TRACE(body);
    EXPECT_EQ(parse_load_adapter_request(body).status().code(), StatusCode::kInvalidArgument);
  }
  Result<std::string> unload = parse_unload_adapter_request(R"({"lora_name": "sql"})");
  ASSERT_TRUE(unload.ok()) << unload.status();
  EXPECT_EQ(*unload, "sql");
  // vLLM's clients may send the integer id they know the adapter by.
  EXPECT_EQ(parse_unload_adapter_request(R"({"lora_name": "sql", "lora_int_id": 4})").value(),
            "sql");
  for (const char* body : {"{}", R"({"lora_name": 1})", R"({"lora_name": "s", "x": 1})"}) {
    SCOPED_TRACE(body);
    EXPECT_EQ(parse_unload_adapter_request(body).status().code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace folio::server
