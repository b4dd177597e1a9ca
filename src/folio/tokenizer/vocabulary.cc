#include "folio/tokenizer/vocabulary.h"

#include <cmath>
#include <limits>

#include "folio/gguf/gguf_file.h"
#include "folio/gguf/gguf_writer.h"

namespace folio::tokenizer {

namespace {

constexpr std::string_view kModelKey = "tokenizer.ggml.model";
constexpr std::string_view kPreKey = "tokenizer.ggml.pre";
constexpr std::string_view kTokensKey = "tokenizer.ggml.tokens";
constexpr std::string_view kScoresKey = "tokenizer.ggml.scores";
constexpr std::string_view kTypesKey = "tokenizer.ggml.token_type";
constexpr std::string_view kMergesKey = "tokenizer.ggml.merges";

struct SpecialIdKey {
  std::string_view key;
  std::optional<TokenId> Vocabulary::*field;
};
constexpr SpecialIdKey kSpecialIdKeys[] = {
    {"tokenizer.ggml.bos_token_id", &Vocabulary::bos},
    {"tokenizer.ggml.eos_token_id", &Vocabulary::eos},
    {"tokenizer.ggml.unknown_token_id", &Vocabulary::unknown},
    {"tokenizer.ggml.padding_token_id", &Vocabulary::padding},
    {"tokenizer.ggml.eot_token_id", &Vocabulary::end_of_turn},
    {"tokenizer.ggml.eom_token_id", &Vocabulary::end_of_message},
};

struct FlagKey {
  std::string_view key;
  bool Vocabulary::*field;
};
constexpr FlagKey kFlagKeys[] = {
    {"tokenizer.ggml.add_bos_token", &Vocabulary::add_bos},
    {"tokenizer.ggml.add_eos_token", &Vocabulary::add_eos},
    {"tokenizer.ggml.add_space_prefix", &Vocabulary::add_space_prefix},
};

// tokenizer.ggml.pre names, as llama.cpp's llama_vocab::load reads them, for the pre-tokenizers
// Folio implements. Several names share one pattern list there, and so here.
struct PreTokenizerName {
  std::string_view name;
  PreTokenizerKind kind;
};
constexpr PreTokenizerName kPreTokenizerNames[] = {
    {"default", PreTokenizerKind::kDefault},
    {"gpt-2", PreTokenizerKind::kGpt2},
    {"gpt2", PreTokenizerKind::kGpt2},
    {"phi-2", PreTokenizerKind::kGpt2},
    {"mpt", PreTokenizerKind::kGpt2},
    {"olmo", PreTokenizerKind::kGpt2},
    {"llama-bpe", PreTokenizerKind::kLlama3},
    {"llama3", PreTokenizerKind::kLlama3},
    {"llama-v3", PreTokenizerKind::kLlama3},
    {"falcon3", PreTokenizerKind::kLlama3},
    {"qwen2", PreTokenizerKind::kQwen2},
    {"deepseek-r1-qwen", PreTokenizerKind::kQwen2},
    {"stablelm2", PreTokenizerKind::kQwen2},
    {"falcon", PreTokenizerKind::kFalcon},
    {"starcoder", PreTokenizerKind::kStarcoder},
    {"refact", PreTokenizerKind::kStarcoder},
    {"command-r", PreTokenizerKind::kStarcoder},
    {"smollm", PreTokenizerKind::kStarcoder},
    {"deepseek-llm", PreTokenizerKind::kDeepseekLlm},
};

Result<PreTokenizerKind> pre_tokenizer_from_name(const gguf::GgufFile& file) {
  // llama.cpp reads a missing name as "default" (and warns).
  if (!file.contains(kPreKey)) return PreTokenizerKind::kDefault;
  FOLIO_ASSIGN_OR_RETURN(std::string_view name, file.get_string(kPreKey));
  std::string known;
  for (const PreTokenizerName& entry : kPreTokenizerNames) {
    if (entry.name == name) return entry.kind;
    known += known.empty() ? "" : ", ";
    known += entry.name;
  }
  return invalid_argument(
      "{}: {} '{}' is not a pre-tokenizer Folio knows, so its text would be split into the "
      "wrong words (known: {})",
      file.source(), kPreKey, name, known);
}

Status read_model(const gguf::GgufFile& file, Vocabulary& vocabulary) {
  FOLIO_ASSIGN_OR_RETURN(std::string_view model, file.get_string(kModelKey));
  if (model == "llama") {
    vocabulary.model = TokenizerModel::kSentencePiece;
    vocabulary.bos = 1;
    vocabulary.eos = 2;
    vocabulary.unknown = 0;
    vocabulary.add_bos = true;
    vocabulary.add_space_prefix = true;
    return Status();
  }
  if (model == "gpt2") {
    vocabulary.model = TokenizerModel::kBytePairEncoding;
    vocabulary.add_bos = false;
    vocabulary.add_space_prefix = false;
    FOLIO_ASSIGN_OR_RETURN(vocabulary.pre_tokenizer, pre_tokenizer_from_name(file));
    return Status();
  }
  return invalid_argument("{}: {} '{}' is not supported (supported: llama, gpt2)", file.source(),
                          kModelKey, model);
}

Status read_special_ids(const gguf::GgufFile& file, Vocabulary& vocabulary) {
  for (const SpecialIdKey& special : kSpecialIdKeys) {
    if (!file.contains(special.key)) continue;
    FOLIO_ASSIGN_OR_RETURN(int64_t id, file.get_integer(special.key));
    // Converters write -1 (or its uint32 spelling) for "no such token".
    if (id < 0 || id == std::numeric_limits<uint32_t>::max()) {
      vocabulary.*special.field = std::nullopt;
      continue;
    }
    if (id >= vocabulary.size()) {
      return invalid_argument("{}: {} = {} is outside the vocabulary of {} tokens", file.source(),
                              special.key, id, vocabulary.size());
    }
    vocabulary.*special.field = static_cast<TokenId>(id);
  }
  for (const FlagKey& flag : kFlagKeys) {
    if (!file.contains(flag.key)) continue;
    FOLIO_ASSIGN_OR_RETURN(vocabulary.*flag.field, file.get_bool(flag.key));
  }
  return Status();
}

Status check_special_id(std::string_view name, const std::optional<TokenId>& id,
                        int64_t vocabulary_size) {
  if (id && (*id < 0 || *id >= vocabulary_size)) {
    return invalid_argument("{} token id {} is outside the vocabulary of {} tokens", name, *id,
                            vocabulary_size);
  }
  return Status();
}

}  // namespace

std::string_view pre_tokenizer_name(PreTokenizerKind kind) {
  switch (kind) {
    case PreTokenizerKind::kGpt2:
      return "gpt-2";
    case PreTokenizerKind::kLlama3:
      return "llama-bpe";
    case PreTokenizerKind::kQwen2:
      return "qwen2";
    case PreTokenizerKind::kDefault:
      return "default";
    case PreTokenizerKind::kFalcon:
      return "falcon";
    case PreTokenizerKind::kStarcoder:
      return "starcoder";
    case PreTokenizerKind::kDeepseekLlm:
      return "deepseek-llm";
  }
  return "default";
}

std::string_view tokenizer_model_name(TokenizerModel model) {
  switch (model) {
    case TokenizerModel::kSentencePiece:
      return "llama";
    case TokenizerModel::kBytePairEncoding:
      return "gpt2";
  }
  return "invalid";
}

Result<Vocabulary> read_vocabulary(const gguf::GgufFile& file) {
  Vocabulary vocabulary;
  FOLIO_RETURN_IF_ERROR(read_model(file, vocabulary));
  FOLIO_ASSIGN_OR_RETURN(std::span<const std::string> tokens, file.get_string_array(kTokensKey));
  vocabulary.tokens.assign(tokens.begin(), tokens.end());
  const size_t size = vocabulary.tokens.size();
  if (file.contains(kScoresKey)) {
    FOLIO_ASSIGN_OR_RETURN(vocabulary.scores, file.get_array<float>(kScoresKey));
  } else {
    vocabulary.scores.assign(size, 0.0f);
  }
  if (file.contains(kTypesKey)) {
    FOLIO_ASSIGN_OR_RETURN(std::vector<int32_t> types, file.get_array<int32_t>(kTypesKey));
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] < 0 || types[i] > static_cast<int32_t>(TokenType::kByte)) {
        return invalid_argument("{}: {}[{}] = {} is not a token type (0-6)", file.source(),
                                kTypesKey, i, types[i]);
      }
      vocabulary.types.push_back(static_cast<TokenType>(types[i]));
    }
  } else {
    vocabulary.types.assign(size, TokenType::kNormal);
  }
  if (vocabulary.model == TokenizerModel::kBytePairEncoding) {
    FOLIO_ASSIGN_OR_RETURN(std::span<const std::string> merges, file.get_string_array(kMergesKey));
    vocabulary.merges.assign(merges.begin(), merges.end());
  }
  FOLIO_RETURN_IF_ERROR(read_special_ids(file, vocabulary));
  // llama.cpp adds BOS for the Llama 3 names unless the file says otherwise: Llama 3 files
  // converted before the converter read the tokenizer's post-processor lack the key.
  if (vocabulary.model == TokenizerModel::kBytePairEncoding &&
      vocabulary.pre_tokenizer == PreTokenizerKind::kLlama3 &&
      !file.contains("tokenizer.ggml.add_bos_token") && vocabulary.bos.has_value()) {
    vocabulary.add_bos = true;
  }
  Status status = validate_vocabulary(vocabulary);
  if (!status.ok()) return status.with_context(file.source());
  return vocabulary;
}

Status validate_vocabulary(const Vocabulary& vocabulary) {
  const size_t size = vocabulary.tokens.size();
  if (size == 0) return invalid_argument("{} is empty", kTokensKey);
  if (size > static_cast<size_t>(std::numeric_limits<TokenId>::max())) {
    return invalid_argument("{} has {} tokens, more than int32 ids can address", kTokensKey, size);
  }
  if (vocabulary.scores.size() != size) {
    return invalid_argument("{} has {} entries for {} tokens", kScoresKey, vocabulary.scores.size(),
                            size);
  }
  if (vocabulary.types.size() != size) {
    return invalid_argument("{} has {} entries for {} tokens", kTypesKey, vocabulary.types.size(),
                            size);
  }
  for (size_t i = 0; i < size; ++i) {
    if (!std::isfinite(vocabulary.scores[i])) {
      return invalid_argument("{}[{}] is not finite", kScoresKey, i);
    }
  }
  for (size_t i = 0; i < vocabulary.merges.size(); ++i) {
    const std::string& merge = vocabulary.merges[i];
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos || space + 1 == merge.size()) {
      return invalid_argument("{}[{}] '{}' is not two pieces separated by a space", kMergesKey, i,
                              merge);
    }
  }
  FOLIO_RETURN_IF_ERROR(check_special_id("BOS", vocabulary.bos, vocabulary.size()));
  FOLIO_RETURN_IF_ERROR(check_special_id("EOS", vocabulary.eos, vocabulary.size()));
  FOLIO_RETURN_IF_ERROR(check_special_id("unknown", vocabulary.unknown, vocabulary.size()));
  FOLIO_RETURN_IF_ERROR(check_special_id("padding", vocabulary.padding, vocabulary.size()));
  FOLIO_RETURN_IF_ERROR(check_special_id("end-of-turn", vocabulary.end_of_turn, vocabulary.size()));
  FOLIO_RETURN_IF_ERROR(
      check_special_id("end-of-message", vocabulary.end_of_message, vocabulary.size()));
  if (vocabulary.add_bos && !vocabulary.bos) {
    return invalid_argument("the vocabulary adds a BOS token but has no BOS id");
  }
  if (vocabulary.add_eos && !vocabulary.eos) {
    return invalid_argument("the vocabulary adds an EOS token but has no EOS id");
  }
  return Status();
}

void write_vocabulary_metadata(const Vocabulary& vocabulary, gguf::GgufWriter& writer) {
  writer.set(std::string(kModelKey),
             gguf::GgufValue::of_string(std::string(tokenizer_model_name(vocabulary.model))));
  if (vocabulary.model == TokenizerModel::kBytePairEncoding) {
    const std::string_view pre = pre_tokenizer_name(vocabulary.pre_tokenizer);
    writer.set(std::string(kPreKey), gguf::GgufValue::of_string(std::string(pre)));
  }
  writer.set(std::string(kTokensKey), gguf::GgufValue::array_of_strings(vocabulary.tokens));
  writer.set(std::string(kScoresKey), gguf::GgufValue::array_of<float>(vocabulary.scores));
  std::vector<int32_t> types;
  types.reserve(vocabulary.types.size());
  for (TokenType type : vocabulary.types) types.push_back(static_cast<int32_t>(type));
  writer.set(std::string(kTypesKey), gguf::GgufValue::array_of<int32_t>(types));
  if (vocabulary.model == TokenizerModel::kBytePairEncoding) {
    writer.set(std::string(kMergesKey), gguf::GgufValue::array_of_strings(vocabulary.merges));
  }
  for (const SpecialIdKey& special : kSpecialIdKeys) {
    if (const std::optional<TokenId>& id = vocabulary.*special.field) {
      writer.set(std::string(special.key), gguf::GgufValue::of(static_cast<uint32_t>(*id)));
    }
  }
  for (const FlagKey& flag : kFlagKeys) {
    writer.set(std::string(flag.key), gguf::GgufValue::of(vocabulary.*flag.field));
  }
}

}  // namespace folio::tokenizer
