// Internal to the tokenizer: the immutable state a Tokenizer shares between its copies, and the
// two encoders that read it. Not part of the tokenizer layer's interface.
#pragma once

#include <array>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "folio/tokenizer/tokenizer.h"

namespace folio::tokenizer {

struct PiecePairHash {
  size_t operator()(const std::pair<std::string_view, std::string_view>& pair) const {
    const size_t first = std::hash<std::string_view>()(pair.first);
    return first ^ (std::hash<std::string_view>()(pair.second) + 0x9e3779b97f4a7c15ull +
                    (first << 6) + (first >> 2));
  }
};

// Invariants: built once, never modified; every string_view points into vocabulary.tokens or
// vocabulary.merges of this same State (which is never moved: it lives behind a shared_ptr).
struct Tokenizer::State {
  static constexpr TokenId kNoToken = -1;

  struct SpecialToken {
    std::string_view text;
    TokenId id;
    bool needs_parse_special;  // control and unknown tokens; user-defined ones always match
  };

  Vocabulary vocabulary;
  std::unordered_map<std::string_view, TokenId> piece_ids;  // the first id of each piece
  // The token spelling each byte. Byte-level BPE only: kNoToken for a byte the vocabulary
  // cannot spell (real vocabularies lack bytes that never occur in valid UTF-8, and Falcon's some
  // control characters too); encoding drops such a byte, as llama.cpp does.
  std::array<TokenId, 256> byte_tokens{};
  std::vector<std::string> decoded;  // each token's bytes, special tokens' as rendered text
  // Special tokens by their text's first byte, longest text first.
  std::array<std::vector<SpecialToken>, 256> specials_by_first_byte;
  // SentencePiece: every pair of characters adjacent inside some normal piece, as
  // (first << 32 | second) with code points, or 0x110000 + byte for an invalid byte.
  std::unordered_set<uint64_t> piece_character_pairs;
  // Byte-level BPE: rank of each merge (left, right), lower merges first.
  std::unordered_map<std::pair<std::string_view, std::string_view>, int32_t, PiecePairHash>
      merge_ranks;

  // The id of a normal (or undefined-type) piece, the only kind merges may produce.
  std::optional<TokenId> mergeable_piece(std::string_view text) const {
    const auto it = piece_ids.find(text);
    if (it == piece_ids.end()) return std::nullopt;
    const TokenType type = vocabulary.types[it->second];
    if (type != TokenType::kNormal && type != TokenType::kUndefined) return std::nullopt;
    return it->second;
  }
};

// SentencePiece: fills byte_tokens and decoded; checks byte tokens.
Status initialize_sentencepiece(Tokenizer::State& state);
// Encodes one fragment whose spaces are already "▁" (and prefixed as the options say).
void encode_sentencepiece(const Tokenizer::State& state, std::string_view text,
                          std::vector<TokenId>& ids);

// Byte-level BPE: fills merge_ranks, byte_tokens and decoded; a byte with no piece of its own
// is spelled by any token whose text is its character (DeepSeek LLM spells some bytes with
// user-defined tokens), or by none.
Status initialize_byte_level_bpe(Tokenizer::State& state);
// Encodes one fragment: pre-tokenizes it, then merges within each word.
void encode_byte_level_bpe(const Tokenizer::State& state, std::string_view text,
                           std::vector<TokenId>& ids);

// Text with every "▁" turned into a space.
std::string unescape_spaces(std::string_view text);

// "<0x0A>" -> 0x0A; nullopt for any other text.
std::optional<uint8_t> parse_byte_token(std::string_view piece);

}  // namespace folio::tokenizer
