#include "folio/server/openai_protocol.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

namespace folio::server {
namespace {

using Json = nlohmann::json;

// Fields accepted and ignored: they describe the caller and change no token of the answer.
constexpr std::array<std::string_view, 4> kIgnoredFields = {"user", "metadata", "store",
                                                            "service_tier"};
constexpr std::array<std::string_view, 20> kCommonFields = {"model",
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

Status read_common_field(std::string_view key, const Json& value, const ProtocolLimits& limits,
                         GenerationRequest& out) {
  if (value.is_null()) return Status();  // OpenAI's clients send null for "not given"
  if (key == "model") {
    if (!value.is_string()) return wrong_type(key, "a string", value);
    out.model = value.get<std::string>();
  } else if (key == "max_tokens" || key == "max_completion_tokens") {
    FOLIO_ASSIGN_OR_RETURN(int64_t max_tokens, read_integer(value, key, 1, limits.max_tokens));
    out.max_tokens = static_cast<int32_t>(max_tokens);
  } else if (key == "n" || key == "best_of") {
    FOLIO_ASSIGN_OR_RETURN(int64_t count, read_integer(value, key, 1, 1));
    static_cast<void>(count);
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
  } else if (key == "logit_bias") {
    if (!value.is_object()) return wrong_type(key, "an object", value);
    FOLIO_RETURN_IF_ERROR(require_default(value, key, value.empty()));
  } else if (key == "logprobs") {
    const bool off = (value.is_boolean() && !value.get<bool>()) ||
                     (value.is_number_integer() && value.get<int64_t>() == 0);
    FOLIO_RETURN_IF_ERROR(require_default(value, key, off));
  } else if (key == "echo") {
    FOLIO_RETURN_IF_ERROR(require_default(value, key, value.is_boolean() && !value.get<bool>()));
  } else if (key == "suffix") {
    FOLIO_RETURN_IF_ERROR(require_default(value, key, value == Json("")));
  } else if (key == "top_logprobs") {
    FOLIO_RETURN_IF_ERROR(require_default(value, key, false));
  } else if (key == "tools") {
    FOLIO_RETURN_IF_ERROR(require_default(value, key, value.is_array() && value.empty()));
  } else if (key == "tool_choice") {
    FOLIO_RETURN_IF_ERROR(require_default(value, key, value == Json("none")));
  } else if (key == "response_format") {
    const bool text = value.is_object() && value.size() == 1 && value.contains("type") &&
                      value["type"] == Json("text");
    FOLIO_RETURN_IF_ERROR(require_default(value, key, text));
  } else {
    return read_sampling_field(key, value, out);
  }
  return Status();
}

Status read_prompt(const Json& value, const ProtocolLimits& limits, GenerationRequest& out) {
  if (value.is_string()) {
    out.prompt_text = value.get<std::string>();
    return Status();
  }
  if (!value.is_array()) {
    return wrong_type("prompt", "a string or an array of token ids", value);
  }
  const Json* tokens = &value;
  if (value.size() == 1 && value[0].is_string()) {
    out.prompt_text = value[0].get<std::string>();
    return Status();
  }
  if (value.size() == 1 && value[0].is_array()) tokens = &value[0];
  if (tokens->empty()) return invalid_argument("'prompt' must not be empty");
  if (!(*tokens)[0].is_number()) {
    return invalid_argument(
        "'prompt' arrays must hold one string or token ids (one prompt "
        "per request)");
  }
  if (limits.max_prompt_token_ids > 0 &&
      tokens->size() > static_cast<size_t>(limits.max_prompt_token_ids)) {
    return invalid_argument("'prompt' has {} token ids, more than the limit of {}", tokens->size(),
                            limits.max_prompt_token_ids);
  }
  for (const Json& token : *tokens) {
    FOLIO_ASSIGN_OR_RETURN(int64_t id,
                           read_integer(token, "prompt[]", 0, std::numeric_limits<int32_t>::max()));
    out.prompt_tokens.push_back(static_cast<int32_t>(id));
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
      if (key != "role" && key != "content" && key != "name") {
        return invalid_argument("'messages[{}].{}' is not supported by this server", index, key);
      }
    }
    if (!message.contains("role") || !message["role"].is_string()) {
      return invalid_argument("'messages[{}].role' must be a string", index);
    }
    ChatMessage parsed;
    parsed.role = message["role"].get<std::string>();
    if (parsed.role == "developer") parsed.role = "system";
    if (parsed.role != "system" && parsed.role != "user" && parsed.role != "assistant") {
      return invalid_argument("'messages[{}].role' must be system, user or assistant, got '{}'",
                              index, parsed.role);
    }
    if (!message.contains("content")) {
      return invalid_argument("'messages[{}].content' is required", index);
    }
    FOLIO_ASSIGN_OR_RETURN(parsed.content, read_message_content(message["content"], index));
    out.messages.push_back(std::move(parsed));
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
    if (contains(kIgnoredFields, key) || key == "parallel_tool_calls") continue;
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
  return Status();
}

Json usage_json(const GenerationResult& result) {
  return Json{{"prompt_tokens", result.prompt_tokens},
              {"completion_tokens", result.completion_tokens},
              {"total_tokens", result.prompt_tokens + result.completion_tokens}};
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

std::string format_response(Endpoint endpoint, const ResponseHeader& header,
                            const GenerationResult& result) {
  Json choice{
      {"index", 0}, {"logprobs", nullptr}, {"finish_reason", openai_finish_reason(result.reason)}};
  const bool chat = endpoint == Endpoint::kChatCompletions;
  if (chat) {
    choice["message"] = Json{{"role", "assistant"}, {"content", result.text}};
  } else {
    choice["text"] = result.text;
  }
  Json response{{"id", header.id},
                {"object", chat ? "chat.completion" : "text_completion"},
                {"created", header.created},
                {"model", header.model},
                {"choices", Json::array({choice})},
                {"usage", usage_json(result)}};
  return dump(response);
}

std::string format_text_chunk(Endpoint endpoint, const ResponseHeader& header,
                              std::string_view text, bool first) {
  Json data = chunk_base(endpoint, header);
  Json choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (endpoint == Endpoint::kChatCompletions) {
    Json delta{{"content", text}};
    if (first) delta["role"] = "assistant";
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = text;
  }
  data["choices"] = Json::array({std::move(choice)});
  return event(data);
}

std::string format_finish_chunk(Endpoint endpoint, const ResponseHeader& header,
                                engine::FinishReason reason) {
  Json data = chunk_base(endpoint, header);
  Json choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", openai_finish_reason(reason)}};
  if (endpoint == Endpoint::kChatCompletions) {
    choice["delta"] = Json::object();
  } else {
    choice["text"] = "";
  }
  data["choices"] = Json::array({std::move(choice)});
  return event(data);
}

std::string format_usage_chunk(Endpoint endpoint, const ResponseHeader& header,
                               const GenerationResult& result) {
  Json data = chunk_base(endpoint, header);
  data["choices"] = Json::array();
  data["usage"] = usage_json(result);
  return event(data);
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

}  // namespace folio::server
