#include "folio/server/chat_template.h"

#include <array>

namespace folio::server {
namespace {

constexpr std::array<ChatTemplate, 5> kAllTemplates = {ChatTemplate::kChatMl, ChatTemplate::kLlama3,
                                                       ChatTemplate::kLlama2, ChatTemplate::kZephyr,
                                                       ChatTemplate::kGemma};

std::string render_llama2(std::span<const ChatMessage> messages) {
  // The system prompt goes inside the first [INST] block; each assistant answer closes a turn.
  std::string prompt;
  std::string system;
  for (const ChatMessage& message : messages) {
    if (message.role == "system") {
      system += message.content;
    } else if (message.role == "user") {
      prompt += "[INST] ";
      if (!system.empty()) {
        prompt += "<<SYS>>\n" + system + "\n<</SYS>>\n\n";
        system.clear();
      }
      prompt += message.content + " [/INST]";
    } else {
      prompt += " " + message.content + "</s><s>";
    }
  }
  return prompt;
}

}  // namespace

std::string_view chat_template_name(ChatTemplate chat_template) {
  switch (chat_template) {
    case ChatTemplate::kChatMl:
      return "chatml";
    case ChatTemplate::kLlama3:
      return "llama3";
    case ChatTemplate::kLlama2:
      return "llama2";
    case ChatTemplate::kZephyr:
      return "zephyr";
    case ChatTemplate::kGemma:
      return "gemma";
  }
  return "chatml";
}

Result<ChatTemplate> chat_template_from_name(std::string_view name) {
  for (ChatTemplate chat_template : kAllTemplates) {
    if (chat_template_name(chat_template) == name) return chat_template;
  }
  return invalid_argument(
      "unknown chat template '{}'; known: chatml, llama3, llama2, zephyr, "
      "gemma",
      name);
}

std::optional<ChatTemplate> detect_chat_template(std::string_view jinja_source) {
  auto has = [&](std::string_view marker) {
    return jinja_source.find(marker) != std::string_view::npos;
  };
  if (has("<|im_start|>")) return ChatTemplate::kChatMl;
  if (has("<|start_header_id|>")) return ChatTemplate::kLlama3;
  if (has("<start_of_turn>")) return ChatTemplate::kGemma;
  if (has("[INST]")) return ChatTemplate::kLlama2;
  if (has("<|user|>") && has("<|assistant|>")) return ChatTemplate::kZephyr;
  return std::nullopt;
}

std::string render_chat(ChatTemplate chat_template, std::span<const ChatMessage> messages) {
  std::string prompt;
  switch (chat_template) {
    case ChatTemplate::kChatMl:
      for (const ChatMessage& message : messages) {
        prompt += "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>\n";
      }
      return prompt + "<|im_start|>assistant\n";
    case ChatTemplate::kLlama3:
      for (const ChatMessage& message : messages) {
        prompt += "<|start_header_id|>" + message.role + "<|end_header_id|>\n\n" + message.content +
                  "<|eot_id|>";
      }
      return prompt + "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case ChatTemplate::kLlama2:
      return render_llama2(messages);
    case ChatTemplate::kZephyr:
      for (const ChatMessage& message : messages) {
        prompt += "<|" + message.role + "|>\n" + message.content + "</s>\n";
      }
      return prompt + "<|assistant|>\n";
    case ChatTemplate::kGemma:
      // Gemma has no system role: system messages are rendered as user turns.
      for (const ChatMessage& message : messages) {
        const std::string role = message.role == "assistant" ? "model" : "user";
        prompt += "<start_of_turn>" + role + "\n" + message.content + "<end_of_turn>\n";
      }
      return prompt + "<start_of_turn>model\n";
  }
  return prompt;
}

}  // namespace folio::server
