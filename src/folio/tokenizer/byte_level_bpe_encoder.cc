// Byte-level BPE encoding, as llama.cpp's llm_tokenizer_bpe: words from the pre-tokenizer,
// bytes spelled with GPT-2's byte-to-character map, merges applied lowest rank first
// (bigram_merge.h).
#include "folio/tokenizer/bigram_merge.h"
#include "folio/tokenizer/pre_tokenizer.h"
#include "folio/tokenizer/tokenizer_state.h"
#include "folio/tokenizer/unicode.h"

namespace folio::tokenizer {

namespace {

// GPT-2's map: printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves;
// the other 68 bytes, in order, for U+0100 onwards (so space, 0x20, is U+0120 'Ġ').
struct ByteCharacterMap {
  static constexpr uint32_t kCharacters = 0x100 + 68;  // every character the map uses is below
  std::array<uint32_t, 256> character_of_byte{};
  std::array<std::string, 256> utf8_of_byte;
  std::array<int16_t, kCharacters> byte_of_character{};  // -1: not a mapped character

  ByteCharacterMap() {
    byte_of_character.fill(-1);
    uint32_t next_substitute = 0x100;
    for (uint32_t byte = 0; byte < 256; ++byte) {
      const bool printable = (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) ||
                             (byte >= 0xAE && byte <= 0xFF);
      character_of_byte[byte] = printable ? byte : next_substitute++;
      byte_of_character[character_of_byte[byte]] = static_cast<int16_t>(byte);
      append_utf8(character_of_byte[byte], utf8_of_byte[byte]);
    }
  }
  // The byte a character stands for; nullopt for characters outside the map.
  std::optional<uint8_t> byte_of(uint32_t character) const {
    if (character >= kCharacters || byte_of_character[character] < 0) return std::nullopt;
    return static_cast<uint8_t>(byte_of_character[character]);
  }
};

const ByteCharacterMap& byte_character_map() {
  static const ByteCharacterMap map;
  return map;
}

// Byte-level BPE's bigram rule: the rank of the merge (left, right) in the vocabulary's list.
struct MergeRankRule {
  const Tokenizer::State* state;

  std::optional<int32_t> operator()(std::string_view left, std::string_view right) const {
    const auto it = state->merge_ranks.find({left, right});
    if (it == state->merge_ranks.end()) return std::nullopt;
    return it->second;
  }
};

// A piece spelled in mapped characters, as raw bytes (characters outside the map kept as their
// UTF-8, which only malformed vocabularies contain).
std::string unmap_piece(std::string_view piece) {
  const ByteCharacterMap& map = byte_character_map();
  std::string bytes;
  for (size_t position = 0; position < piece.size();) {
    const Utf8Unit unit = decode_utf8(piece, position);
    const std::optional<uint8_t> byte =
        unit.code_point == kInvalidCodePoint ? std::nullopt : map.byte_of(unit.code_point);
    if (byte) {
      bytes += static_cast<char>(*byte);
    } else {
      bytes.append(piece.substr(position, unit.length));
    }
    position += unit.length;
  }
  return bytes;
}

// Whether a word that is a whole piece is taken as it is, without merging (Hugging Face's
// ignore_merges; llama.cpp sets it for the Llama 3 names). Merging may not rebuild such a piece.
bool takes_whole_pieces(PreTokenizerKind kind) {
  switch (kind) {
    case PreTokenizerKind::kLlama3:
      return true;
    case PreTokenizerKind::kGpt2:
    case PreTokenizerKind::kQwen2:
    case PreTokenizerKind::kDefault:
    case PreTokenizerKind::kFalcon:
    case PreTokenizerKind::kStarcoder:
    case PreTokenizerKind::kDeepseekLlm:
      return false;
  }
  return false;
}

void encode_word(const Tokenizer::State& state, std::string_view word,
                 BigramMerge<MergeRankRule>& merge, std::vector<TokenId>& ids) {
  const ByteCharacterMap& map = byte_character_map();
  std::string mapped;
  for (char byte : word) mapped += map.utf8_of_byte[static_cast<uint8_t>(byte)];
  if (takes_whole_pieces(state.vocabulary.pre_tokenizer)) {
    if (std::optional<TokenId> id = state.mergeable_piece(mapped)) {
      ids.push_back(*id);
      return;
    }
  }
  merge.start(mapped);
  for (char byte : word) merge.add_symbol(map.utf8_of_byte[static_cast<uint8_t>(byte)].size());
  merge.merge([&](std::string_view piece) {
    if (auto id = state.mergeable_piece(piece)) {
      ids.push_back(*id);
      return;
    }
    // A merge result that is not a piece: spell it byte by byte. Each mapped character is one
    // input byte; a byte the vocabulary cannot spell is dropped, as llama.cpp drops it.
    for (size_t position = 0; position < piece.size();) {
      const Utf8Unit unit = decode_utf8(piece, position);
      const TokenId id = state.byte_tokens[*map.byte_of(unit.code_point)];
      if (id != Tokenizer::State::kNoToken) ids.push_back(id);
      position += unit.length;
    }
  });
}

}  // namespace

Status initialize_byte_level_bpe(Tokenizer::State& state) {
  const Vocabulary& vocabulary = state.vocabulary;
  for (size_t rank = 0; rank < vocabulary.merges.size(); ++rank) {
    const std::string_view merge = vocabulary.merges[rank];
    const size_t space = merge.find(' ', 1);  // validate_vocabulary checked it exists
    state.merge_ranks.try_emplace({merge.substr(0, space), merge.substr(space + 1)},
                                  static_cast<int32_t>(rank));
  }
  const ByteCharacterMap& map = byte_character_map();
  for (int byte = 0; byte < 256; ++byte) {
    std::optional<TokenId> id = state.mergeable_piece(map.utf8_of_byte[byte]);
    if (!id) {
      // llama.cpp looks a leftover symbol up among all tokens, whatever their type.
      const auto any = state.piece_ids.find(map.utf8_of_byte[byte]);
      if (any != state.piece_ids.end()) id = any->second;
    }
    state.byte_tokens[byte] = id.value_or(Tokenizer::State::kNoToken);
  }
  state.decoded.resize(vocabulary.tokens.size());
  for (size_t id = 0; id < vocabulary.tokens.size(); ++id) {
    const std::string& piece = vocabulary.tokens[id];
    switch (vocabulary.types[id]) {
      case TokenType::kNormal:
      case TokenType::kUndefined:
        state.decoded[id] = unmap_piece(piece);
        break;
      case TokenType::kByte: {
        const std::optional<uint8_t> byte = parse_byte_token(piece);
        if (!byte) {
          return invalid_argument("byte token {} is '{}', not of the form <0xXX>", id, piece);
        }
        state.decoded[id] = std::string(1, static_cast<char>(*byte));
        break;
      }
      case TokenType::kUserDefined:
      case TokenType::kControl:
      case TokenType::kUnknown:
        state.decoded[id] = piece;
        break;
      case TokenType::kUnused:
        break;
    }
  }
  return Status();
}

void encode_byte_level_bpe(const Tokenizer::State& state, std::string_view text,
                           std::vector<TokenId>& ids) {
  BigramMerge merge(MergeRankRule{&state});
  for (std::string_view word : pre_tokenize(state.vocabulary.pre_tokenizer, text)) {
    encode_word(state, word, merge, ids);
  }
}

}  // namespace folio::tokenizer
