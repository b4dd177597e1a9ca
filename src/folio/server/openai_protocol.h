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
// not implement (suffix, audio, ...) is a kInvalidArgument whose message names the field; the
// server answers it with 400 and an OpenAI-style error body. Fields that only describe the
// caller (user, metadata, store) are accepted and ignored; any other unknown field is rejected,
// since silently ignoring a field the caller relies on would change the answer without telling
// them. Extensions beyond OpenAI's fields, as vLLM names them: top_k, min_p,
// repetition_penalty, ignore_eos.
//
// Logprobs are the model's own: log softmax of its logits for the position, before logit bias,
// structured-output masks, penalties and temperature (engine/request.h), so that echo's prompt
// logprobs sum to what `folio perplexity` computes for the same tokens.
//
// Parsing never throws: JSON errors from nlohmann-json are caught here and become Status.
// Every formatter emits valid UTF-8 JSON (invalid bytes, which the engine never produces,
// would become U+FFFD rather than an exception).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
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

// tool_choice: whether, and which, tool the model must call.
struct ToolChoice {
  enum class Mode : uint8_t {
    kNone,      // no calls (the tools are still shown to the model, as the templates do)
    kAuto,      // the model decides: text or calls
    kRequired,  // at least one call
    kFunction,  // exactly a call of `function`
  };
  Mode mode = Mode::kAuto;
  std::string function;  // kFunction: its name, one of the request's tools
};

// response_format.
struct ResponseFormat {
  enum class Type : uint8_t {
    kText,        // no constraint
    kJsonObject,  // any JSON object
    kJsonSchema,  // a value valid against `schema`
  };
  Type type = Type::kText;
  std::string name;    // json_schema.name
  std::string schema;  // json_schema.schema as JSON text ("{}" when absent)
  bool strict = false;
};

// One prompt of a completions request: text, or token ids (then `text` is empty).
struct CompletionPrompt {
  std::string text;
  std::vector<int32_t> tokens;
};

inline constexpr int32_t kMaxRequestPriority = 1'000'000;

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  // Completions: one or more prompts ("prompt" as a string, token ids, a list of strings or a
  // list of token id lists). Each gets `n` choices; choice indices run prompt by prompt.
  std::vector<CompletionPrompt> prompts;
  // Chat completions: at least one message.
  std::vector<ChatMessage> messages;
  // Absent: the endpoint's default (completions: ProtocolLimits::default_max_tokens; chat: the
  // rest of the context, up to ProtocolLimits::max_tokens). Completions with echo may ask for 0.
  std::optional<int32_t> max_tokens;
  engine::SamplingParams sampling;  // OpenAI's default temperature is 1
  // logit_bias: token id -> bias in [-100, 100], ascending by token (ids checked against the
  // vocabulary by the server).
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::vector<std::string> stop;  // at most 4 non-empty strings
  bool ignore_eos = false;
  // vLLM's convention: lower runs first (admitted earlier, preempted later); absent: the
  // server's default (ServerOptions::default_priority). In [-kMaxRequestPriority,
  // kMaxRequestPriority].
  std::optional<int32_t> priority;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  // Choices per prompt, and (completions) how many are generated to pick the `n` with the
  // highest cumulative logprob from; best_of >= n, and streaming needs best_of == n.
  int32_t n = 1;
  int32_t best_of = 1;
  // Absent: no logprobs. Otherwise how many alternatives each token lists (0: only the chosen
  // token's). Completions: "logprobs": k; chat: "logprobs": true with "top_logprobs": k.
  std::optional<int32_t> logprobs;
  // Completions: the prompt is returned in front of the text (with its tokens' logprobs when
  // logprobs are asked; the first prompt token has none).
  bool echo = false;
  ResponseFormat response_format;     // chat
  std::vector<ToolDefinition> tools;  // chat; unique names
  ToolChoice tool_choice;             // chat; kAuto when tools are given, else kNone
  bool parallel_tool_calls = true;
};

// Bounds applied while parsing (the context-dependent checks happen once the prompt is
// tokenized, in the server).
struct ProtocolLimits {
  int32_t max_tokens = 4096;         // a larger max_tokens is rejected
  int32_t default_max_tokens = 16;   // completions without max_tokens (OpenAI's default)
  int32_t max_messages = 1024;       // chat messages per request
  int32_t max_prompt_token_ids = 0;  // 0: no limit at parse time (the server checks later)
  int32_t max_choices = 16;          // n and best_of, times the number of prompts
  int32_t max_prompts = 64;          // prompts in one completions request
  int32_t max_logprobs = 20;         // alternatives per token
  int32_t max_tools = 128;
};

// Parses a request body for `endpoint`. kInvalidArgument naming the field on malformed JSON, a
// body that is not an object, a missing or mistyped field, a value out of range, an empty
// prompt or message list, an unsupported or unknown field.
Result<GenerationRequest> parse_generation_request(Endpoint endpoint, std::string_view body,
                                                   const ProtocolLimits& limits);

// What the engine produced for one single-choice request, as the formatters need it.
struct GenerationResult {
  std::string text;
  engine::FinishReason reason = engine::FinishReason::kStop;
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
};

// One token with its logprob and the most likely alternatives, as the answer shows them.
// `token` holds the token's bytes, which may be part of a UTF-8 character: the formatters
// write invalid bytes as U+FFFD in the text fields and the exact bytes in chat's "bytes".
struct TokenLogprob {
  std::string token;
  std::optional<double> logprob;                    // nullopt: the first token of an echoed prompt
  std::vector<std::pair<std::string, double>> top;  // most likely first
};

// One choice of an answer.
struct ChoiceResult {
  int32_t index = 0;
  std::string text;  // completions with echo: the prompt's text in front
  engine::FinishReason reason = engine::FinishReason::kStop;
  std::vector<ToolCall> tool_calls;  // chat: non-empty -> content null, "tool_calls" finish
  bool has_logprobs = false;         // the request asked for logprobs
  std::vector<TokenLogprob> logprobs;
};

// A whole answer: its choices (ascending index) and the usage over all of them.
struct ResponseBody {
  std::vector<ChoiceResult> choices;
  int32_t prompt_tokens = 0;      // counted once per prompt
  int32_t completion_tokens = 0;  // over every returned choice
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
                            const ResponseBody& body);
// A single choice's answer.
std::string format_response(Endpoint endpoint, const ResponseHeader& header,
                            const GenerationResult& result);

// What one streamed event carries for one choice.
struct ChoiceDelta {
  int32_t index = 0;
  std::string_view text;
  bool first = false;  // chat: the first event of the choice carries the role
  // The tokens whose text this event carries (when the request asked for logprobs; an event
  // with logprobs and no text is valid: text held back by a stop string or a partial UTF-8
  // character comes in a later event).
  bool has_logprobs = false;
  std::span<const TokenLogprob> logprobs;
  // Chat: calls completed in this event; `first_tool_call` is the index of the first of them
  // among the choice's calls.
  std::span<const ToolCall> tool_calls;
  int32_t first_tool_call = 0;
};
std::string format_chunk(Endpoint endpoint, const ResponseHeader& header, const ChoiceDelta& delta);
// One "data: {...}\n\n" event carrying `text` for choice 0 (chat: the first chunk also carries
// the role).
std::string format_text_chunk(Endpoint endpoint, const ResponseHeader& header,
                              std::string_view text, bool first);
// The event that ends a choice with its finish reason (empty delta / empty text);
// `called_tools`: chat's "tool_calls" finish.
std::string format_finish_chunk(Endpoint endpoint, const ResponseHeader& header, int32_t index,
                                engine::FinishReason reason, bool called_tools);
std::string format_finish_chunk(Endpoint endpoint, const ResponseHeader& header,
                                engine::FinishReason reason);
// The extra last event of stream_options.include_usage: no choices, the usage.
std::string format_usage_chunk(Endpoint endpoint, const ResponseHeader& header,
                               int32_t prompt_tokens, int32_t completion_tokens);
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

// POST /tokenize (vLLM's shape): {"model"?, "prompt": string, "add_special_tokens"?} or
// {"model"?, "messages": [...], "add_generation_prompt"?} (a conversation is rendered through
// the chat template first; special tokens are then parsed from the text, never added).
struct TokenizeRequest {
  std::string model;  // empty: the base model
  std::optional<std::string> prompt;
  std::vector<ChatMessage> messages;  // when prompt is absent; non-empty
  bool add_special_tokens = true;     // prompt: BOS as the vocabulary asks
  bool add_generation_prompt = true;  // messages: end with the assistant's turn opening
};
// kInvalidArgument naming the field: malformed JSON, neither or both of prompt and messages,
// wrong types, an unknown field.
Result<TokenizeRequest> parse_tokenize_request(std::string_view body, const ProtocolLimits& limits);
// {"count", "max_model_len", "tokens"}.
std::string format_tokenize_response(std::span<const int32_t> tokens, int32_t max_model_len);

// POST /detokenize: {"model"?, "tokens": [ids]} -> {"prompt": text}.
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;  // ids >= 0 (the server checks them against the vocabulary)
};
Result<DetokenizeRequest> parse_detokenize_request(std::string_view body,
                                                   const ProtocolLimits& limits);
std::string format_detokenize_response(std::string_view text);

}  // namespace folio::server
