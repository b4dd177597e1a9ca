// ChatTemplate: how a conversation of messages becomes the prompt text a chat model was trained
// on.
//
// GGUF files carry the template as Jinja source (metadata key tokenizer.chat_template). Folio
// does not run Jinja; it recognises the common template families by their markers and renders
// them natively:
//   chatml   "<|im_start|>role\ncontent<|im_end|>\n" ... "<|im_start|>assistant\n"
//            (Qwen, many fine-tunes)
//   llama3   "<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>" ...
//   llama2   "[INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] assistant</s><s>[INST] ..."
//            (also Mistral's [INST] format)
//   zephyr   "<|role|>\ncontent</s>\n" ... "<|assistant|>\n"
//   gemma    "<start_of_turn>role\ncontent<end_of_turn>\n" ... "<start_of_turn>model\n"
// A template that is none of these (or a file without one) uses a configured default. The BOS
// token is not rendered: the tokenizer adds it as the vocabulary asks, and special markers are
// matched as control tokens when the vocabulary has them (EncodeOptions::parse_special).
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

enum class ChatTemplate : uint8_t { kChatMl, kLlama3, kLlama2, kZephyr, kGemma };

std::string_view chat_template_name(ChatTemplate chat_template);
// kInvalidArgument listing the names for an unknown one.
Result<ChatTemplate> chat_template_from_name(std::string_view name);

// The family of a Jinja template by its markers; nullopt when none is recognised.
std::optional<ChatTemplate> detect_chat_template(std::string_view jinja_source);

// The prompt for `messages` followed by the opening of the assistant's turn.
std::string render_chat(ChatTemplate chat_template, std::span<const ChatMessage> messages);

}  // namespace folio::server
