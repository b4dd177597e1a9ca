// SentencePiece-style encoding, as llama.cpp's llm_tokenizer_spm: greedy merging of the
// adjacent pair whose concatenation is the highest-scoring piece.
#include <queue>

#include "folio/model/tokenizer_state.h"
#include "folio/model/unicode.h"

namespace folio::model {

namespace {

// A run of the text: one character at first, growing as merges absorb the next symbol.
// A symbol absorbed into its left neighbour keeps length 0 and leaves the linked list.
struct Symbol {
  size_t start;
  size_t length;
  int previous;  // -1: none
  int next;      // -1: none
};

struct Bigram {
  int left;
  int right;
  float score;
  size_t length;  // left.length + right.length when queued; a mismatch later means stale
};

// Lower priority first for std::priority_queue: the highest score, then the leftmost, on top.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

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
  std::vector<Symbol> symbols;
  for (size_t position = 0; position < text.size();) {
    const size_t length = decode_utf8(text, position).length;
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({position, length, index - 1, -1});
    if (index > 0) symbols[index - 1].next = index;
    position += length;
  }
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t length = symbols[left].length + symbols[right].length;
    if (auto id = state.mergeable_piece(text.substr(symbols[left].start, length))) {
      queue.push({left, right, state.vocabulary.scores[*id], length});
    }
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    if (left.length == 0 || right.length == 0 || left.length + right.length != bigram.length) {
      continue;  // one side changed since this pair was queued
    }
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].previous = bigram.left;
    try_add(left.previous, bigram.left);
    try_add(bigram.left, left.next);
  }

  // Every merged symbol is a piece; a lone character may not be, and falls back to bytes.
  for (int i = symbols.empty() ? -1 : 0; i != -1; i = symbols[i].next) {
    const std::string_view piece = text.substr(symbols[i].start, symbols[i].length);
    if (auto id = state.mergeable_piece(piece)) {
      ids.push_back(*id);
      continue;
    }
    for (char byte : piece) ids.push_back(state.byte_tokens[static_cast<uint8_t>(byte)]);
  }
}

}  // namespace folio::model
