// Vocabulary: a tokenizer's data as GGUF stores it under `tokenizer.ggml.*`: the token pieces,
// their scores and types, BPE merges, special token ids and the add-BOS / add-EOS / space-prefix
// rules. The algorithms that use it live in tokenizer.h; this file only reads, checks and writes
// the data.
//
// Two models are supported (tokenizer.ggml.model):
//   "llama": SentencePiece-style BPE over Unicode characters. Pieces spell spaces as U+2581
//            ("▁"); a piece's score orders merges (higher first); byte tokens "<0x00>".."<0xFF>"
//            spell bytes no piece covers (byte fallback).
//   "gpt2":  byte-level BPE. Pieces spell bytes through GPT-2's byte-to-character map (space is
//            "Ġ"); `merges` ("left right", best first) order merges; a pre-tokenizer
//            (tokenizer.ggml.pre) first splits text into words.
//
// Token ids are plain int32 (TokenId), not a StrongId: they are data that flows by the million
// into i32 tensors, and the vocabulary size bounds every valid one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "folio/base/result.h"

namespace folio::gguf {
class GgufFile;
class GgufWriter;
}  // namespace folio::gguf

namespace folio::tokenizer {

using TokenId = int32_t;

// U+2581 LOWER ONE EIGHTH BLOCK: how SentencePiece pieces spell a space.
inline constexpr std::string_view kSentencePieceSpace = "\xe2\x96\x81";

// llama.cpp's token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  kUndefined = 0,  // decoded like kNormal
  kNormal = 1,
  kUnknown = 2,      // the <unk> token
  kControl = 3,      // <s>, </s>, chat markers: text only when special tokens are rendered
  kUserDefined = 4,  // always matched as a whole in input text, decoded verbatim
  kUnused = 5,       // never produced, decoded as nothing
  kByte = 6,         // "<0xXX>": one raw byte
};

enum class TokenizerModel { kSentencePiece, kBytePairEncoding };

// How byte-level BPE splits text into words before merging (tokenizer.ggml.pre; the names each
// value is read from are llama.cpp's, listed in vocabulary.cc, and an unknown name is refused).
enum class PreTokenizerKind {
  kGpt2,         // GPT-2's pattern ("gpt-2", "gpt2", "phi-2", "mpt", "olmo")
  kLlama3,       // Llama 3's pattern: digit runs of up to 3; a word that is a whole piece is
                 // taken unmerged ("llama-bpe", "llama3", ...)
  kQwen2,        // Llama 3's pattern with single digits ("qwen2", ...)
  kDefault,      // llama.cpp's default: punctuation runs, GPT-2's, number runs, 3 ASCII digits
                 // ("default", or no tokenizer.ggml.pre at all)
  kFalcon,       // punctuation runs (with `), GPT-2's, 3 ASCII digits ("falcon")
  kStarcoder,    // single digits, then GPT-2's ("starcoder", "refact", "command-r", "smollm")
  kDeepseekLlm,  // DeepSeek LLM's six patterns ("deepseek-llm")
};

struct Vocabulary {
  TokenizerModel model = TokenizerModel::kSentencePiece;
  PreTokenizerKind pre_tokenizer = PreTokenizerKind::kGpt2;  // byte-level BPE only
  std::vector<std::string> tokens;
  std::vector<float> scores;        // one per token
  std::vector<TokenType> types;     // one per token
  std::vector<std::string> merges;  // byte-level BPE only: "left right", rank order
  std::optional<TokenId> bos;
  std::optional<TokenId> eos;
  std::optional<TokenId> unknown;
  std::optional<TokenId> padding;
  std::optional<TokenId> end_of_turn;     // tokenizer.ggml.eot_token_id
  std::optional<TokenId> end_of_message;  // tokenizer.ggml.eom_token_id
  bool add_bos = true;
  bool add_eos = false;
  bool add_space_prefix = true;  // SentencePiece only: "hello" is encoded as "▁hello"

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

std::string_view tokenizer_model_name(TokenizerModel model);  // "llama" or "gpt2"
// The tokenizer.ggml.pre name written for a pre-tokenizer ("gpt-2", "llama-bpe", ...).
std::string_view pre_tokenizer_name(PreTokenizerKind kind);

// Reads tokenizer.ggml.* with llama.cpp's defaults for absent keys (no scores: all 0; no token
// types: all normal; SentencePiece: bos 1, eos 2, unknown 0, add BOS, add space prefix;
// byte-level BPE: no space prefix, and no BOS added except for the Llama 3 names, as llama.cpp).
// Errors name the key: a missing or unsupported model or pre-tokenizer, sizes that disagree, an
// id outside the vocabulary (a negative or 0xFFFFFFFF id means "none"), a token type outside
// 0..6, a non-finite score, a merge without a separating space.
Result<Vocabulary> read_vocabulary(const gguf::GgufFile& file);

// The checks read_vocabulary applies, for vocabularies built in code.
Status validate_vocabulary(const Vocabulary& vocabulary);

// Writes every field as tokenizer.ggml.* metadata (absent ids are not written).
void write_vocabulary_metadata(const Vocabulary& vocabulary, gguf::GgufWriter& writer);

}  // namespace folio::tokenizer
