// Chat templates: each family renders a multi-turn conversation with a system prompt exactly as
// the model's own Jinja template renders it (worked out by hand from those templates, with
// add_generation_prompt set and bos_token rendered as nothing, since Folio's tokenizer adds BOS
// as a token id), and each family is recognised from a template source written for this test
// with the family's markers (and, when ../shared/data is present, from the Phi-3 vocabulary's
// real tokenizer.chat_template).
#include "folio/server/chat_template.h"

#include <cstdlib>
#include <filesystem>
#include <vector>

#include <gtest/gtest.h>

#include "folio/gguf/gguf_file.h"

namespace folio::server {
namespace {

// System, user, assistant, user. The answer comes back with a leading space and a trailing
// newline, as generated answers often do, so the templates that trim it show it.
const std::vector<ChatMessage> kConversation = {
    {"system", "S"}, {"user", "U1"}, {"assistant", " A1\n"}, {"user", "U2"}};

// Qwen 2.5's template (Qwen2.5-7B-Instruct, tokenizer_config.json), no tools: a first system
// message is rendered as its own turn (a default one is added only when there is none), every
// other message as "<|im_start|>role\ncontent<|im_end|>\n", untrimmed.
TEST(ChatTemplateTest, ChatMlRendersAsQwenTemplate) {
  EXPECT_EQ(render_chat(ChatTemplate::kChatMl, kConversation),
            "<|im_start|>system\nS<|im_end|>\n"
            "<|im_start|>user\nU1<|im_end|>\n"
            "<|im_start|>assistant\n A1\n<|im_end|>\n"
            "<|im_start|>user\nU2<|im_end|>\n"
            "<|im_start|>assistant\n");
}

// Meta-Llama-3-8B-Instruct's template: header, blank line, content | trim, <|eot_id|>; the
// assistant header opens the answer.
TEST(ChatTemplateTest, Llama3RendersAsItsTemplateTrimmingContents) {
  EXPECT_EQ(render_chat(ChatTemplate::kLlama3, kConversation),
            "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nU1<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nA1<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nU2<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// Llama-2-7b-chat-hf's template: the system prompt wrapped in <<SYS>> opens the first user
// message; user turns are bos_token + "[INST] " + content.strip() + " [/INST]", answers
// " " + content.strip() + " " + eos_token.
TEST(ChatTemplateTest, Llama2RendersAsItsTemplate) {
  EXPECT_EQ(render_chat(ChatTemplate::kLlama2, kConversation),
            "[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST]");
}

// Mistral-7B-Instruct-v0.2's template (Mistral's "v1" tokenizer): the system message opens the
// first user turn as ' [INST] ' + system + '\n\n' + content + ' [/INST]'; answers are
// ' ' + content + eos_token, untrimmed.
TEST(ChatTemplateTest, MistralV1PutsTheSystemPromptInTheFirstTurn) {
  EXPECT_EQ(render_chat(ChatTemplate::kMistralV1, kConversation),
            " [INST] S\n\nU1 [/INST]  A1\n</s> [INST] U2 [/INST]");
}

// Mistral-7B-Instruct-v0.3's template (Mistral's "v3" tokenizer), no tools: '[INST] ' + content
// + '[/INST]', the system message placed in the last user turn (loop.last), answers
// ' ' + content | trim + eos_token.
TEST(ChatTemplateTest, MistralV3PutsTheSystemPromptInTheLastTurn) {
  EXPECT_EQ(render_chat(ChatTemplate::kMistralV3, kConversation),
            "[INST] U1[/INST] A1</s>[INST] S\n\nU2[/INST]");
  // With no user turn last (the template's loop.last is then not a user turn), no system.
  const std::vector<ChatMessage> ends_with_answer = {
      {"system", "S"}, {"user", "U1"}, {"assistant", "A1"}};
  EXPECT_EQ(render_chat(ChatTemplate::kMistralV3, ends_with_answer), "[INST] U1[/INST] A1</s>");
}

// Phi-3.5-mini-instruct's template: '<|' role '|>\n' + content + '<|end|>\n' for system (when
// not empty), user and assistant, then '<|assistant|>\n'. (The first Phi-3-mini template, the
// one in ggml-vocab-phi-3.gguf, drops system messages and puts '<|assistant|>\n' after every user
// turn; for conversations without a system message both render the same.)
TEST(ChatTemplateTest, Phi3RendersSystemUserAndAssistantTurns) {
  EXPECT_EQ(render_chat(ChatTemplate::kPhi3, kConversation),
            "<|system|>\nS<|end|>\n<|user|>\nU1<|end|>\n<|assistant|>\n A1\n<|end|>\n"
            "<|user|>\nU2<|end|>\n<|assistant|>\n");
  const std::vector<ChatMessage> empty_system = {{"system", ""}, {"user", "U1"}};
  EXPECT_EQ(render_chat(ChatTemplate::kPhi3, empty_system), "<|user|>\nU1<|end|>\n<|assistant|>\n");
}

// Gemma 3's template (gemma-3-4b-it): no system role, so a first system message's content and
// '\n\n' open the first user turn; 'assistant' is 'model'; contents | trim. (Gemma 1 and 2
// templates refuse a system message; llama.cpp merges it the same way.)
TEST(ChatTemplateTest, GemmaPrependsTheSystemPromptToTheFirstUserTurn) {
  EXPECT_EQ(render_chat(ChatTemplate::kGemma, kConversation),
            "<start_of_turn>user\nS\n\nU1<end_of_turn>\n"
            "<start_of_turn>model\nA1<end_of_turn>\n"
            "<start_of_turn>user\nU2<end_of_turn>\n"
            "<start_of_turn>model\n");
}

// HuggingFaceH4/zephyr-7b-beta's template as transformers renders it (trim_blocks): '<|' role
// '|>\n' + content + eos_token and a newline per message, untrimmed.
TEST(ChatTemplateTest, ZephyrRendersAsItsTemplate) {
  EXPECT_EQ(render_chat(ChatTemplate::kZephyr, kConversation),
            "<|system|>\nS</s>\n<|user|>\nU1</s>\n<|assistant|>\n A1\n</s>\n<|user|>\nU2</s>\n"
            "<|assistant|>\n");
}

// Template sources written for this test, each with the markers of its family as the models'
// templates spell them.
TEST(ChatTemplateTest, DetectsEachFamilyByItsMarkers) {
  EXPECT_EQ(detect_chat_template(
                "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
                "message.content + '<|im_end|>' + '\\n' }}{%- endfor %}"),
            ChatTemplate::kChatMl);
  EXPECT_EQ(detect_chat_template("{% set content = '<|start_header_id|>' + message['role'] + "
                                 "'<|end_header_id|>\\n\\n' + message['content'] | trim + "
                                 "'<|eot_id|>' %}"),
            ChatTemplate::kLlama3);
  EXPECT_EQ(detect_chat_template("{% if loop.index0 == 0 %}{% set content = '<<SYS>>\\n' + "
                                 "system_message + '\\n<</SYS>>\\n\\n' + content %}{% endif %}"
                                 "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"),
            ChatTemplate::kLlama2);
  EXPECT_EQ(detect_chat_template("{%- if loop.first and system_message is defined %}"
                                 "{{- ' [INST] ' + system_message + '\\n\\n' + message['content'] "
                                 "+ ' [/INST]' }}{%- else %}{{- ' [INST] ' + message['content'] + "
                                 "' [/INST]' }}{%- endif %}"),
            ChatTemplate::kMistralV1);
  EXPECT_EQ(detect_chat_template("{%- if tools is not none %}{{- \"[AVAILABLE_TOOLS] [\" }}"
                                 "{%- endif %}{%- if loop.last and system_message is defined %}"
                                 "{{- \"[INST] \" + system_message + \"\\n\\n\" + "
                                 "message[\"content\"] + \"[/INST]\" }}{%- endif %}"),
            ChatTemplate::kMistralV3);
  EXPECT_EQ(detect_chat_template("{% elif message['role'] == 'user' %}{{'<|user|>\\n' + "
                                 "message['content'] + '<|end|>\\n'}}{% endif %}{% if "
                                 "add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"),
            ChatTemplate::kPhi3);
  EXPECT_EQ(detect_chat_template("{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if "
                                 "loop.first else '') }}{{ message['content'] | trim }}"),
            ChatTemplate::kGemma);
  EXPECT_EQ(detect_chat_template("{% if message['role'] == 'user' %}{{ '<|user|>\\n' + "
                                 "message['content'] + eos_token }}{% endif %}{{ '<|assistant|>' "
                                 "}}"),
            ChatTemplate::kZephyr);
  EXPECT_EQ(detect_chat_template("{{ messages | custom }}"), std::nullopt);
  EXPECT_EQ(detect_chat_template(""), std::nullopt);
}

// The Phi-3 vocabulary from llama.cpp's models/ folder carries the first Phi-3-mini template.
TEST(ChatTemplateTest, DetectsPhi3FromTheRealVocabularyFile) {
  const char* override_directory = std::getenv("FOLIO_SHARED_DATA_DIR");
  const std::string path =
      std::string(override_directory != nullptr ? override_directory : FOLIO_SHARED_DATA_DIR) +
      "/ggml-vocab-phi-3.gguf";
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << path << " is absent (../shared/data is not beside this checkout; set "
                 << "FOLIO_SHARED_DATA_DIR to its location)";
  }
  Result<gguf::GgufFile> file = gguf::GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  Result<std::string_view> source = file->get_string("tokenizer.chat_template");
  ASSERT_TRUE(source.ok()) << source.status().to_string();
  EXPECT_EQ(detect_chat_template(*source), ChatTemplate::kPhi3);
}

TEST(ChatTemplateTest, NamesRoundTrip) {
  for (ChatTemplate chat_template :
       {ChatTemplate::kChatMl, ChatTemplate::kLlama3, ChatTemplate::kLlama2,
        ChatTemplate::kMistralV1, ChatTemplate::kMistralV3, ChatTemplate::kZephyr,
        ChatTemplate::kPhi3, ChatTemplate::kGemma}) {
    Result<ChatTemplate> read = chat_template_from_name(chat_template_name(chat_template));
    ASSERT_TRUE(read.ok()) << read.status().to_string();
    EXPECT_EQ(*read, chat_template);
  }
  const Result<ChatTemplate> unknown = chat_template_from_name("jinja");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("mistral-v3"), std::string::npos);
}

}  // namespace
}  // namespace folio::server
