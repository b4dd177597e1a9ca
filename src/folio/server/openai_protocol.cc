#include "folio/server/openai_protocol.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace folio::server {
namespace {

// Ordered: a schema's property order is the order a structured answer writes them in, and tool
// definitions are shown to the model as the client wrote them.
using Json = nlohmann::ordered_json;

// Fields accepted and ignored: they describe the caller and change no token of the answer.
constexpr std::array<std::string_view, 4> kIgnoredFields = {"user", "metadata", "store",
                                                            "service_tier"};
constexpr std::array<std::string_view, 21> kCommonFields = {"model",
                                                            "max_tokens",
                                                            "temperature",
                                                            "top_p",
                                                            "n",
                                                            "stream",
                                                            "stream_options",
                                                            "stop",
                                                            "seed",
                                                            "presence_penalty",
                                                            "frequency_penalty",
                                                            "logit_bias",
                                                            "logprobs",
                                                            "top_k",
                                                            "min_p",
                                                            "repetition_penalty",
                                                            "ignore_eos",
                                                            "priority",
                                                            "user",
                                                            "metadata",
                                                            "store"};
constexpr std::array<std::string_view, 5> kCompletionFields = {"prompt", "echo", "best_of",
                                                               "suffix", "service_tier"};
constexpr std::array<std::string_view, 8> kChatFields = {
    "messages",    "max_completion_tokens", "top_logprobs",        "tools",
    "tool_choice", "response_format",       "parallel_tool_calls", "service_tier"};

template <size_t N>
bool contains(const std::array<std::string_view, N>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string dump(const Json& value) {
  // Replace, never throw, on bytes that are not UTF-8.
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Status wrong_type(std::string_view field, std::string_view expected, const Json& value) {
  return invalid_argument("'{}' must be {}, got {}", field, expected, value.type_name());
}

Result<int64_t> read_integer(const Json& value, std::string_view field, int64_t min, int64_t max) {
  if (!value.is_number_integer()) return wrong_type(field, "an integer", value);
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return invalid_argument("'{}' must be at most {}, got {}", field, max, dump(value));
  }
  const auto number = value.get<int64_t>();
  if (number < min || number > max) {
    return invalid_argument("'{}' must be in [{}, {}], got {}", field, min, max, number);
  }
  return number;
}

Result<float> read_float(const Json& value, std::string_view field, double min, double max) {
  if (!value.is_number()) return wrong_type(field, "a number", value);
  const auto number = value.get<double>();
  if (!std::isfinite(number) || number < min || number > max) {
    return invalid_argument("'{}' must be in [{}, {}], got {}", field, min, max, dump(value));
  }
  return static_cast<float>(number);
}

Result<bool> read_bool(const Json& value, std::string_view field) {
  if (!value.is_boolean()) return wrong_type(field, "a boolean", value);
  return value.get<bool>();
}

Result<std::vector<std::string>> read_stop(const Json& value) {
  std::vector<std::string> stop;
  if (value.is_string()) {
    stop.push_back(value.get<std::string>());
  } else if (value.is_array()) {
    if (value.size() > 4) return invalid_argument("'stop' takes at most 4 strings");
    for (const Json& element : value) {
      if (!element.is_string()) return wrong_type("stop[]", "a string", element);
      stop.push_back(element.get<std::string>());
    }
  } else {
    return wrong_type("stop", "a string or an array of strings", value);
  }
  for (const std::string& text : stop) {
    if (text.empty()) return invalid_argument("'stop' strings must not be empty");
  }
  return stop;
}

// A field whose only supported values leave the answer as plain text: `accepted` says so.
Status require_default(const Json& value, std::string_view field, bool accepted) {
  if (value.is_null() || accepted) return Status();
  return invalid_argument("'{}' = {} is not supported by this server", field, dump(value));
}

Status read_sampling_field(std::string_view key, const Json& value, GenerationRequest& out) {
  engine::SamplingParams& sampling = out.sampling;
  if (key == "temperature") {
    FOLIO_ASSIGN_OR_RETURN(sampling.temperature, read_float(value, key, 0.0, 2.0));
  } else if (key == "top_p") {
    FOLIO_ASSIGN_OR_RETURN(sampling.top_p, read_float(value, key, 0.0, 1.0));
    if (sampling.top_p == 0.0f) return invalid_argument("'top_p' must be above 0");
  } else if (key == "presence_penalty") {
    FOLIO_ASSIGN_OR_RETURN(sampling.presence_penalty, read_float(value, key, -2.0, 2.0));
  } else if (key == "frequency_penalty") {
    FOLIO_ASSIGN_OR_RETURN(sampling.frequency_penalty, read_float(value, key, -2.0, 2.0));
  } else if (key == "min_p") {
    FOLIO_ASSIGN_OR_RETURN(sampling.min_p, read_float(value, key, 0.0, 1.0));
  } else if (key == "repetition_penalty") {
    FOLIO_ASSIGN_OR_RETURN(sampling.repetition_penalty, read_float(value, key, 0.01, 100.0));
  } else if (key == "top_k") {
    // vLLM's convention: -1 (like 0) keeps every token.
    FOLIO_ASSIGN_OR_RETURN(int64_t top_k, read_integer(value, key, -1, 1 << 30));
    sampling.top_k = static_cast<int32_t>(std::max<int64_t>(top_k, 0));
  } else if (key == "seed") {
    FOLIO_ASSIGN_OR_RETURN(int64_t seed,
                           read_integer(value, key, std::numeric_limits<int64_t>::min(),
                                        std::numeric_limits<int64_t>::max()));
    sampling.seed = static_cast<uint64_t>(seed);
  }
  return Status();
}

// logit_bias: {"<token id>": bias}; OpenAI's keys are decimal strings.
Result<std::vector<std::pair<int32_t, float>>> read_logit_bias(const Json& value) {
  if (!value.is_object()) return wrong_type("logit_bias", "an object", value);
  std::vector<std::pair<int32_t, float>> bias;
  for (const auto& [key, entry] : value.items()) {
    int64_t token = 0;
    const bool digits =
        !key.empty() && key.size() <= 10 &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits) token = std::stoll(key);
    if (!digits || token > std::numeric_limits<int32_t>::max()) {
      return invalid_argument("'logit_bias' keys must be token ids (decimal strings), got '{}'",
                              key);
    }
    FOLIO_ASSIGN_OR_RETURN(const float amount, read_float(entry, "logit_bias[]", -100.0, 100.0));
    bias.emplace_back(static_cast<int32_t>(token), amount);
  }
  std::sort(bias.begin(), bias.end());
  return bias;
}

// A tool's or a function's name: what the templates and the OpenAI API allow.
Status check_function_name(std::string_view name, std::string_view field) {
  const bool valid =
      !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_' || c == '-' || c == '.';
      });
  if (!valid) {
    return invalid_argument("'{}' must be 1 to 64 letters, digits, '_', '-' or '.', got '{}'",
                            field, name);
  }
  return Status();
}

Result<std::vector<ToolDefinition>> read_tools(const Json& value, const ProtocolLimits& limits) {
  if (!value.is_array()) return wrong_type("tools", "an array", value);
  if (value.size() > static_cast<size_t>(limits.max_tools)) {
    return invalid_argument("'tools' has {} entries, more than the limit of {}", value.size(),
                            limits.max_tools);
  }
  std::vector<ToolDefinition> tools;
  for (size_t index = 0; index < value.size(); ++index) {
    const Json& tool = value[index];
    if (!tool.is_object()) return wrong_type("tools[]", "an object", tool);
    for (const auto& [key, field] : tool.items()) {
      if (key != "type" && key != "function") {
        return invalid_argument("unrecognized field 'tools[{}].{}'", index, key);
      }
    }
    if (!tool.contains("type") || tool["type"] != Json("function")) {
      return invalid_argument("'tools[{}].type' must be \"function\"", index);
    }
    if (!tool.contains("function") || !tool["function"].is_object()) {
      return invalid_argument("'tools[{}].function' must be an object", index);
    }
    const Json& function = tool["function"];
    ToolDefinition definition;
    for (const auto& [key, field] : function.items()) {
      if (key == "name") {
        if (!field.is_string()) return wrong_type("tools[].function.name", "a string", field);
        definition.name = field.get<std::string>();
      } else if (key == "description") {
        if (field.is_null()) continue;
        if (!field.is_string()) {
          return wrong_type("tools[].function.description", "a string", field);
        }
        definition.description = field.get<std::string>();
      } else if (key == "parameters") {
        if (field.is_null()) continue;
        if (!field.is_object()) {
          return wrong_type("tools[].function.parameters", "an object", field);
        }
        definition.parameters_schema = dump(field);
      } else if (key != "strict") {  // arguments are always held to the schema
        return invalid_argument("unrecognized field 'tools[{}].function.{}'", index, key);
      }
    }
    FOLIO_RETURN_IF_ERROR(
        check_function_name(definition.name, fmt::format("tools[{}].function.name", index)));
    for (const ToolDefinition& earlier : tools) {
      if (earlier.name == definition.name) {
        return invalid_argument("'tools' names the function '{}' twice", definition.name);
      }
    }
    tools.push_back(std::move(definition));
  }
  return tools;
}

Result<ToolChoice> read_tool_choice(const Json& value) {
  ToolChoice choice;
  if (value.is_string()) {
    const std::string mode = value.get<std::string>();
    if (mode == "none") {
      choice.mode = ToolChoice::Mode::kNone;
    } else if (mode == "auto") {
      choice.mode = ToolChoice::Mode::kAuto;
    } else if (mode == "required") {
      choice.mode = ToolChoice::Mode::kRequired;
    } else {
      return invalid_argument("'tool_choice' must be none, auto, required or a function, got '{}'",
                              mode);
    }
    return choice;
  }
  const bool function_shape = value.is_object() && value.contains("type") &&
                              value["type"] == Json("function") && value.contains("function") &&
                              value["function"].is_object() && value["function"].contains("name") &&
                              value["function"]["name"].is_string();
  if (!function_shape) {
    return invalid_argument(
        "'tool_choice' must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", "
        "\"function\": {{\"name\": ...}}}}");
  }
  choice.mode = ToolChoice::Mode::kFunction;
  choice.function = value["function"]["name"].get<std::string>();
  return choice;
}

Result<ResponseFormat> read_response_format(const Json& value) {
  if (!value.is_object() || !value.contains("type") || !value["type"].is_string()) {
    return invalid_argument("'response_format' must be an object with a string 'type'");
  }
  ResponseFormat format;
  const std::string type = value["type"].get<std::string>();
  for (const auto& [key, field] : value.items()) {
    if (key != "type" && !(key == "json_schema" && type == "json_schema")) {
      return invalid_argument("unrecognized field 'response_format.{}'", key);
    }
  }
  if (type == "text") return format;
  if (type == "json_object") {
    format.type = ResponseFormat::Type::kJsonObject;
    return format;
  }
  if (type != "json_schema") {
    return invalid_argument(
        "'response_format.type' must be text, json_object or json_schema, got '{}'", type);
  }
  format.type = ResponseFormat::Type::kJsonSchema;
  if (!value.contains("json_schema") || !value["json_schema"].is_object()) {
    return invalid_argument("'response_format.json_schema' must be an object");
  }
  format.schema = "{}";
  for (const auto& [key, field] : value["json_schema"].items()) {
    if (key == "name") {
      if (!field.is_string())
        return wrong_type("response_format.json_schema.name", "a string", field);
      format.name = field.get<std::string>();
    } else if (key == "schema") {
      if (!field.is_object()) {
        return wrong_type("response_format.json_schema.schema", "an object", field);
      }
      format.schema = dump(field);
    } else if (key == "strict") {
      if (field.is_null()) continue;
      FOLIO_ASSIGN_OR_RETURN(format.strict, read_bool(field, "response_format.json_schema.strict"));
    } else if (key != "description") {
      return invalid_argument("unrecognized field 'response_format.json_schema.{}'", key);
    }
  }
  if (format.name.empty())
    return invalid_argument("'response_format.json_schema.name' is required");
  return format;
}

Status read_common_field(std::string_view key, const Json& value, const ProtocolLimits& limits,
                         GenerationRequest& out) {
  if (value.is_null()) return Status();  // OpenAI's clients send null for "not given"
  if (key == "model") {
    if (!value.is_string()) return wrong_type(key, "a string", value);
    out.model = value.get<std::string>();
  } else if (key == "max_tokens" || key == "max_completion_tokens") {
    // 0 only asks for the echoed prompt's logprobs; parse_fields checks that echo is on.
    FOLIO_ASSIGN_OR_RETURN(int64_t max_tokens, read_integer(value, key, 0, limits.max_tokens));
    out.max_tokens = static_cast<int32_t>(max_tokens);
  } else if (key == "n") {
    FOLIO_ASSIGN_OR_RETURN(int64_t count, read_integer(value, key, 1, limits.max_choices));
    out.n = static_cast<int32_t>(count);
  } else if (key == "best_of") {
    FOLIO_ASSIGN_OR_RETURN(int64_t count, read_integer(value, key, 1, limits.max_choices));
    out.best_of = static_cast<int32_t>(count);
  } else if (key == "stream") {
    FOLIO_ASSIGN_OR_RETURN(out.stream, read_bool(value, key));
  } else if (key == "stream_options") {
    if (!value.is_object()) return wrong_type(key, "an object", value);
    for (const auto& [option, option_value] : value.items()) {
      if (option != "include_usage") {
        return invalid_argument("unknown field 'stream_options.{}'", option);
      }
      if (!option_value.is_null()) {
        FOLIO_ASSIGN_OR_RETURN(out.include_usage, read_bool(option_value, "include_usage"));
      }
    }
  } else if (key == "stop") {
    FOLIO_ASSIGN_OR_RETURN(out.stop, read_stop(value));
  } else if (key == "ignore_eos") {
    FOLIO_ASSIGN_OR_RETURN(out.ignore_eos, read_bool(value, key));
  } else if (key == "priority") {
    FOLIO_ASSIGN_OR_RETURN(int64_t priority,
                           read_integer(value, key, -kMaxRequestPriority, kMaxRequestPriority));
    out.priority = static_cast<int32_t>(priority);
  } else if (key == "logit_bias") {
    FOLIO_ASSIGN_OR_RETURN(out.logit_bias, read_logit_bias(value));
  } else if (key == "logprobs" && out.endpoint == Endpoint::kCompletions) {
    if (!(value.is_boolean() && !value.get<bool>())) {  // false: none
      FOLIO_ASSIGN_OR_RETURN(int64_t count, read_integer(value, key, 0, limits.max_logprobs));
      out.logprobs = static_cast<int32_t>(count);
    }
  } else if (key == "logprobs") {  // chat: a boolean; check_combinations reads it
    FOLIO_RETURN_IF_ERROR(read_bool(value, key).status());
  } else if (key == "top_logprobs") {
    FOLIO_ASSIGN_OR_RETURN(int64_t count, read_integer(value, key, 0, limits.max_logprobs));
    out.logprobs = static_cast<int32_t>(count);
  } else if (key == "echo") {
    FOLIO_ASSIGN_OR_RETURN(out.echo, read_bool(value, key));
  } else if (key == "suffix") {
    FOLIO_RETURN_IF_ERROR(require_default(value, key, value == Json("")));
  } else if (key == "tools") {
    FOLIO_ASSIGN_OR_RETURN(out.tools, read_tools(value, limits));
  } else if (key == "tool_choice") {
    FOLIO_ASSIGN_OR_RETURN(out.tool_choice, read_tool_choice(value));
  } else if (key == "parallel_tool_calls") {
    FOLIO_ASSIGN_OR_RETURN(out.parallel_tool_calls, read_bool(value, key));
  } else if (key == "response_format") {
    FOLIO_ASSIGN_OR_RETURN(out.response_format, read_response_format(value));
  } else {
    return read_sampling_field(key, value, out);
  }
  return Status();
}

Result<std::vector<int32_t>> read_token_ids(const Json& value, std::string_view field,
                                            const ProtocolLimits& limits) {
  if (value.empty()) return invalid_argument("'{}' must not be empty", field);
  if (limits.max_prompt_token_ids > 0 &&
      value.size() > static_cast<size_t>(limits.max_prompt_token_ids)) {
    return invalid_argument("'{}' has {} token ids, more than the limit of {}", field, value.size(),
                            limits.max_prompt_token_ids);
  }
  std::vector<int32_t> tokens;
  tokens.reserve(value.size());
  for (const Json& token : value) {
    FOLIO_ASSIGN_OR_RETURN(int64_t id, read_integer(token, fmt::format("{}[]", field), 0,
                                                    std::numeric_limits<int32_t>::max()));
    tokens.push_back(static_cast<int32_t>(id));
  }
  return tokens;
}

// "prompt": a string, token ids, a list of strings, or a list of token id lists.
Status read_prompt(const Json& value, const ProtocolLimits& limits, GenerationRequest& out) {
  if (value.is_string()) {
    out.prompts.push_back(CompletionPrompt{value.get<std::string>(), {}});
    return Status();
  }
  if (!value.is_array()) {
    return wrong_type("prompt", "a string, an array of token ids or an array of prompts", value);
  }
  if (value.empty()) return invalid_argument("'prompt' must not be empty");
  if (value[0].is_number()) {
    FOLIO_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, read_token_ids(value, "prompt", limits));
    out.prompts.push_back(CompletionPrompt{"", std::move(tokens)});
    return Status();
  }
  if (value.size() > static_cast<size_t>(limits.max_prompts)) {
    return invalid_argument("'prompt' lists {} prompts, more than the limit of {}", value.size(),
                            limits.max_prompts);
  }
  for (const Json& prompt : value) {
    if (prompt.is_string()) {
      out.prompts.push_back(CompletionPrompt{prompt.get<std::string>(), {}});
    } else if (prompt.is_array()) {
      FOLIO_ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                             read_token_ids(prompt, "prompt[]", limits));
      out.prompts.push_back(CompletionPrompt{"", std::move(tokens)});
    } else {
      return wrong_type("prompt[]", "a string or an array of token ids", prompt);
    }
  }
  return Status();
}

Result<std::string> read_message_content(const Json& value, size_t index) {
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_array()) {
    return invalid_argument(
        "'messages[{}].content' must be a string or an array of text "
        "parts, got {}",
        index, value.type_name());
  }
  std::string text;
  for (const Json& part : value) {
    if (!part.is_object() || !part.contains("type") || part["type"] != Json("text") ||
        !part.contains("text") || !part["text"].is_string()) {
      return invalid_argument(
          "'messages[{}].content' parts must be {{\"type\": \"text\", "
          "\"text\": string}} (other part types are not supported)",
          index);
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

// An assistant message's "tool_calls": [{"id", "type": "function", "function": {"name",
// "arguments": JSON text}}].
Result<std::vector<ToolCall>> read_message_tool_calls(const Json& value, size_t index) {
  if (!value.is_array()) {
    return invalid_argument("'messages[{}].tool_calls' must be an array", index);
  }
  std::vector<ToolCall> calls;
  for (const Json& call : value) {
    const bool shape =
        call.is_object() && call.contains("function") && call["function"].is_object() &&
        call["function"].contains("name") && call["function"]["name"].is_string() &&
        call["function"].contains("arguments") && call["function"]["arguments"].is_string() &&
        (!call.contains("id") || call["id"].is_string());
    if (!shape) {
      return invalid_argument(
          "'messages[{}].tool_calls[]' must be {{\"id\": string, \"type\": \"function\", "
          "\"function\": {{\"name\": string, \"arguments\": string}}}}",
          index);
    }
    ToolCall parsed;
    if (call.contains("id")) parsed.id = call["id"].get<std::string>();
    parsed.name = call["function"]["name"].get<std::string>();
    parsed.arguments = call["function"]["arguments"].get<std::string>();
    const Json arguments = Json::parse(parsed.arguments, nullptr, /*allow_exceptions=*/false);
    if (arguments.is_discarded() || !arguments.is_object()) {
      return invalid_argument(
          "'messages[{}].tool_calls[].function.arguments' must be the JSON text of an object",
          index);
    }
    calls.push_back(std::move(parsed));
  }
  return calls;
}

Status read_messages(const Json& value, const ProtocolLimits& limits, GenerationRequest& out) {
  if (!value.is_array()) return wrong_type("messages", "an array", value);
  if (value.empty()) return invalid_argument("'messages' must not be empty");
  if (value.size() > static_cast<size_t>(limits.max_messages)) {
    return invalid_argument("'messages' has {} entries, more than the limit of {}", value.size(),
                            limits.max_messages);
  }
  for (size_t index = 0; index < value.size(); ++index) {
    const Json& message = value[index];
    if (!message.is_object()) return wrong_type("messages[]", "an object", message);
    for (const auto& [key, field] : message.items()) {
      if (key != "role" && key != "content" && key != "name" && key != "tool_calls" &&
          key != "tool_call_id" && key != "refusal") {
        return invalid_argument("'messages[{}].{}' is not supported by this server", index, key);
      }
    }
    if (!message.contains("role") || !message["role"].is_string()) {
      return invalid_argument("'messages[{}].role' must be a string", index);
    }
    ChatMessage parsed;
    parsed.role = message["role"].get<std::string>();
    if (parsed.role == "developer") parsed.role = "system";
    if (parsed.role != "system" && parsed.role != "user" && parsed.role != "assistant" &&
        parsed.role != "tool") {
      return invalid_argument(
          "'messages[{}].role' must be system, user, assistant or tool, got '{}'", index,
          parsed.role);
    }
    const bool has_tool_calls = message.contains("tool_calls") && !message["tool_calls"].is_null();
    if (has_tool_calls) {
      if (parsed.role != "assistant") {
        return invalid_argument("'messages[{}].tool_calls' is only for assistant messages", index);
      }
      FOLIO_ASSIGN_OR_RETURN(parsed.tool_calls,
                             read_message_tool_calls(message["tool_calls"], index));
    }
    if (parsed.role == "tool") {
      if (!message.contains("tool_call_id") || !message["tool_call_id"].is_string()) {
        return invalid_argument(
            "'messages[{}].tool_call_id' is required (a string) for a tool message", index);
      }
      parsed.tool_call_id = message["tool_call_id"].get<std::string>();
    } else if (message.contains("tool_call_id")) {
      return invalid_argument("'messages[{}].tool_call_id' is only for tool messages", index);
    }
    // An assistant message that called tools may have no content (absent or null).
    const bool content_optional = has_tool_calls;
    if (!message.contains("content") || message["content"].is_null()) {
      if (!content_optional) {
        return invalid_argument("'messages[{}].content' is required", index);
      }
    } else {
      FOLIO_ASSIGN_OR_RETURN(parsed.content, read_message_content(message["content"], index));
    }
    out.messages.push_back(std::move(parsed));
  }
  return Status();
}

// The checks that look at several fields at once, after every field is read.
Status check_combinations(const Json& body, const ProtocolLimits& limits, GenerationRequest& out) {
  const bool chat = out.endpoint == Endpoint::kChatCompletions;
  const bool has_best_of = body.contains("best_of") && !body["best_of"].is_null();
  if (!has_best_of) out.best_of = out.n;
  if (out.best_of < out.n) {
    return invalid_argument("'best_of' ({}) must be at least 'n' ({})", out.best_of, out.n);
  }
  if (out.stream && out.best_of > out.n) {
    return invalid_argument("'best_of' above 'n' cannot be streamed");
  }
  const int64_t num_prompts = chat ? 1 : static_cast<int64_t>(out.prompts.size());
  if (num_prompts * out.best_of > limits.max_choices) {
    return invalid_argument("{} prompt(s) times {} choices is more than the limit of {}",
                            num_prompts, out.best_of, limits.max_choices);
  }
  if (out.max_tokens == 0 && !out.echo) {
    return invalid_argument("'max_tokens' must be at least 1 (0 is allowed with echo)");
  }
  if (chat) {
    // "logprobs": true turns logprobs on; "top_logprobs" (which needs it) sets the count.
    const bool logprobs_on = body.contains("logprobs") && body["logprobs"] == Json(true);
    const bool has_top = body.contains("top_logprobs") && !body["top_logprobs"].is_null();
    if (has_top && !logprobs_on) {
      return invalid_argument("'top_logprobs' needs 'logprobs' to be true");
    }
    if (!logprobs_on) out.logprobs.reset();
    if (logprobs_on && !out.logprobs.has_value()) out.logprobs = 0;
    const bool has_tool_choice = body.contains("tool_choice") && !body["tool_choice"].is_null();
    if (!has_tool_choice) {
      out.tool_choice.mode = out.tools.empty() ? ToolChoice::Mode::kNone : ToolChoice::Mode::kAuto;
    }
    const ToolChoice::Mode mode = out.tool_choice.mode;
    if ((mode == ToolChoice::Mode::kRequired || mode == ToolChoice::Mode::kFunction) &&
        out.tools.empty()) {
      return invalid_argument("'tool_choice' asks for a tool call but 'tools' is empty");
    }
    if (mode == ToolChoice::Mode::kFunction &&
        std::none_of(out.tools.begin(), out.tools.end(), [&](const ToolDefinition& tool) {
          return tool.name == out.tool_choice.function;
        })) {
      return invalid_argument("'tool_choice' names '{}', which is not among 'tools'",
                              out.tool_choice.function);
    }
    const bool calls_possible = mode != ToolChoice::Mode::kNone && !out.tools.empty();
    if (calls_possible && out.response_format.type != ResponseFormat::Type::kText) {
      return invalid_argument("'response_format' and tool calls cannot be combined");
    }
  }
  return Status();
}

Status parse_fields(Endpoint endpoint, const Json& body, const ProtocolLimits& limits,
                    GenerationRequest& out) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  for (const auto& [key, value] : body.items()) {
    const bool known = contains(kCommonFields, key) ||
                       (chat ? contains(kChatFields, key) : contains(kCompletionFields, key));
    if (!known) return invalid_argument("unrecognized request argument '{}'", key);
    if (contains(kIgnoredFields, key)) continue;
    if (key == "prompt") {
      FOLIO_RETURN_IF_ERROR(read_prompt(value, limits, out));
    } else if (key == "messages") {
      FOLIO_RETURN_IF_ERROR(read_messages(value, limits, out));
    } else {
      FOLIO_RETURN_IF_ERROR(read_common_field(key, value, limits, out));
    }
  }
  if (!body.contains("model") || !body["model"].is_string()) {
    return invalid_argument("'model' is required (a string)");
  }
  if (chat && !body.contains("messages")) return invalid_argument("'messages' is required");
  if (!chat && !body.contains("prompt")) return invalid_argument("'prompt' is required");
  const bool has_stream_options =
      body.contains("stream_options") && !body["stream_options"].is_null();
  if (has_stream_options && !out.stream) {
    return invalid_argument("'stream_options' is only allowed when 'stream' is true");
  }
  return check_combinations(body, limits, out);
}

Json usage_json(int32_t prompt_tokens, int32_t completion_tokens) {
  return Json{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens}};
}

Json chunk_base(Endpoint endpoint, const ResponseHeader& header) {
  return Json{{"id", header.id},
              {"object", endpoint == Endpoint::kChatCompletions ? "chat.completion.chunk"
                                                                : "text_completion"},
              {"created", header.created},
              {"model", header.model}};
}

std::string event(const Json& data) {
  return "data: " + dump(data) + "\n\n";
}

Json model_json(const ModelEntry& model, int64_t created) {
  return Json{{"id", model.id},
              {"object", "model"},
              {"created", created},
              {"owned_by", "folio"},
              {"root", model.root},
              {"parent", model.parent.has_value() ? Json(*model.parent) : Json(nullptr)}};
}

// A request body, which must be a JSON object.
Result<Json> parse_object(std::string_view body) {
  Json parsed = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return invalid_argument("the request body is not valid JSON");
  if (!parsed.is_object()) return invalid_argument("the request body must be a JSON object");
  return parsed;
}

Result<std::string> read_nonempty_string(const Json& value, std::string_view field) {
  if (!value.is_string()) return wrong_type(field, "a string", value);
  std::string text = value.get<std::string>();
  if (text.empty()) return invalid_argument("'{}' must not be empty", field);
  return text;
}

}  // namespace

Result<GenerationRequest> parse_generation_request(Endpoint endpoint, std::string_view body,
                                                   const ProtocolLimits& limits) {
  FOLIO_ASSIGN_OR_RETURN(const Json parsed, parse_object(body));
  GenerationRequest request;
  request.endpoint = endpoint;
  // nlohmann-json throws on type confusion in accessors; every access above checks types
  // first, and this catch is the edge that keeps a missed case a 400, not a crash.
  try {
    FOLIO_RETURN_IF_ERROR(parse_fields(endpoint, parsed, limits, request));
  } catch (const Json::exception& error) {
    return invalid_argument("malformed request: {}", error.what());
  }
  return request;
}

std::string_view openai_finish_reason(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kLength:
      return "length";
    case engine::FinishReason::kStop:
    case engine::FinishReason::kCancelled:
    case engine::FinishReason::kError:
      return "stop";
  }
  return "stop";
}

namespace {

Json bytes_json(std::string_view token) {
  Json bytes = Json::array();
  for (char byte : token) bytes.push_back(static_cast<int>(static_cast<unsigned char>(byte)));
  return bytes;
}

// Chat's logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}],
// "refusal": null}. A token without a logprob (never produced for chat) is shown as 0.
Json chat_logprobs_json(std::span<const TokenLogprob> tokens) {
  Json content = Json::array();
  for (const TokenLogprob& entry : tokens) {
    Json top = Json::array();
    for (const auto& [token, logprob] : entry.top) {
      top.push_back(Json{{"token", token}, {"logprob", logprob}, {"bytes", bytes_json(token)}});
    }
    content.push_back(Json{{"token", entry.token},
                           {"logprob", entry.logprob.value_or(0.0)},
                           {"bytes", bytes_json(entry.token)},
                           {"top_logprobs", std::move(top)}});
  }
  return Json{{"content", std::move(content)}, {"refusal", nullptr}};
}

// Completions' logprobs: parallel arrays; text_offset is each token's byte offset in the
// concatenation of the tokens' texts, starting at `first_offset`.
Json completion_logprobs_json(std::span<const TokenLogprob> tokens, size_t first_offset) {
  Json texts = Json::array(), logprobs = Json::array(), tops = Json::array(),
       offsets = Json::array();
  size_t offset = first_offset;
  for (const TokenLogprob& entry : tokens) {
    texts.push_back(entry.token);
    logprobs.push_back(entry.logprob.has_value() ? Json(*entry.logprob) : Json(nullptr));
    if (entry.logprob.has_value()) {
      Json top = Json::object();
      for (const auto& [token, logprob] : entry.top) top[token] = logprob;
      tops.push_back(std::move(top));
    } else {
      tops.push_back(nullptr);
    }
    offsets.push_back(offset);
    offset += entry.token.size();
  }
  return Json{{"tokens", std::move(texts)},
              {"token_logprobs", std::move(logprobs)},
              {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offsets)}};
}

Json tool_call_json(const ToolCall& call) {
  return Json{{"id", call.id},
              {"type", "function"},
              {"function", Json{{"name", call.name}, {"arguments", call.arguments}}}};
}

std::string_view choice_finish_reason(const ChoiceResult& choice) {
  if (!choice.tool_calls.empty()) return "tool_calls";
  return openai_finish_reason(choice.reason);
}

}  // namespace

std::string format_response(Endpoint endpoint, const ResponseHeader& header,
                            const ResponseBody& body) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  Json choices = Json::array();
  for (const ChoiceResult& result : body.choices) {
    Json choice{{"index", result.index},
                {"logprobs", nullptr},
                {"finish_reason", choice_finish_reason(result)}};
    if (chat) {
      Json message{{"role", "assistant"}, {"content", result.text}};
      if (!result.tool_calls.empty()) {
        if (result.text.empty()) message["content"] = nullptr;
        Json calls = Json::array();
        for (const ToolCall& call : result.tool_calls) calls.push_back(tool_call_json(call));
        message["tool_calls"] = std::move(calls);
      }
      choice["message"] = std::move(message);
      if (result.has_logprobs) choice["logprobs"] = chat_logprobs_json(result.logprobs);
    } else {
      choice["text"] = result.text;
      if (result.has_logprobs) choice["logprobs"] = completion_logprobs_json(result.logprobs, 0);
    }
    choices.push_back(std::move(choice));
  }
  Json response{{"id", header.id},
                {"object", chat ? "chat.completion" : "text_completion"},
                {"created", header.created},
                {"model", header.model},
                {"choices", std::move(choices)},
                {"usage", usage_json(body.prompt_tokens, body.completion_tokens)}};
  return dump(response);
}

std::string format_response(Endpoint endpoint, const ResponseHeader& header,
                            const GenerationResult& result) {
  ResponseBody body;
  body.choices.push_back(ChoiceResult{});
  body.choices[0].text = result.text;
  body.choices[0].reason = result.reason;
  body.prompt_tokens = result.prompt_tokens;
  body.completion_tokens = result.completion_tokens;
  return format_response(endpoint, header, body);
}

std::string format_chunk(Endpoint endpoint, const ResponseHeader& header,
                         const ChoiceDelta& delta) {
  Json data = chunk_base(endpoint, header);
  Json choice{{"index", delta.index}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (endpoint == Endpoint::kChatCompletions) {
    Json content{{"content", delta.text}};
    if (delta.first) content["role"] = "assistant";
    if (!delta.tool_calls.empty()) {
      Json calls = Json::array();
      for (size_t i = 0; i < delta.tool_calls.size(); ++i) {
        Json call = tool_call_json(delta.tool_calls[i]);
        call["index"] = delta.first_tool_call + static_cast<int32_t>(i);
        calls.push_back(std::move(call));
      }
      content["tool_calls"] = std::move(calls);
      if (delta.text.empty()) content["content"] = nullptr;
    }
    choice["delta"] = std::move(content);
    if (delta.has_logprobs) choice["logprobs"] = chat_logprobs_json(delta.logprobs);
  } else {
    choice["text"] = delta.text;
    if (delta.has_logprobs) choice["logprobs"] = completion_logprobs_json(delta.logprobs, 0);
  }
  data["choices"] = Json::array({std::move(choice)});
  return event(data);
}

std::string format_text_chunk(Endpoint endpoint, const ResponseHeader& header,
                              std::string_view text, bool first) {
  ChoiceDelta delta;
  delta.text = text;
  delta.first = first;
  return format_chunk(endpoint, header, delta);
}

std::string format_finish_chunk(Endpoint endpoint, const ResponseHeader& header, int32_t index,
                                engine::FinishReason reason, bool called_tools) {
  Json data = chunk_base(endpoint, header);
  Json choice{{"index", index},
              {"logprobs", nullptr},
              {"finish_reason", called_tools ? "tool_calls" : openai_finish_reason(reason)}};
  if (endpoint == Endpoint::kChatCompletions) {
    choice["delta"] = Json::object();
  } else {
    choice["text"] = "";
  }
  data["choices"] = Json::array({std::move(choice)});
  return event(data);
}

std::string format_finish_chunk(Endpoint endpoint, const ResponseHeader& header,
                                engine::FinishReason reason) {
  return format_finish_chunk(endpoint, header, 0, reason, /*called_tools=*/false);
}

std::string format_usage_chunk(Endpoint endpoint, const ResponseHeader& header,
                               int32_t prompt_tokens, int32_t completion_tokens) {
  Json data = chunk_base(endpoint, header);
  data["choices"] = Json::array();
  data["usage"] = usage_json(prompt_tokens, completion_tokens);
  return event(data);
}

std::string format_usage_chunk(Endpoint endpoint, const ResponseHeader& header,
                               const GenerationResult& result) {
  return format_usage_chunk(endpoint, header, result.prompt_tokens, result.completion_tokens);
}

std::string format_error_body(std::string_view message, std::string_view type,
                              std::string_view code) {
  Json error{{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!code.empty()) error["code"] = code;
  return dump(Json{{"error", std::move(error)}});
}

std::string format_error_event(std::string_view message, std::string_view type) {
  return "data: " + format_error_body(message, type) + "\n\n";
}

std::string format_model(const ModelEntry& model, int64_t created) {
  return dump(model_json(model, created));
}

std::string format_model_list(const std::vector<ModelEntry>& models, int64_t created) {
  Json data = Json::array();
  for (const ModelEntry& model : models) data.push_back(model_json(model, created));
  return dump(Json{{"object", "list"}, {"data", std::move(data)}});
}

std::string format_deleted_model(std::string_view id) {
  return dump(Json{{"id", id}, {"object", "model"}, {"deleted", true}});
}

Result<LoadAdapterRequest> parse_load_adapter_request(std::string_view body) {
  FOLIO_ASSIGN_OR_RETURN(const Json parsed, parse_object(body));
  LoadAdapterRequest request;
  for (const auto& [key, value] : parsed.items()) {
    if (key == "lora_name") {
      FOLIO_ASSIGN_OR_RETURN(request.name, read_nonempty_string(value, key));
    } else if (key == "lora_path") {
      FOLIO_ASSIGN_OR_RETURN(request.path, read_nonempty_string(value, key));
    } else if (key == "scale") {
      FOLIO_ASSIGN_OR_RETURN(request.scale, read_float(value, key, -1e6, 1e6));
    } else {
      return invalid_argument("unrecognized request argument '{}'", key);
    }
  }
  if (request.name.empty()) return invalid_argument("'lora_name' is required (a string)");
  if (request.path.empty()) return invalid_argument("'lora_path' is required (a string)");
  return request;
}

Result<std::string> parse_unload_adapter_request(std::string_view body) {
  FOLIO_ASSIGN_OR_RETURN(const Json parsed, parse_object(body));
  std::string name;
  for (const auto& [key, value] : parsed.items()) {
    if (key == "lora_name") {
      FOLIO_ASSIGN_OR_RETURN(name, read_nonempty_string(value, key));
    } else if (key != "lora_int_id") {
      return invalid_argument("unrecognized request argument '{}'", key);
    }
  }
  if (name.empty()) return invalid_argument("'lora_name' is required (a string)");
  return name;
}

Result<TokenizeRequest> parse_tokenize_request(std::string_view body,
                                               const ProtocolLimits& limits) {
  FOLIO_ASSIGN_OR_RETURN(const Json parsed, parse_object(body));
  TokenizeRequest request;
  try {
    for (const auto& [key, value] : parsed.items()) {
      if (key == "model") {
        if (value.is_null()) continue;
        if (!value.is_string()) return wrong_type(key, "a string", value);
        request.model = value.get<std::string>();
      } else if (key == "prompt") {
        if (!value.is_string()) return wrong_type(key, "a string", value);
        request.prompt = value.get<std::string>();
      } else if (key == "messages") {
        GenerationRequest conversation;
        conversation.endpoint = Endpoint::kChatCompletions;
        FOLIO_RETURN_IF_ERROR(read_messages(value, limits, conversation));
        request.messages = std::move(conversation.messages);
      } else if (key == "add_special_tokens") {
        FOLIO_ASSIGN_OR_RETURN(request.add_special_tokens, read_bool(value, key));
      } else if (key == "add_generation_prompt") {
        FOLIO_ASSIGN_OR_RETURN(request.add_generation_prompt, read_bool(value, key));
      } else {
        return invalid_argument("unrecognized request argument '{}'", key);
      }
    }
  } catch (const Json::exception& error) {
    return invalid_argument("malformed request: {}", error.what());
  }
  if (request.prompt.has_value() == parsed.contains("messages")) {
    return invalid_argument("give exactly one of 'prompt' and 'messages'");
  }
  return request;
}

std::string format_tokenize_response(std::span<const int32_t> tokens, int32_t max_model_len) {
  return dump(Json{{"count", tokens.size()},
                   {"max_model_len", max_model_len},
                   {"tokens", std::vector<int32_t>(tokens.begin(), tokens.end())}});
}

Result<DetokenizeRequest> parse_detokenize_request(std::string_view body,
                                                   const ProtocolLimits& limits) {
  FOLIO_ASSIGN_OR_RETURN(const Json parsed, parse_object(body));
  DetokenizeRequest request;
  bool has_tokens = false;
  for (const auto& [key, value] : parsed.items()) {
    if (key == "model") {
      if (value.is_null()) continue;
      if (!value.is_string()) return wrong_type(key, "a string", value);
      request.model = value.get<std::string>();
    } else if (key == "tokens") {
      if (!value.is_array()) return wrong_type(key, "an array of token ids", value);
      has_tokens = true;
      if (value.empty()) continue;  // detokenizes to ""
      FOLIO_ASSIGN_OR_RETURN(request.tokens, read_token_ids(value, "tokens", limits));
    } else {
      return invalid_argument("unrecognized request argument '{}'", key);
    }
  }
  if (!has_tokens) return invalid_argument("'tokens' is required (an array of token ids)");
  return request;
}

std::string format_detokenize_response(std::string_view text) {
  return dump(Json{{"prompt", text}});
}

}  // namespace folio::server
