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
//               content trimmed, then the assistant header
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

// The family of a Jinja template by its markers; nullopt when none is recognised. Mistral's
// official templates are told from Llama 2's by how they place the system message (or by
// their tool markers), and v1 from v3 by the space before "[INST]", as llama.cpp tells them.
std::optional<ChatTemplate> detect_chat_template(std::string_view jinja_source);

// The prompt for `messages` followed by the opening of the assistant's turn.
std::string render_chat(ChatTemplate chat_template, std::span<const ChatMessage> messages);

}  // namespace folio::server
