#include "folio/server/chat_template.h"

#include <array>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "folio/base/check.h"
#include "folio/server/jinja_json.h"

namespace folio::server {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr std::array<ChatTemplate, 9> kAllTemplates = {
    ChatTemplate::kChatMl, ChatTemplate::kLlama3,    ChatTemplate::kLlama31,
    ChatTemplate::kLlama2, ChatTemplate::kMistralV1, ChatTemplate::kMistralV3,
    ChatTemplate::kZephyr, ChatTemplate::kPhi3,      ChatTemplate::kGemma};

// Jinja's trim: whitespace removed from both ends.
std::string_view trim(std::string_view text) {
  constexpr std::string_view kWhitespace = " \t\n\r\v\f";
  const size_t first = text.find_first_not_of(kWhitespace);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(kWhitespace) - first + 1);
}

// Every system message's content, joined by a blank line, for templates that place the system
// prompt in one spot.
std::string joined_system_prompt(std::span<const ChatMessage> messages) {
  std::string system;
  for (const ChatMessage& message : messages) {
    if (message.role != "system") continue;
    if (!system.empty()) system += "\n\n";
    system += message.content;
  }
  return system;
}

// Llama 2 chat: the system prompt goes inside the first [INST] block; contents are stripped;
// each answer is followed by " </s>", and every later user turn starts with "<s>" (the first
// BOS is the tokenizer's).
std::string render_llama2(std::span<const ChatMessage> messages) {
  std::string system = joined_system_prompt(messages);
  std::string prompt;
  for (const ChatMessage& message : messages) {
    if (message.role == "user") {
      if (!prompt.empty()) prompt += "<s>";
      std::string content(message.content);
      if (!system.empty()) {
        content = fmt::format("<<SYS>>\n{}\n<</SYS>>\n\n{}", system, content);
        system.clear();
      }
      prompt += fmt::format("[INST] {} [/INST]", trim(content));
    } else if (message.role == "assistant") {
      prompt += fmt::format(" {} </s>", trim(message.content));
    }
  }
  return prompt;
}

// Mistral v1 (the official template of Mistral 7B Instruct v0.2): " [INST] " opens a user turn,
// " [/INST]" closes it, " answer</s>" follows; the system prompt opens the first user turn.
std::string render_mistral_v1(std::span<const ChatMessage> messages) {
  std::string system = joined_system_prompt(messages);
  std::string prompt;
  for (const ChatMessage& message : messages) {
    if (message.role == "user") {
      prompt += " [INST] ";
      if (!system.empty()) {
        prompt += system + "\n\n";
        system.clear();
      }
      prompt += message.content + " [/INST]";
    } else if (message.role == "assistant") {
      prompt += " " + message.content + "</s>";
    }
  }
  return prompt;
}

// Mistral v3 (Mistral 7B Instruct v0.3): "[INST] " and "[/INST]" without the outer spaces, the
// answer trimmed; the system prompt opens the last user turn, and only when the conversation
// ends with one (the template places it with `loop.last`).
std::string render_mistral_v3(std::span<const ChatMessage> messages) {
  const std::string system = joined_system_prompt(messages);
  size_t last = messages.size();
  while (last > 0 && messages[last - 1].role == "system") --last;
  std::string prompt;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (message.role == "user") {
      prompt += "[INST] ";
      if (i + 1 == last && !system.empty()) prompt += system + "\n\n";
      prompt += message.content + "[/INST]";
    } else if (message.role == "assistant") {
      prompt += fmt::format(" {}</s>", trim(message.content));
    }
  }
  return prompt;
}

std::string render_gemma(std::span<const ChatMessage> messages) {
  std::string system = joined_system_prompt(messages);
  std::string prompt;
  for (const ChatMessage& message : messages) {
    if (message.role == "system") continue;
    const bool model = message.role == "assistant";
    prompt += model ? "<start_of_turn>model\n" : "<start_of_turn>user\n";
    if (!model && !system.empty()) {
      prompt += system + "\n\n";
      system.clear();
    }
    prompt += fmt::format("{}<end_of_turn>\n", trim(message.content));
  }
  return prompt + "<start_of_turn>model\n";
}

// A JSON text parsed keeping its key order; nullopt when it is not JSON.
std::optional<OrderedJson> parse_ordered_json(std::string_view text) {
  OrderedJson value = OrderedJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return std::nullopt;
  return value;
}

// A tool as a client sends it: {"type": "function", "function": {"name", "description"?,
// "parameters"}} (the description left out when empty, as a client leaves it out).
// Requires: parameters_schema is JSON (render_chat_with_tools checks it).
OrderedJson tool_json(const ToolDefinition& tool) {
  OrderedJson function = OrderedJson::object();
  function["name"] = tool.name;
  if (!tool.description.empty()) function["description"] = tool.description;
  std::optional<OrderedJson> parameters = parse_ordered_json(tool.parameters_schema);
  function["parameters"] = parameters ? std::move(*parameters) : OrderedJson::object();
  OrderedJson wrapped = OrderedJson::object();
  wrapped["type"] = "function";
  wrapped["function"] = std::move(function);
  return wrapped;
}

// A call's arguments as the templates print them. OpenAI clients send the arguments as JSON text
// and servers (vLLM, llama.cpp) parse it before rendering, so the template's tojson prints the
// object; text that is not JSON is printed as the template prints a string: Qwen 3's template
// inserts it as is, Llama's tojson quotes it.
std::string rendered_arguments(std::string_view arguments, bool quote_if_not_json) {
  std::optional<OrderedJson> parsed = parse_ordered_json(arguments);
  if (parsed) return jinja_tojson(*parsed);
  if (!quote_if_not_json) return std::string(arguments);
  std::string quoted;
  append_jinja_json_string(arguments, quoted);
  return quoted;
}

// --- chatml: Qwen 2.5 / Qwen 3 ---------------------------------------------------------------

constexpr std::string_view kQwenToolsIntro =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr std::string_view kQwenToolsOutro =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";

// Qwen 2.5's template, and Qwen 3's for messages without reasoning. With tools, the first system
// message opens the system turn that lists them (Qwen 2.5 puts its default system prompt there
// when there is none and Qwen 3 nothing; Folio adds no default prompt, as without tools). A call
// follows the assistant's content after a newline (none when the content is empty); consecutive
// tool results share one user turn.
std::string render_chatml(std::span<const ChatMessage> messages,
                          std::span<const ToolDefinition> tools) {
  std::string prompt;
  const bool system_first = !messages.empty() && messages[0].role == "system";
  if (!tools.empty()) {
    prompt += "<|im_start|>system\n";
    if (system_first) prompt += messages[0].content + "\n\n";
    prompt += kQwenToolsIntro;
    for (const ToolDefinition& tool : tools) prompt += "\n" + jinja_tojson(tool_json(tool));
    prompt += kQwenToolsOutro;
  } else if (system_first) {
    prompt += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
  }
  for (size_t i = system_first ? 1 : 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (message.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") prompt += "<|im_start|>user";
      prompt += "\n<tool_response>\n" + message.content + "\n</tool_response>";
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") prompt += "<|im_end|>\n";
      continue;
    }
    prompt += "<|im_start|>" + message.role + "\n" + message.content;
    for (size_t call = 0; call < message.tool_calls.size(); ++call) {
      const ToolCall& tool_call = message.tool_calls[call];
      if (call > 0 || !message.content.empty()) prompt += "\n";
      prompt += fmt::format("<tool_call>\n{{\"name\": \"{}\", \"arguments\": {}}}\n</tool_call>",
                            tool_call.name,
                            rendered_arguments(tool_call.arguments, /*quote_if_not_json=*/false));
    }
    prompt += "<|im_end|>\n";
  }
  return prompt + "<|im_start|>assistant\n";
}

// --- llama3.1: Llama 3.1 / 3.2 / 3.3 -----------------------------------------------------------

constexpr std::string_view kLlamaDateLines =
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";
constexpr std::string_view kLlamaToolsIntro =
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": "
    "function name, \"parameters\": dictionary of argument name and its value}.Do not use "
    "variables.\n\n";

std::string llama_header(std::string_view role) {
  return fmt::format("<|start_header_id|>{}<|end_header_id|>\n\n", role);
}

// Llama 3.1's template (also 3.3's; 3.2's differs only in taking today's date when the renderer
// offers one). The first system message is trimmed into the system header, which always carries
// the date lines; with tools, "Environment: ipython" opens it and the tools open the first
// message after it, which the template takes whatever its role. A call is the whole assistant
// turn (the content is not shown); a tool result is an ipython turn whose content the template
// passes through tojson (a string is iterable in Jinja), so it appears as a JSON string.
// Requires: tools are empty or a message follows the system prompt.
std::string render_llama31(std::span<const ChatMessage> messages,
                           std::span<const ToolDefinition> tools) {
  size_t next = 0;
  std::string system;
  if (!messages.empty() && messages[0].role == "system") {
    system = trim(messages[0].content);
    next = 1;
  }
  std::string prompt = llama_header("system");
  if (!tools.empty()) prompt += "Environment: ipython\n";
  prompt += kLlamaDateLines;
  prompt += system + "<|eot_id|>";
  if (!tools.empty()) {
    FOLIO_CHECK(next < messages.size(), "llama3.1 tools need a message to hold them");
    prompt += llama_header("user");
    prompt += kLlamaToolsIntro;
    for (const ToolDefinition& tool : tools) {
      prompt += jinja_tojson(tool_json(tool), /*indent=*/4) + "\n\n";
    }
    prompt += fmt::format("{}<|eot_id|>", trim(messages[next].content));
    ++next;
  }
  for (; next < messages.size(); ++next) {
    const ChatMessage& message = messages[next];
    if (message.role == "tool") {
      std::string quoted;
      append_jinja_json_string(message.content, quoted);
      prompt += llama_header("ipython") + quoted + "<|eot_id|>";
    } else if (!message.tool_calls.empty()) {
      const ToolCall& tool_call = message.tool_calls.front();
      prompt += llama_header("assistant");
      prompt += fmt::format("{{\"name\": \"{}\", \"parameters\": {}}}<|eot_id|>", tool_call.name,
                            rendered_arguments(tool_call.arguments, /*quote_if_not_json=*/true));
    } else {
      prompt += fmt::format("{}{}<|eot_id|>", llama_header(message.role), trim(message.content));
    }
  }
  return prompt + llama_header("assistant");
}

// The refusals of render_chat_with_tools.
Status check_tool_use(ChatTemplate chat_template, std::span<const ChatMessage> messages,
                      std::span<const ToolDefinition> tools) {
  if (!chat_template_supports_tools(chat_template)) {
    const auto refuse = [&](std::string_view what) {
      return invalid_argument(
          "{} need a chat template that defines tool calling (chatml for Qwen 2.5/3 and "
          "Hermes-style models, llama3.1 for Llama 3.1-3.3); the model's template is '{}'",
          what, chat_template_name(chat_template));
    };
    if (!tools.empty()) return refuse("'tools'");
    for (size_t i = 0; i < messages.size(); ++i) {
      if (messages[i].role == "tool") return refuse(fmt::format("'messages[{}]' (role tool)", i));
      if (!messages[i].tool_calls.empty()) {
        return refuse(fmt::format("'messages[{}].tool_calls'", i));
      }
    }
    return Status();
  }
  for (size_t i = 0; i < tools.size(); ++i) {
    std::optional<OrderedJson> schema = parse_ordered_json(tools[i].parameters_schema);
    if (!schema || !schema->is_object()) {
      return invalid_argument(
          "'tools[{}].function.parameters' (function '{}') must be a JSON object", i,
          tools[i].name);
    }
  }
  if (chat_template == ChatTemplate::kLlama31) {
    for (size_t i = 0; i < messages.size(); ++i) {
      if (messages[i].tool_calls.size() > 1) {
        return invalid_argument(
            "'messages[{}].tool_calls' has {} calls; Llama 3.1's template takes one call per "
            "assistant message (send each call as its own assistant message, followed by its "
            "result)",
            i, messages[i].tool_calls.size());
      }
    }
    const size_t first = !messages.empty() && messages[0].role == "system" ? 1 : 0;
    if (!tools.empty() && first >= messages.size()) {
      return invalid_argument(
          "Llama 3.1's template puts the tools in the first user message, and 'messages' has "
          "none");
    }
  }
  return Status();
}

}  // namespace

std::string_view chat_template_name(ChatTemplate chat_template) {
  switch (chat_template) {
    case ChatTemplate::kChatMl:
      return "chatml";
    case ChatTemplate::kLlama3:
      return "llama3";
    case ChatTemplate::kLlama31:
      return "llama3.1";
    case ChatTemplate::kLlama2:
      return "llama2";
    case ChatTemplate::kMistralV1:
      return "mistral-v1";
    case ChatTemplate::kMistralV3:
      return "mistral-v3";
    case ChatTemplate::kZephyr:
      return "zephyr";
    case ChatTemplate::kPhi3:
      return "phi3";
    case ChatTemplate::kGemma:
      return "gemma";
  }
  return "chatml";
}

Result<ChatTemplate> chat_template_from_name(std::string_view name) {
  std::string known;
  for (ChatTemplate chat_template : kAllTemplates) {
    if (chat_template_name(chat_template) == name) return chat_template;
    known += known.empty() ? "" : ", ";
    known += chat_template_name(chat_template);
  }
  return invalid_argument("unknown chat template '{}'; known: {}", name, known);
}

std::optional<ChatTemplate> detect_chat_template(std::string_view jinja_source) {
  auto has = [&](std::string_view marker) {
    return jinja_source.find(marker) != std::string_view::npos;
  };
  if (has("<|im_start|>")) return ChatTemplate::kChatMl;
  if (has("<|start_header_id|>")) {
    return has("Cutting Knowledge Date") ? ChatTemplate::kLlama31 : ChatTemplate::kLlama3;
  }
  if (has("<start_of_turn>")) return ChatTemplate::kGemma;
  if (has("[INST]")) {
    // Mistral's official templates: v1 prepends the system message to " [INST] ", v3 lists
    // tools; v1 alone puts a space before "[INST]".
    if (has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]")) {
      return has(" [INST]") ? ChatTemplate::kMistralV1 : ChatTemplate::kMistralV3;
    }
    return ChatTemplate::kLlama2;
  }
  // Phi-3 and Zephyr share <|user|> and <|assistant|>; Phi-3 ends turns with <|end|>.
  if (has("<|assistant|>") && has("<|end|>")) return ChatTemplate::kPhi3;
  if (has("<|user|>") && has("<|assistant|>")) return ChatTemplate::kZephyr;
  return std::nullopt;
}

bool chat_template_supports_tools(ChatTemplate chat_template) {
  switch (chat_template) {
    case ChatTemplate::kChatMl:
    case ChatTemplate::kLlama31:
      return true;
    case ChatTemplate::kLlama3:
    case ChatTemplate::kLlama2:
    case ChatTemplate::kMistralV1:
    case ChatTemplate::kMistralV3:
    case ChatTemplate::kZephyr:
    case ChatTemplate::kPhi3:
    case ChatTemplate::kGemma:
      return false;
  }
  return false;
}

Result<std::string> render_chat_with_tools(ChatTemplate chat_template,
                                           std::span<const ChatMessage> messages,
                                           std::span<const ToolDefinition> tools) {
  FOLIO_RETURN_IF_ERROR(check_tool_use(chat_template, messages, tools));
  switch (chat_template) {
    case ChatTemplate::kChatMl:
      return render_chatml(messages, tools);
    case ChatTemplate::kLlama31:
      return render_llama31(messages, tools);
    case ChatTemplate::kLlama3:
    case ChatTemplate::kLlama2:
    case ChatTemplate::kMistralV1:
    case ChatTemplate::kMistralV3:
    case ChatTemplate::kZephyr:
    case ChatTemplate::kPhi3:
    case ChatTemplate::kGemma:
      break;
  }
  return render_chat(chat_template, messages);
}

std::string render_chat(ChatTemplate chat_template, std::span<const ChatMessage> messages) {
  std::string prompt;
  switch (chat_template) {
    case ChatTemplate::kChatMl:
      return render_chatml(messages, {});
    case ChatTemplate::kLlama3:
      for (const ChatMessage& message : messages) {
        prompt += fmt::format("<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>",
                              message.role, trim(message.content));
      }
      return prompt + "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case ChatTemplate::kLlama31:
      return render_llama31(messages, {});
    case ChatTemplate::kLlama2:
      return render_llama2(messages);
    case ChatTemplate::kMistralV1:
      return render_mistral_v1(messages);
    case ChatTemplate::kMistralV3:
      return render_mistral_v3(messages);
    case ChatTemplate::kZephyr:
      for (const ChatMessage& message : messages) {
        prompt += "<|" + message.role + "|>\n" + message.content + "</s>\n";
      }
      return prompt + "<|assistant|>\n";
    case ChatTemplate::kPhi3:
      for (const ChatMessage& message : messages) {
        if (message.role == "system" && message.content.empty()) continue;
        prompt += "<|" + message.role + "|>\n" + message.content + "<|end|>\n";
      }
      return prompt + "<|assistant|>\n";
    case ChatTemplate::kGemma:
      return render_gemma(messages);
  }
  return prompt;
}

}  // namespace folio::server
