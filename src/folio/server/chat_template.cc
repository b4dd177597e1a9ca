#include "folio/server/chat_template.h"

#include <array>

#include <fmt/format.h>

namespace folio::server {
namespace {

constexpr std::array<ChatTemplate, 8> kAllTemplates = {
    ChatTemplate::kChatMl,    ChatTemplate::kLlama3,    ChatTemplate::kLlama2,
    ChatTemplate::kMistralV1, ChatTemplate::kMistralV3, ChatTemplate::kZephyr,
    ChatTemplate::kPhi3,      ChatTemplate::kGemma};

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

}  // namespace

std::string_view chat_template_name(ChatTemplate chat_template) {
  switch (chat_template) {
    case ChatTemplate::kChatMl:
      return "chatml";
    case ChatTemplate::kLlama3:
      return "llama3";
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
  if (has("<|start_header_id|>")) return ChatTemplate::kLlama3;
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
        prompt += fmt::format("<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>",
                              message.role, trim(message.content));
      }
      return prompt + "<|start_header_id|>assistant<|end_header_id|>\n\n";
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
