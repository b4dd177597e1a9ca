// SentencePiece-style encoding, as llama.cpp's llm_tokenizer_spm: greedy merging of the
// adjacent pair whose concatenation is the highest-scoring piece (bigram_merge.h), then byte
// fallback for the symbols left that are not pieces.
#include <span>

#include "folio/tokenizer/bigram_merge.h"
#include "folio/tokenizer/tokenizer_state.h"
#include "folio/tokenizer/unicode.h"

namespace folio::tokenizer {

namespace {

// One character of the text (or one invalid byte), with its key for the adjacency check.
struct Unit {
  size_t start;
  size_t length;
  uint32_t key;
};

// SentencePiece's bigram rule: the score of the piece the pair concatenates to. Negated, as
// BigramMerge merges the lowest rank first; negation is exact, so scores keep their order and
// their ties.
struct PieceScoreRule {
  const Tokenizer::State* state;

  std::optional<float> operator()(std::string_view left, std::string_view right) const {
    const std::optional<TokenId> id =
        state->mergeable_piece(std::string_view(left.data(), left.size() + right.size()));
    if (!id) return std::nullopt;
    return -state->vocabulary.scores[*id];
  }
};

// Code points, and 0x110000 + byte for an invalid byte (never a code point).
uint32_t character_key(std::string_view text, size_t position, const Utf8Unit& unit) {
  if (unit.code_point != kInvalidCodePoint) return unit.code_point;
  return 0x110000 + static_cast<uint8_t>(text[position]);
}

uint64_t pair_key(uint32_t left, uint32_t right) {
  return uint64_t{left} << 32 | right;
}

// Merges one segment of the text: its units, which are contiguous.
void encode_segment(const Tokenizer::State& state, std::string_view text,
                    std::span<const Unit> units, BigramMerge<PieceScoreRule>& merge,
                    std::vector<TokenId>& ids) {
  const size_t begin = units.front().start;
  merge.start(text.substr(begin, units.back().start + units.back().length - begin));
  for (const Unit& unit : units) merge.add_symbol(unit.length);
  // Every merged symbol is a piece; a lone character may not be, and falls back to bytes.
  merge.merge([&](std::string_view piece) {
    if (auto id = state.mergeable_piece(piece)) {
      ids.push_back(*id);
      return;
    }
    for (char byte : piece) ids.push_back(state.byte_tokens[static_cast<uint8_t>(byte)]);
  });
}

}  // namespace

std::string unescape_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t position = 0; position < text.size();) {
    if (text.compare(position, kSentencePieceSpace.size(), kSentencePieceSpace) == 0) {
      out += ' ';
      position += kSentencePieceSpace.size();
    } else {
      out += text[position++];
    }
  }
  return out;
}

std::optional<uint8_t> parse_byte_token(std::string_view piece) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece[5] != '>') return std::nullopt;
  const int high = hex(piece[3]);
  const int low = hex(piece[4]);
  if (high < 0 || low < 0) return std::nullopt;
  return static_cast<uint8_t>(high * 16 + low);
}

Status initialize_sentencepiece(Tokenizer::State& state) {
  const Vocabulary& vocabulary = state.vocabulary;
  std::array<std::optional<TokenId>, 256> byte_token_ids;
  state.decoded.resize(vocabulary.tokens.size());
  for (size_t id = 0; id < vocabulary.tokens.size(); ++id) {
    const std::string& piece = vocabulary.tokens[id];
    switch (vocabulary.types[id]) {
      case TokenType::kByte: {
        const std::optional<uint8_t> byte = parse_byte_token(piece);
        if (!byte) {
          return invalid_argument("byte token {} is '{}', not of the form <0xXX>", id, piece);
        }
        if (!byte_token_ids[*byte]) byte_token_ids[*byte] = static_cast<TokenId>(id);
        state.decoded[id] = std::string(1, static_cast<char>(*byte));
        break;
      }
      case TokenType::kNormal:
      case TokenType::kUndefined:
        state.decoded[id] = unescape_spaces(piece);
        break;
      case TokenType::kUserDefined:
      case TokenType::kControl:
      case TokenType::kUnknown:
        state.decoded[id] = piece;
        break;
      case TokenType::kUnused:
        break;
    }
  }
  for (size_t id = 0; id < vocabulary.tokens.size(); ++id) {
    const TokenType type = vocabulary.types[id];
    if (type != TokenType::kNormal && type != TokenType::kUndefined) continue;
    const std::string_view piece = vocabulary.tokens[id];
    uint32_t previous = 0;
    for (size_t position = 0; position < piece.size();) {
      const Utf8Unit unit = decode_utf8(piece, position);
      const uint32_t key = character_key(piece, position, unit);
      if (position > 0) state.piece_character_pairs.insert(pair_key(previous, key));
      previous = key;
      position += unit.length;
    }
  }
  for (int byte = 0; byte < 256; ++byte) {
    if (byte_token_ids[byte]) {
      state.byte_tokens[byte] = *byte_token_ids[byte];
    } else if (auto single = state.mergeable_piece(std::string(1, static_cast<char>(byte)))) {
      state.byte_tokens[byte] = *single;
    } else if (vocabulary.unknown) {
      state.byte_tokens[byte] = *vocabulary.unknown;
    } else {
      return invalid_argument(
          "the vocabulary cannot spell byte 0x{:02X}: no <0x{:02X}> token, no one-byte piece "
          "and no unknown token",
          byte, byte);
    }
  }
  return Status();
}

void encode_sentencepiece(const Tokenizer::State& state, std::string_view text,
                          std::vector<TokenId>& ids) {
  std::vector<Unit> units;
  units.reserve(text.size());
  for (size_t position = 0; position < text.size();) {
    const Utf8Unit unit = decode_utf8(text, position);
    units.push_back({position, unit.length, character_key(text, position, unit)});
    position += unit.length;
  }
  // No merge can join two characters that are adjacent in no piece, so the text splits there
  // into segments that merge independently, each exactly as it would inside the whole text:
  // merges in one segment never change another's pairs, and within a segment the order of
  // merges (score, then leftmost) is the same. Small segments keep the queue small and hot.
  BigramMerge merge(PieceScoreRule{&state});
  size_t segment_begin = 0;
  for (size_t i = 1; i <= units.size(); ++i) {
    if (i == units.size() ||
        !state.piece_character_pairs.contains(pair_key(units[i - 1].key, units[i].key))) {
      encode_segment(state, text,
                     std::span<const Unit>(units).subspan(segment_begin, i - segment_begin), merge,
                     ids);
      segment_begin = i;
    }
  }
}

}  // namespace folio::tokenizer
