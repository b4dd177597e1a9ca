// Chat templates: each family renders a multi-turn conversation with a system prompt exactly as
// the model's own Jinja template renders it (worked out by hand from those templates, with
// add_generation_prompt set and bos_token rendered as nothing, since Folio's tokenizer adds BOS
// as a token id), and each family is recognised from a template source written for this test
// with the family's markers (and, when ../shared/data is present, from the Phi-3 vocabulary's
// real tokenizer.chat_template). The tool-calling families also render tools, calls and tool
// results as Qwen 2.5/3's and Llama 3.1/3.3's templates do, JSON written as transformers' tojson
// filter (Python's json.dumps, ensure_ascii=False) writes it; the expected prompts were worked
// out by hand from the templates' text.
#include "folio/server/chat_template.h"

#include <cstdlib>
#include <filesystem>
#include <vector>

#include <gtest/gtest.h>

#include "folio/gguf/gguf_file.h"
#include "folio/server/jinja_json.h"

namespace folio::server {
namespace {

// System, user, assistant, user. The answer comes back with a leading space and a trailing
// newline, as generated answers often do, so the templates that trim it show it.
const std::vector<ChatMessage> kConversation = {
    {"system", "S"}, {"user", "U1"}, {"assistant", " A1\n"}, {"user", "U2"}};

// Qwen 2.5's template (Qwen2.5-7B-Instruct, tokenizer_config.json), no tools: a first system
// message is rendered as its own turn (a default one is added only when there is none), every
// other message as "<|im_start|>role\ncontent<|im_end|>\n", untrimmed.
TEST(ChatTemplateTest, ChatMlRendersAsQwenTemplate) {
  EXPECT_EQ(render_chat(ChatTemplate::kChatMl, kConversation),
            "<|im_start|>system\nS<|im_end|>\n"
            "<|im_start|>user\nU1<|im_end|>\n"
            "<|im_start|>assistant\n A1\n<|im_end|>\n"
            "<|im_start|>user\nU2<|im_end|>\n"
            "<|im_start|>assistant\n");
}

// Llama-3.1-8B-Instruct's (and 3.3's) template without tools: the system header is always
// there, with the knowledge-cutoff and date lines (date_string's default) before the trimmed
// system prompt; the rest as Llama 3.
TEST(ChatTemplateTest, Llama31OpensWithTheDateLinesInTheSystemHeader) {
  EXPECT_EQ(render_chat(ChatTemplate::kLlama31, kConversation),
            "<|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nU1<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nA1<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nU2<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  const std::vector<ChatMessage> no_system = {{"user", "U1"}};
  EXPECT_EQ(render_chat(ChatTemplate::kLlama31, no_system),
            "<|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nU1<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// Meta-Llama-3-8B-Instruct's template: header, blank line, content | trim, <|eot_id|>; the
// assistant header opens the answer.
TEST(ChatTemplateTest, Llama3RendersAsItsTemplateTrimmingContents) {
  EXPECT_EQ(render_chat(ChatTemplate::kLlama3, kConversation),
            "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nU1<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nA1<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nU2<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// Llama-2-7b-chat-hf's template: the system prompt wrapped in <<SYS>> opens the first user
// message; user turns are bos_token + "[INST] " + content.strip() + " [/INST]", answers
// " " + content.strip() + " " + eos_token.
TEST(ChatTemplateTest, Llama2RendersAsItsTemplate) {
  EXPECT_EQ(render_chat(ChatTemplate::kLlama2, kConversation),
            "[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST]");
}

// Mistral-7B-Instruct-v0.2's template (Mistral's "v1" tokenizer): the system message opens the
// first user turn as ' [INST] ' + system + '\n\n' + content + ' [/INST]'; answers are
// ' ' + content + eos_token, untrimmed.
TEST(ChatTemplateTest, MistralV1PutsTheSystemPromptInTheFirstTurn) {
  EXPECT_EQ(render_chat(ChatTemplate::kMistralV1, kConversation),
            " [INST] S\n\nU1 [/INST]  A1\n</s> [INST] U2 [/INST]");
}

// Mistral-7B-Instruct-v0.3's template (Mistral's "v3" tokenizer), no tools: '[INST] ' + content
// + '[/INST]', the system message placed in the last user turn (loop.last), answers
// ' ' + content | trim + eos_token.
TEST(ChatTemplateTest, MistralV3PutsTheSystemPromptInTheLastTurn) {
  EXPECT_EQ(render_chat(ChatTemplate::kMistralV3, kConversation),
            "[INST] U1[/INST] A1</s>[INST] S\n\nU2[/INST]");
  // With no user turn last (the template's loop.last is then not a user turn), no system.
  const std::vector<ChatMessage> ends_with_answer = {
      {"system", "S"}, {"user", "U1"}, {"assistant", "A1"}};
  EXPECT_EQ(render_chat(ChatTemplate::kMistralV3, ends_with_answer), "[INST] U1[/INST] A1</s>");
}

// Phi-3.5-mini-instruct's template: '<|' role '|>\n' + content + '<|end|>\n' for system (when
// not empty), user and assistant, then '<|assistant|>\n'. (The first Phi-3-mini template, the
// one in ggml-vocab-phi-3.gguf, drops system messages and puts '<|assistant|>\n' after every user
// turn; for conversations without a system message both render the same.)
TEST(ChatTemplateTest, Phi3RendersSystemUserAndAssistantTurns) {
  EXPECT_EQ(render_chat(ChatTemplate::kPhi3, kConversation),
            "<|system|>\nS<|end|>\n<|user|>\nU1<|end|>\n<|assistant|>\n A1\n<|end|>\n"
            "<|user|>\nU2<|end|>\n<|assistant|>\n");
  const std::vector<ChatMessage> empty_system = {{"system", ""}, {"user", "U1"}};
  EXPECT_EQ(render_chat(ChatTemplate::kPhi3, empty_system), "<|user|>\nU1<|end|>\n<|assistant|>\n");
}

// Gemma 3's template (gemma-3-4b-it): no system role, so a first system message's content and
// '\n\n' open the first user turn; 'assistant' is 'model'; contents | trim. (Gemma 1 and 2
// templates refuse a system message; llama.cpp merges it the same way.)
TEST(ChatTemplateTest, GemmaPrependsTheSystemPromptToTheFirstUserTurn) {
  EXPECT_EQ(render_chat(ChatTemplate::kGemma, kConversation),
            "<start_of_turn>user\nS\n\nU1<end_of_turn>\n"
            "<start_of_turn>model\nA1<end_of_turn>\n"
            "<start_of_turn>user\nU2<end_of_turn>\n"
            "<start_of_turn>model\n");
}

// HuggingFaceH4/zephyr-7b-beta's template as transformers renders it (trim_blocks): '<|' role
// '|>\n' + content + eos_token and a newline per message, untrimmed.
TEST(ChatTemplateTest, ZephyrRendersAsItsTemplate) {
  EXPECT_EQ(render_chat(ChatTemplate::kZephyr, kConversation),
            "<|system|>\nS</s>\n<|user|>\nU1</s>\n<|assistant|>\n A1\n</s>\n<|user|>\nU2</s>\n"
            "<|assistant|>\n");
}

// Template sources written for this test, each with the markers of its family as the models'
// templates spell them.
TEST(ChatTemplateTest, DetectsEachFamilyByItsMarkers) {
  EXPECT_EQ(detect_chat_template(
                "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
                "message.content + '<|im_end|>' + '\\n' }}{%- endfor %}"),
            ChatTemplate::kChatMl);
  EXPECT_EQ(detect_chat_template("{% set content = '<|start_header_id|>' + message['role'] + "
                                 "'<|end_header_id|>\\n\\n' + message['content'] | trim + "
                                 "'<|eot_id|>' %}"),
            ChatTemplate::kLlama3);
  EXPECT_EQ(detect_chat_template("{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}"
                                 "{{- \"Cutting Knowledge Date: December 2023\\n\" }}"),
            ChatTemplate::kLlama31);
  EXPECT_EQ(detect_chat_template("{% if loop.index0 == 0 %}{% set content = '<<SYS>>\\n' + "
                                 "system_message + '\\n<</SYS>>\\n\\n' + content %}{% endif %}"
                                 "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"),
            ChatTemplate::kLlama2);
  EXPECT_EQ(detect_chat_template("{%- if loop.first and system_message is defined %}"
                                 "{{- ' [INST] ' + system_message + '\\n\\n' + message['content'] "
                                 "+ ' [/INST]' }}{%- else %}{{- ' [INST] ' + message['content'] + "
                                 "' [/INST]' }}{%- endif %}"),
            ChatTemplate::kMistralV1);
  EXPECT_EQ(detect_chat_template("{%- if tools is not none %}{{- \"[AVAILABLE_TOOLS] [\" }}"
                                 "{%- endif %}{%- if loop.last and system_message is defined %}"
                                 "{{- \"[INST] \" + system_message + \"\\n\\n\" + "
                                 "message[\"content\"] + \"[/INST]\" }}{%- endif %}"),
            ChatTemplate::kMistralV3);
  EXPECT_EQ(detect_chat_template("{% elif message['role'] == 'user' %}{{'<|user|>\\n' + "
                                 "message['content'] + '<|end|>\\n'}}{% endif %}{% if "
                                 "add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"),
            ChatTemplate::kPhi3);
  EXPECT_EQ(detect_chat_template("{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if "
                                 "loop.first else '') }}{{ message['content'] | trim }}"),
            ChatTemplate::kGemma);
  EXPECT_EQ(detect_chat_template("{% if message['role'] == 'user' %}{{ '<|user|>\\n' + "
                                 "message['content'] + eos_token }}{% endif %}{{ '<|assistant|>' "
                                 "}}"),
            ChatTemplate::kZephyr);
  EXPECT_EQ(detect_chat_template("{{ messages | custom }}"), std::nullopt);
  EXPECT_EQ(detect_chat_template(""), std::nullopt);
}

// The Phi-3 vocabulary from llama.cpp's models/ folder carries the first Phi-3-mini template.
TEST(ChatTemplateTest, DetectsPhi3FromTheRealVocabularyFile) {
  const char* override_directory = std::getenv("FOLIO_SHARED_DATA_DIR");
  const std::string path =
      std::string(override_directory != nullptr ? override_directory : FOLIO_SHARED_DATA_DIR) +
      "/ggml-vocab-phi-3.gguf";
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << path << " is absent (../shared/data is not beside this checkout; set "
                 << "FOLIO_SHARED_DATA_DIR to its location)";
  }
  Result<gguf::GgufFile> file = gguf::GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  Result<std::string_view> source = file->get_string("tokenizer.chat_template");
  ASSERT_TRUE(source.ok()) << source.status().to_string();
  EXPECT_EQ(detect_chat_template(*source), ChatTemplate::kPhi3);
}

TEST(ChatTemplateTest, NamesRoundTrip) {
  for (ChatTemplate chat_template :
       {ChatTemplate::kChatMl, ChatTemplate::kLlama3, ChatTemplate::kLlama31, ChatTemplate::kLlama2,
        ChatTemplate::kMistralV1, ChatTemplate::kMistralV3, ChatTemplate::kZephyr,
        ChatTemplate::kPhi3, ChatTemplate::kGemma}) {
    Result<ChatTemplate> read = chat_template_from_name(chat_template_name(chat_template));
    ASSERT_TRUE(read.ok()) << read.status().to_string();
    EXPECT_EQ(*read, chat_template);
  }
  const Result<ChatTemplate> unknown = chat_template_from_name("jinja");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("mistral-v3"), std::string::npos);
}

// --- Tools -------------------------------------------------------------------------------------

// Keys deliberately out of alphabetical order ("type" before "properties"), a non-ASCII
// character and escaped quotes, and a float: the prompt must keep the client's order and print
// them as json.dumps does.
ToolDefinition weather_tool() {
  ToolDefinition tool;
  tool.name = "get_weather";
  tool.description = "Weather in a city";
  tool.parameters_schema =
      R"({"type":"object","properties":{"city":{"type":"string","description":"Name, e.g. )"
      R"(\"Zürich\""},"days":{"type":"integer","minimum":1.0}},"required":["city"]})";
  return tool;
}

// No description (left out of the prompt) and an empty properties object.
ToolDefinition time_tool() {
  ToolDefinition tool;
  tool.name = "get_time";
  tool.parameters_schema = R"({"type": "object", "properties": {}})";
  return tool;
}

ChatMessage assistant_calling(std::string content, std::vector<ToolCall> calls) {
  ChatMessage message("assistant", std::move(content));
  message.tool_calls = std::move(calls);
  return message;
}

ChatMessage tool_result(std::string call_id, std::string content) {
  ChatMessage message("tool", std::move(content));
  message.tool_call_id = std::move(call_id);
  return message;
}

const std::vector<ToolDefinition> kTools = {weather_tool(), time_tool()};

constexpr std::string_view kQwenToolsBlock =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    R"({"type": "function", "function": {"name": "get_weather", "description": "Weather in a )"
    R"(city", "parameters": {"type": "object", "properties": {"city": {"type": "string", )"
    R"("description": "Name, e.g. \"Zürich\""}, "days": {"type": "integer", "minimum": 1.0}}, )"
    R"("required": ["city"]}}})"
    "\n"
    R"({"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", )"
    R"("properties": {}}}})"
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";

// Qwen 2.5's template (and Qwen 3's, which renders this conversation the same): the system
// prompt, a blank line and the tools block make the system turn; two parallel calls, each
// "\n<tool_call>\n{...}\n</tool_call>" with the arguments through tojson; the two results in one
// user turn of <tool_response> blocks.
TEST(ChatTemplateToolsTest, ChatMlRendersToolsCallsAndResultsAsQwen) {
  const std::vector<ChatMessage> messages = {
      {"system", "S"},
      {"user", "Weather in Zürich?"},
      assistant_calling(
          "",
          {{.id = "call_1", .name = "get_weather", .arguments = R"({"city":"Zürich","days":2})"},
           {.id = "call_2", .name = "get_time", .arguments = "{}"}}),
      tool_result("call_1", R"({"temp": 21})"),
      tool_result("call_2", "12:00"),
      {"assistant", "It is 21 degrees."},
      {"user", "Thanks"}};
  Result<std::string> prompt = render_chat_with_tools(ChatTemplate::kChatMl, messages, kTools);
  ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
  EXPECT_EQ(*prompt, "<|im_start|>system\nS\n\n" + std::string(kQwenToolsBlock) +
                         "<|im_start|>user\nWeather in Zürich?<|im_end|>\n"
                         "<|im_start|>assistant\n<tool_call>\n"
                         R"({"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}})"
                         "\n</tool_call>\n<tool_call>\n"
                         R"({"name": "get_time", "arguments": {}})"
                         "\n</tool_call><|im_end|>\n"
                         "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n"
                         "<tool_response>\n12:00\n</tool_response><|im_end|>\n"
                         "<|im_start|>assistant\nIt is 21 degrees.<|im_end|>\n"
                         "<|im_start|>user\nThanks<|im_end|>\n"
                         "<|im_start|>assistant\n");
}

// Without a system message the tools block alone makes the system turn (Qwen 3; Qwen 2.5 would
// put its default system prompt first, which Folio never adds). Content before a call is
// followed by a newline; arguments that are not JSON are inserted as they are (Qwen 3's string
// branch).
TEST(ChatTemplateToolsTest, ChatMlWithoutSystemPromptAndWithContentBeforeACall) {
  const std::vector<ChatMessage> messages = {
      {"user", "Time?"},
      assistant_calling("Let me check.",
                        {{.id = "call_1", .name = "get_time", .arguments = "not json"}}),
      tool_result("call_1", "12:00")};
  Result<std::string> prompt = render_chat_with_tools(ChatTemplate::kChatMl, messages, kTools);
  ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
  EXPECT_EQ(*prompt, "<|im_start|>system\n" + std::string(kQwenToolsBlock) +
                         "<|im_start|>user\nTime?<|im_end|>\n"
                         "<|im_start|>assistant\nLet me check.\n<tool_call>\n"
                         R"({"name": "get_time", "arguments": not json})"
                         "\n</tool_call><|im_end|>\n"
                         "<|im_start|>user\n<tool_response>\n12:00\n</tool_response><|im_end|>\n"
                         "<|im_start|>assistant\n");
  // Without tools, a tool conversation renders the same turns, and render_chat agrees.
  Result<std::string> without_tools = render_chat_with_tools(ChatTemplate::kChatMl, messages, {});
  ASSERT_TRUE(without_tools.ok());
  EXPECT_EQ(*without_tools, render_chat(ChatTemplate::kChatMl, messages));
  EXPECT_TRUE(without_tools->starts_with("<|im_start|>user\nTime?"));
}

// Llama-3.1-8B-Instruct's (and 3.3's) template with tools_in_user_message left at its default:
// "Environment: ipython" opens the system header; the tools, each tojson(indent=4) followed by
// a blank line, open the first user message (trimmed); the call is the whole assistant turn with
// "parameters"; the result is an ipython turn holding tojson(content), a JSON string.
TEST(ChatTemplateToolsTest, Llama31RendersToolsInTheFirstUserMessage) {
  const std::vector<ChatMessage> messages = {
      {"system", " S \n"},
      {"user", " Weather in Zürich? "},
      assistant_calling(
          "ignored",
          {{.id = "call_1", .name = "get_weather", .arguments = R"({"city":"Zürich","days":2})"}}),
      tool_result("call_1", R"({"temp": 21})"),
      {"assistant", "It is 21."},
      {"user", "Thanks"}};
  Result<std::string> prompt = render_chat_with_tools(ChatTemplate::kLlama31, messages, kTools);
  ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
  EXPECT_EQ(*prompt,
            "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n"
            "Given the following functions, please respond with a JSON for a function call with "
            "its proper arguments that best answers the given prompt.\n\n"
            "Respond in the format {\"name\": function name, \"parameters\": dictionary of "
            "argument name and its value}.Do not use variables.\n\n"
            "{\n"
            "    \"type\": \"function\",\n"
            "    \"function\": {\n"
            "        \"name\": \"get_weather\",\n"
            "        \"description\": \"Weather in a city\",\n"
            "        \"parameters\": {\n"
            "            \"type\": \"object\",\n"
            "            \"properties\": {\n"
            "                \"city\": {\n"
            "                    \"type\": \"string\",\n"
            "                    \"description\": \"Name, e.g. \\\"Zürich\\\"\"\n"
            "                },\n"
            "                \"days\": {\n"
            "                    \"type\": \"integer\",\n"
            "                    \"minimum\": 1.0\n"
            "                }\n"
            "            },\n"
            "            \"required\": [\n"
            "                \"city\"\n"
            "            ]\n"
            "        }\n"
            "    }\n"
            "}\n\n"
            "{\n"
            "    \"type\": \"function\",\n"
            "    \"function\": {\n"
            "        \"name\": \"get_time\",\n"
            "        \"parameters\": {\n"
            "            \"type\": \"object\",\n"
            "            \"properties\": {}\n"
            "        }\n"
            "    }\n"
            "}\n\n"
            "Weather in Zürich?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
            R"({"name": "get_weather", "parameters": {"city": "Zürich", "days": 2}})"
            "<|eot_id|>"
            "<|start_header_id|>ipython<|end_header_id|>\n\n"
            R"("{\"temp\": 21}")"
            "<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nIt is 21.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nThanks<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// json.dumps(ensure_ascii=False): quotes, backslashes and control characters escaped (\n, \t
// by name, others as lowercase \u00XX), non-ASCII and '/' kept; floats as Python's repr prints
// them (positional up to 16 digits before the point, where C++ libraries switch at 15).
TEST(ChatTemplateToolsTest, ToolJsonIsWrittenAsPythonJsonDumps) {
  ToolDefinition tool;
  tool.name = "f";
  tool.description = "a\"b\\c\nd\te\x01\x7f/ü";
  tool.parameters_schema =
      R"({"type":"object","properties":{"x":{"enum":[1,2.5,-0.0,1e20,1E-5,1e15,1e16,0.0001,)"
      R"(123456789.125,true,null,"é"]}}})";
  const std::vector<ChatMessage> messages = {{"user", "U"}};
  Result<std::string> prompt =
      render_chat_with_tools(ChatTemplate::kChatMl, messages, std::span(&tool, 1));
  ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
  const std::string expected_tool =
      "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": "
      "\"a\\\"b\\\\c\\nd\\te\\u0001\x7f/ü\", \"parameters\": {\"type\": \"object\", "
      "\"properties\": {\"x\": {\"enum\": [1, 2.5, -0.0, 1e+20, 1e-05, 1000000000000000.0, "
      "1e+16, 0.0001, 123456789.125, true, null, \"é\"]}}}}}";
  EXPECT_NE(prompt->find("<tools>\n" + expected_tool + "\n</tools>"), std::string::npos) << *prompt;
}

// The expected texts are what Python 3.11's json.dumps(value, ensure_ascii=False[, indent=2])
// prints for the same value: key order kept, empty containers, floats at the edges of
// positional form and of the double range, every escape.
TEST(JinjaJsonTest, PrintsAsPythonJsonDumps) {
  const nlohmann::ordered_json value = nlohmann::ordered_json::parse(
      R"({"b":[1,2.5,1e15,1e16,0.0001,1e-05,-0.0,123456789.125,5e-324,1.7976931348623157e308],)"
      R"("a":{},"c":[],"d":{"x":[{}]},"s":"\u0000\u001f)"
      "\x7f"
      R"(\"\\\/é\t"})");
  EXPECT_EQ(jinja_tojson(value),
            R"({"b": [1, 2.5, 1000000000000000.0, 1e+16, 0.0001, 1e-05, -0.0, 123456789.125, )"
            R"(5e-324, 1.7976931348623157e+308], "a": {}, "c": [], "d": {"x": [{}]}, "s": )"
            R"("\u0000\u001f)"
            "\x7f"
            R"(\"\\/é\t"})");
  EXPECT_EQ(jinja_tojson(value, 2),
            "{\n  \"b\": [\n    1,\n    2.5,\n    1000000000000000.0,\n    1e+16,\n    0.0001,\n"
            "    1e-05,\n    -0.0,\n    123456789.125,\n    5e-324,\n    1.7976931348623157e+308\n"
            "  ],\n  \"a\": {},\n  \"c\": [],\n  \"d\": {\n    \"x\": [\n      {}\n    ]\n  },\n"
            "  \"s\": \"\\u0000\\u001f\x7f\\\"\\\\/é\\t\"\n}");
}

TEST(ChatTemplateToolsTest, OnlyChatMlAndLlama31SupportTools) {
  for (ChatTemplate chat_template :
       {ChatTemplate::kChatMl, ChatTemplate::kLlama3, ChatTemplate::kLlama31, ChatTemplate::kLlama2,
        ChatTemplate::kMistralV1, ChatTemplate::kMistralV3, ChatTemplate::kZephyr,
        ChatTemplate::kPhi3, ChatTemplate::kGemma}) {
    const bool supports =
        chat_template == ChatTemplate::kChatMl || chat_template == ChatTemplate::kLlama31;
    EXPECT_EQ(chat_template_supports_tools(chat_template), supports)
        << chat_template_name(chat_template);
    // Without anything tool-related, every family renders as render_chat does.
    Result<std::string> plain = render_chat_with_tools(chat_template, kConversation, {});
    ASSERT_TRUE(plain.ok());
    EXPECT_EQ(*plain, render_chat(chat_template, kConversation));
  }
}

TEST(ChatTemplateToolsTest, ToolUseOnAFamilyWithoutToolsIsRefused) {
  const std::vector<ChatMessage> user_only = {{"user", "U"}};
  const Result<std::string> with_tools =
      render_chat_with_tools(ChatTemplate::kGemma, user_only, kTools);
  ASSERT_FALSE(with_tools.ok());
  EXPECT_EQ(with_tools.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(with_tools.status().message().find("'gemma'"), std::string::npos);

  const std::vector<ChatMessage> with_result = {{"user", "U"}, tool_result("call_1", "R")};
  const Result<std::string> tool_message =
      render_chat_with_tools(ChatTemplate::kLlama3, with_result, {});
  ASSERT_FALSE(tool_message.ok());
  EXPECT_NE(tool_message.status().message().find("messages[1]"), std::string::npos);

  const std::vector<ChatMessage> with_call = {
      {"user", "U"}, assistant_calling("", {{.id = "c", .name = "f", .arguments = "{}"}})};
  EXPECT_FALSE(render_chat_with_tools(ChatTemplate::kMistralV3, with_call, {}).ok());
}

TEST(ChatTemplateToolsTest, RefusesWhatTheTemplatesRefuse) {
  // Llama 3.1's template raises on more than one call in an assistant message.
  const std::vector<ChatMessage> two_calls = {
      {"user", "U"},
      assistant_calling("", {{.id = "a", .name = "f", .arguments = "{}"},
                             {.id = "b", .name = "g", .arguments = "{}"}})};
  const Result<std::string> refused =
      render_chat_with_tools(ChatTemplate::kLlama31, two_calls, kTools);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("messages[1].tool_calls"), std::string::npos);
  EXPECT_TRUE(render_chat_with_tools(ChatTemplate::kChatMl, two_calls, kTools).ok());
  // ... and when there is no message after the system prompt to carry the tools.
  const std::vector<ChatMessage> system_only = {{"system", "S"}};
  EXPECT_FALSE(render_chat_with_tools(ChatTemplate::kLlama31, system_only, kTools).ok());
  // A parameters schema that is not a JSON object.
  ToolDefinition broken = time_tool();
  broken.parameters_schema = "[1, 2";
  const std::vector<ChatMessage> user_only = {{"user", "U"}};
  const Result<std::string> bad_schema =
      render_chat_with_tools(ChatTemplate::kChatMl, user_only, std::span(&broken, 1));
  ASSERT_FALSE(bad_schema.ok());
  EXPECT_NE(bad_schema.status().message().find("get_time"), std::string::npos);
}

}  // namespace
}  // namespace folio::server
