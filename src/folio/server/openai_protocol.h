// The OpenAI wire protocol: request bodies of POST /v1/completions and /v1/chat/completions
// parsed and validated into a GenerationRequest, and the JSON the server answers with
// (responses, server-sent-event chunks, error bodies, the model list), and the bodies of the
// adapter routes POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's shape).
//
// Terms. A *completion* continues a prompt (a string, or one array of token ids); a *chat
// completion* continues a conversation of messages rendered through a chat template
// (chat_template.h). A *chunk* is one server-sent event of a streamed answer ("data: {...}\n\n");
// a stream ends with "data: [DONE]\n\n". *Usage* counts prompt and generated tokens.
//
// Validation follows the OpenAI API: a wrong type, a value out of range, or a field Folio does
// not implement (n > 1, logprobs, echo, tools, logit_bias, ...) is a kInvalidArgument whose
// message names the field; the server answers it with 400 and an OpenAI-style error body.
// Fields that only describe the caller (user, metadata, store) are accepted and ignored; any
// other unknown field is rejected, since silently ignoring a field the caller relies on would
// change the answer without telling them. Extensions beyond OpenAI's fields, as vLLM names
// them: top_k, min_p, repetition_penalty, ignore_eos.
//
// Parsing never throws: JSON errors from nlohmann-json are caught here and become Status.
// Every formatter emits valid UTF-8 JSON (invalid bytes, which the engine never produces,
// would become U+FFFD rather than an exception).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "folio/base/result.h"
#include "folio/engine/request.h"
#include "folio/engine/sampling_params.h"

namespace folio::server {

enum class Endpoint : uint8_t { kCompletions, kChatCompletions };

// One call of a tool the model made: `arguments` is the JSON text of the arguments object.
struct ToolCall {
  std::string id;  // "call_..." as the response named it
  std::string name;
  std::string arguments;
};

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string role, std::string content)
      : role(std::move(role)), content(std::move(content)) {}

  // "system", "user", "assistant" or "tool" ("developer" is read as "system").
  std::string role;
  std::string content;
  std::vector<ToolCall> tool_calls;  // assistant: the calls it made (content may be empty)
  std::string tool_call_id;          // tool: the call whose result this is
};

// A function the model may call (`tools: [{"type": "function", "function": {...}}]`).
struct ToolDefinition {
  std::string name;
  std::string description;
  std::string parameters_schema = "{}";  // JSON Schema text of the arguments object
};

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  // Completions: the prompt as text, or as token ids (then prompt_text is empty).
  std::string prompt_text;
  std::vector<int32_t> prompt_tokens;
  // Chat completions: at least one message.
  std::vector<ChatMessage> messages;
  // Absent: the endpoint's default (completions: ProtocolLimits::default_max_tokens; chat: the
  // rest of the context, up to ProtocolLimits::max_tokens).
  std::optional<int32_t> max_tokens;
  engine::SamplingParams sampling;  // OpenAI's default temperature is 1
  std::vector<std::string> stop;    // at most 4 non-empty strings
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
};

// Bounds applied while parsing (the context-dependent checks happen once the prompt is
// tokenized, in the server).
struct ProtocolLimits {
  int32_t max_tokens = 4096;         // a larger max_tokens is rejected
  int32_t default_max_tokens = 16;   // completions without max_tokens (OpenAI's default)
  int32_t max_messages = 1024;       // chat messages per request
  int32_t max_prompt_token_ids = 0;  // 0: no limit at parse time (the server checks later)
};

// Parses a request body for `endpoint`. kInvalidArgument naming the field on malformed JSON, a
// body that is not an object, a missing or mistyped field, a value out of range, an empty
// prompt or message list, an unsupported or unknown field.
Result<GenerationRequest> parse_generation_request(Endpoint endpoint, std::string_view body,
                                                   const ProtocolLimits& limits);

// What the engine produced for one request, as the formatters need it.
struct GenerationResult {
  std::string text;
  engine::FinishReason reason = engine::FinishReason::kStop;
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
};

// Identity of one answer: the same in every chunk of a stream.
struct ResponseHeader {
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// "stop" or "length" (a cancelled request reports "stop"; errors never reach here).
std::string_view openai_finish_reason(engine::FinishReason reason);

std::string format_response(Endpoint endpoint, const ResponseHeader& header,
                            const GenerationResult& result);
// One "data: {...}\n\n" event carrying `text` (chat: the first chunk also carries the role).
std::string format_text_chunk(Endpoint endpoint, const ResponseHeader& header,
                              std::string_view text, bool first);
// The event that ends the choice with its finish reason (empty delta / empty text).
std::string format_finish_chunk(Endpoint endpoint, const ResponseHeader& header,
                                engine::FinishReason reason);
// The extra last event of stream_options.include_usage: no choices, the usage.
std::string format_usage_chunk(Endpoint endpoint, const ResponseHeader& header,
                               const GenerationResult& result);
inline constexpr std::string_view kStreamDone = "data: [DONE]\n\n";

// OpenAI error types.
inline constexpr std::string_view kInvalidRequestError = "invalid_request_error";
inline constexpr std::string_view kAuthenticationError = "authentication_error";
inline constexpr std::string_view kRateLimitError = "rate_limit_error";
inline constexpr std::string_view kServerError = "server_error";

// {"error": {"message", "type", "param": null, "code"}}; an empty code is rendered as null.
std::string format_error_body(std::string_view message, std::string_view type,
                              std::string_view code = {});
// The same error as one server-sent event (for a stream that already answered 200).
std::string format_error_event(std::string_view message, std::string_view type);

// A model the server answers to, as GET /v1/models lists it. OpenAI's legacy fields say where
// a model comes from: `root` the model it descends from, `parent` the one it was made from
// (null for a base model). For a LoRA adapter both are the base model's served name; file
// paths are never shown to clients.
struct ModelEntry {
  std::string id;
  std::string root;
  std::optional<std::string> parent;  // nullopt: a base model
};

// {"id", "object": "model", "created", "owned_by": "folio", "root", "parent"}.
std::string format_model(const ModelEntry& model, int64_t created);
// {"object": "list", "data": [model, ...]}.
std::string format_model_list(const std::vector<ModelEntry>& models, int64_t created);
// {"id", "object": "model", "deleted": true}, as OpenAI answers a deleted model.
std::string format_deleted_model(std::string_view id);

// POST /v1/load_lora_adapter: {"lora_name", "lora_path", "scale"?} (vLLM's fields; the scale,
// 1 when absent, multiplies the adapter's alpha / rank as --lora NAME=PATH:SCALE does).
struct LoadAdapterRequest {
  std::string name;
  std::string path;
  float scale = 1.0f;
};
// kInvalidArgument naming the field: malformed JSON, a missing or empty name or path, a scale
// that is not a number in [-1e6, 1e6], an unknown field.
Result<LoadAdapterRequest> parse_load_adapter_request(std::string_view body);
// POST /v1/unload_lora_adapter: {"lora_name"} (vLLM's "lora_int_id" is accepted and ignored:
// adapters are named, and an id a vLLM client remembers means nothing here). Returns the name.
Result<std::string> parse_unload_adapter_request(std::string_view body);

}  // namespace folio::server
