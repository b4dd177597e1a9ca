// ChatTemplate: how a conversation of messages becomes the prompt text a chat model was trained
// on.
//
// GGUF files carry the template as Jinja source (metadata key tokenizer.chat_template). Folio
// does not run Jinja; it recognises the common template families by their markers and renders
// them natively, as the models' own Jinja templates render them (S: system, U: user, A:
// assistant; "system?" marks where a system prompt goes):
//   chatml      "<|im_start|>role\ncontent<|im_end|>\n" ... "<|im_start|>assistant\n"
//               (Qwen 2 and 2.5 when a system prompt is given, many fine-tunes)
//   llama3      "<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>" ... with each
//               content trimmed, then the assistant header (Llama 3)
//   llama3.1    llama3 opened by a system header that always carries "Cutting Knowledge Date:
//               December 2023\nToday Date: 26 Jul 2024\n\n" before the system prompt (Llama
//               3.1, 3.2 and 3.3; the date is the templates' default)
//   llama2      "[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST] A </s><s>[INST] U [/INST]", contents
//               stripped (Llama 2 chat)
//   mistral-v1  " [INST] S\n\nU [/INST] A</s> [INST] U [/INST]": the system prompt opens the
//               first user turn (the official template of Mistral 7B Instruct v0.1/v0.2 and
//               Mixtral 8x7B; files converted before it carry a Llama 2-like one, read as llama2)
//   mistral-v3  "[INST] U[/INST] A</s>[INST] S\n\nU[/INST]": the system prompt opens the last
//               user turn, assistant answers trimmed (Mistral 7B Instruct v0.3, Mixtral 8x22B)
//   zephyr      "<|role|>\ncontent</s>\n" ... "<|assistant|>\n"
//   phi3        "<|role|>\ncontent<|end|>\n" ... "<|assistant|>\n" (an empty system message is
//               left out)
//   gemma       "<start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\nA<end_of_turn>\n"
//               ... "<start_of_turn>model\n": Gemma has no system role, so the system prompt
//               and a blank line open the next user turn (as Gemma 3's template and llama.cpp
//               do); user and model contents trimmed
// Tool calling (tool_calls.h describes what a call looks like in the model's output) exists in
// the two families whose templates define it, rendered as those templates render it:
//   chatml      Qwen 2.5 and Qwen 3 (Hermes-style): the tools, one compact JSON object a line,
//               inside <tools></tools> in the system turn, after the system prompt; a call as
//               "<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>" in the assistant
//               turn; tool results as <tool_response> blocks in one user turn per run of
//               consecutive tool messages
//   llama3.1    "Environment: ipython\n" opens the system header; the tools, as JSON indented by
//               4, open the first user message (the templates' default, tools_in_user_message);
//               a call as the whole assistant turn '{"name": "f", "parameters": {...}}'; a tool
//               result as an "ipython" turn holding the result as a JSON string
// JSON in a prompt is written as the templates' tojson filter writes it (Python's json.dumps,
// non-ASCII kept, keys in the order the client sent them).
//
// Where a template places a system prompt only once (Llama 2, Mistral, Gemma), every system
// message's content is collected, joined by a blank line, and placed there.
//
// A template that is none of these (or a file without one) uses a configured default. The BOS
// token is not rendered: the tokenizer adds it as the vocabulary asks, and special markers are
// matched as control tokens when the vocabulary has them (EncodeOptions::parse_special).
// "Trimmed" is Jinja's trim filter: whitespace removed from both ends.
//
// Thread-safety: immutable values; free functions are pure.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "folio/base/result.h"
#include "folio/server/openai_protocol.h"

namespace folio::server {

enum class ChatTemplate : uint8_t {
  kChatMl,
  kLlama3,
  kLlama31,
  kLlama2,
  kMistralV1,
  kMistralV3,
  kZephyr,
  kPhi3,
  kGemma,
};

std::string_view chat_template_name(ChatTemplate chat_template);
// kInvalidArgument listing the names for an unknown one.
Result<ChatTemplate> chat_template_from_name(std::string_view name);

// The family of a Jinja template by its markers; nullopt when none is recognised. Llama 3.1 and
// later are told from Llama 3 by their "Cutting Knowledge Date" line. Mistral's
// official templates are told from Llama 2's by how they place the system message (or by
// their tool markers), and v1 from v3 by the space before "[INST]", as llama.cpp tells them.
std::optional<ChatTemplate> detect_chat_template(std::string_view jinja_source);

// Whether the family's template defines tool calling (chatml and llama3.1).
bool chat_template_supports_tools(ChatTemplate chat_template);

// The prompt for `messages` followed by the opening of the assistant's turn, with `tools`
// offered to the model as the template offers them (none: the prompt without tools).
// kInvalidArgument, with a message naming the message or tool, when:
//   - tools, a "tool" message or an assistant message with tool calls are given to a family
//     without tool calling;
//   - a tool's parameters_schema is not a JSON object;
//   - llama3.1: an assistant message carries more than one call (its template refuses them), or
//     tools are given with no message after the system prompt to hold them.
Result<std::string> render_chat_with_tools(ChatTemplate chat_template,
                                           std::span<const ChatMessage> messages,
                                           std::span<const ToolDefinition> tools);

// The prompt for `messages` without tools. Conversations render_chat_with_tools refuses are still
// rendered (a family without tool calling shows a tool message as a turn of role "tool" and an
// assistant message by its content alone; llama3.1 shows an assistant's first call only).
std::string render_chat(ChatTemplate chat_template, std::span<const ChatMessage> messages);

}  // namespace folio::server
