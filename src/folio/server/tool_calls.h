// Tool calls in a model's output: the literal envelope a chat template family writes a call in,
// the JSON Schema a call's object must satisfy (for a grammar that constrains generation), and
// parsing calls back out of generated text, whole or streamed.
//
// Terms. A *call* is one JSON object naming a function and its arguments, as the template taught
// the model to write it. Its *envelope* is the literal text around it (chatml: "<tool_call>\n"
// before and "\n</tool_call>" after; llama3.1: none, the object is the whole answer). The
// *trigger* is the text whose appearance means a call has begun ("<tool_call>"; llama3.1: a "{"
// opening the answer). *Content* is the generated text outside the calls, which the client
// receives as the message's content.
//
// Envelopes, by family (chat_template.h renders the prompts that teach them):
//   chatml    <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>, any number, anywhere
//             in the answer (Qwen 2.5, Qwen 3, Hermes 2 Pro / 3, which writes "arguments" first)
//   llama3.1  {"name": "f", "parameters": {...}} as the whole answer, one call (an optional
//             "<|python_tag|>" before it, as Llama sometimes writes, is accepted)
//
// Parsing rules (the same for whole text and streams, so a streamed answer's content deltas
// concatenate to the whole answer's content, and its calls are the same):
//   - a call's JSON must be an object with a string "name" (non-empty) and an object for the
//     arguments, under "arguments" or "parameters" in either family; absent arguments are {}.
//     The arguments are returned as compact JSON text, keys in the model's order.
//   - a malformed call (bad JSON, a missing name, an unterminated envelope) stays in the
//     content, verbatim; parsing never fails and never throws.
//   - whitespace between content and a call, between calls and after the last call is not
//     content (the model separates them with newlines); an answer without calls is its content
//     exactly.
//   - calls carry no id: the caller names them (make_tool_call_id).
//
// Thread-safety: free functions are pure; a ToolCallStreamSplitter is used by one thread at a
// time (one per streamed request).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "folio/base/result.h"
#include "folio/server/chat_template.h"
#include "folio/server/grammar.h"
#include "folio/server/openai_protocol.h"

namespace folio::server {

// How a family's model writes a call, for building a grammar around the call's JSON object.
struct ToolCallFormat {
  std::string call_prefix;      // literal text before each call's object ("<tool_call>\n")
  std::string call_suffix;      // literal text after it ("\n</tool_call>")
  std::string call_separator;   // between consecutive calls ("\n"); unused without multiple_calls
  std::string trigger;          // the text announcing a call ("<tool_call>"; llama3.1: "{")
  std::string arguments_key;    // "arguments" (chatml) or "parameters" (llama3.1)
  bool multiple_calls = false;  // whether one answer may hold several calls
  bool call_is_whole_answer = false;  // llama3.1: an answer is either text or exactly one call
};

// kInvalidArgument for a family without tool calling (chat_template_supports_tools).
Result<ToolCallFormat> tool_call_format(ChatTemplate chat_template);

// When the server constrains generation with the call schema.
enum class ToolCallConstraint : uint8_t {
  kNone,          // tool_choice "none": text only, no calls parsed
  kAfterTrigger,  // "auto": free text; once the trigger is generated, the call's object (and the
                  // rest of its envelope) is constrained
  kFromStart,     // "required" or a named function: the answer is prefix + object + suffix
                  // (repeated, separated, where multiple_calls), nothing else
};

// Everything the server needs to offer tools for one request.
struct ToolCallPlan {
  ToolCallFormat format;
  ToolCallConstraint constraint = ToolCallConstraint::kNone;
  bool parse_calls = false;  // false for "none": the answer is content only
  // JSON Schema text of one call's object: for each allowed function f (all of them, or the one
  // tool_choice names), {"type": "object", "properties": {"name": {"const": "f"}, <arguments
  // key>: f's parameters schema}, "required": ["name", <arguments key>],
  // "additionalProperties": false}, under "anyOf" when there are several. Empty for "none".
  std::string call_schema;
};

// kInvalidArgument: a family without tool calling, a tool whose parameters schema is not a JSON
// object, a choice naming a function not in `tools`.
Result<ToolCallPlan> plan_tool_calls(ChatTemplate chat_template,
                                     std::span<const ToolDefinition> tools,
                                     const ToolChoice& choice);

// The answers a tool plan allows. "required" / a named function (kFromStart): the family's
// call envelope around the call schema, several separated calls where the family allows them
// and the client did not ask for one at a time. "auto" (kAfterTrigger): free text in which
// every occurrence of the trigger opens a call held to the schema (chatml: text and calls
// interleaved; llama3.1, where a call is the whole answer: either text that does not open like
// a call, or one call).
// kInvalidArgument for a plan that constrains nothing (kNone) or a call schema the grammar
// compiler refuses.
Result<Grammar> tool_call_grammar(const ToolCallPlan& plan, bool parallel_tool_calls);

// Generated text split into content and calls.
struct ParsedToolCalls {
  std::string content;
  std::vector<ToolCall> calls;  // ids empty
};

// The calls in a whole answer. A family without tool calling returns the text as content.
ParsedToolCalls parse_tool_calls(ChatTemplate chat_template, std::string_view generated_text);

// "call_" followed by 24 letters and digits derived from `seed` (OpenAI's shape). Distinct seeds
// give distinct ids with overwhelming likelihood; the server seeds with the request's random
// state and the call's index.
std::string make_tool_call_id(uint64_t seed);

// Splits a streamed answer into content deltas and calls as pieces arrive, holding back text
// that may still turn out to open a call (like a stop-string matcher holds a partial match).
// Fed any split of an answer, the content it releases concatenates, and the calls it returns
// equal, parse_tool_calls of the whole answer.
//
// Invariants: held text is what was pushed and neither released nor consumed by a call; after
// finish() nothing is held and push() may not be called again.
class ToolCallStreamSplitter {
 public:
  explicit ToolCallStreamSplitter(ChatTemplate chat_template);

  // Content that can be released now and calls completed by `piece`.
  // Requires: finish() has not been called.
  ParsedToolCalls push(std::string_view piece);
  // The end of the answer: what was held is released as content or completes a call.
  ParsedToolCalls finish();

 private:
  enum class State : uint8_t {
    kText,         // chatml: between calls; pending_ holds a possible trigger start
    kInCall,       // chatml: after a trigger; pending_ holds the envelope so far
    kUndecided,    // llama3.1: only whitespace (or part of "<|python_tag|>") seen so far
    kWholeAnswer,  // llama3.1: the answer opened with "{": held until finish()
    kPassThrough,  // no calls possible any more: everything is content
    kFinished,
  };

  void advance_chatml(ParsedToolCalls& out);
  void advance_llama(ParsedToolCalls& out);

  ChatTemplate chat_template_;
  State state_;
  std::string pending_;
  // chatml: a well-formed call just ended, so whitespace arriving now is not content (it is
  // dropped until other text arrives).
  bool after_call_ = false;
};

}  // namespace folio::server
