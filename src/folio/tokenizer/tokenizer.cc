#include "folio/tokenizer/tokenizer.h"

#include <algorithm>

#include "folio/gguf/gguf_file.h"
#include "folio/tokenizer/tokenizer_state.h"
#include "folio/tokenizer/unicode.h"

namespace folio::tokenizer {

namespace {

void index_special_tokens(Tokenizer::State& state) {
  const Vocabulary& vocabulary = state.vocabulary;
  for (size_t id = 0; id < vocabulary.tokens.size(); ++id) {
    const std::string_view text = vocabulary.tokens[id];
    const TokenType type = vocabulary.types[id];
    const bool always = type == TokenType::kUserDefined;
    const bool on_request = type == TokenType::kControl || type == TokenType::kUnknown;
    if (text.empty() || (!always && !on_request)) continue;
    state.specials_by_first_byte[static_cast<uint8_t>(text[0])].push_back(
        {text, static_cast<TokenId>(id), on_request});
  }
  for (auto& bucket : state.specials_by_first_byte) {
    std::stable_sort(bucket.begin(), bucket.end(),
                     [](const auto& a, const auto& b) { return a.text.size() > b.text.size(); });
  }
}

// The longest special token whose text starts at text[position], if any may match.
const Tokenizer::State::SpecialToken* match_special(const Tokenizer::State& state,
                                                    std::string_view text, size_t position,
                                                    bool parse_special) {
  for (const auto& special : state.specials_by_first_byte[static_cast<uint8_t>(text[position])]) {
    if (special.needs_parse_special && !parse_special) continue;
    if (text.compare(position, special.text.size(), special.text) == 0) return &special;
  }
  return nullptr;
}

}  // namespace

Result<Tokenizer> Tokenizer::from_gguf(const gguf::GgufFile& file) {
  FOLIO_ASSIGN_OR_RETURN(Vocabulary vocabulary, read_vocabulary(file));
  Result<Tokenizer> tokenizer = from_vocabulary(std::move(vocabulary));
  if (!tokenizer.ok()) return tokenizer.status().with_context(file.source());
  return tokenizer;
}

Result<Tokenizer> Tokenizer::from_vocabulary(Vocabulary vocabulary) {
  FOLIO_RETURN_IF_ERROR(validate_vocabulary(vocabulary));
  auto state = std::make_shared<State>();
  state->vocabulary = std::move(vocabulary);
  const std::vector<std::string>& tokens = state->vocabulary.tokens;
  state->piece_ids.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    state->piece_ids.try_emplace(tokens[id], static_cast<TokenId>(id));
  }
  switch (state->vocabulary.model) {
    case TokenizerModel::kSentencePiece:
      FOLIO_RETURN_IF_ERROR(initialize_sentencepiece(*state));
      break;
    case TokenizerModel::kBytePairEncoding:
      FOLIO_RETURN_IF_ERROR(initialize_byte_level_bpe(*state));
      break;
  }
  index_special_tokens(*state);
  return Tokenizer(std::move(state));
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  const State& state = *state_;
  const Vocabulary& vocabulary = state.vocabulary;
  std::vector<TokenId> ids;
  if (options.add_special && vocabulary.add_bos) ids.push_back(*vocabulary.bos);
  bool after_special = true;  // SentencePiece prefixes a space at the start and after specials
  std::string escaped;
  auto encode_fragment = [&](std::string_view fragment) {
    switch (vocabulary.model) {
      case TokenizerModel::kSentencePiece:
        escaped.clear();
        if (vocabulary.add_space_prefix && after_special) escaped += kSentencePieceSpace;
        for (char c : fragment) {
          if (c == ' ') {
            escaped += kSentencePieceSpace;
          } else {
            escaped += c;
          }
        }
        encode_sentencepiece(state, escaped, ids);
        break;
      case TokenizerModel::kBytePairEncoding:
        encode_byte_level_bpe(state, fragment, ids);
        break;
    }
    after_special = false;
  };
  size_t fragment_start = 0;
  for (size_t position = 0; position < text.size();) {
    const State::SpecialToken* special =
        match_special(state, text, position, options.parse_special);
    if (special == nullptr) {
      ++position;
      continue;
    }
    if (position > fragment_start) {
      encode_fragment(text.substr(fragment_start, position - fragment_start));
    }
    ids.push_back(special->id);
    after_special = true;
    position += special->text.size();
    fragment_start = position;
  }
  if (fragment_start < text.size()) encode_fragment(text.substr(fragment_start));
  if (options.add_special && vocabulary.add_eos) ids.push_back(*vocabulary.eos);
  return ids;
}

Result<std::string> Tokenizer::token_bytes(TokenId id, bool render_special) const {
  if (id < 0 || id >= vocab_size()) {
    return out_of_range("token id {} is outside the vocabulary of {} tokens", id, vocab_size());
  }
  const TokenType type = state_->vocabulary.types[id];
  if ((type == TokenType::kControl || type == TokenType::kUnknown) && !render_special) {
    return std::string();
  }
  return state_->decoded[id];
}

Result<std::string> Tokenizer::decode(std::span<const TokenId> ids,
                                      const DecodeOptions& options) const {
  IncrementalDecoder decoder(*this, options);
  std::string text;
  for (TokenId id : ids) {
    FOLIO_ASSIGN_OR_RETURN(std::string piece, decoder.push(id));
    text += piece;
  }
  text += decoder.finish();
  return text;
}

Result<std::string_view> Tokenizer::token_piece(TokenId id) const {
  if (id < 0 || id >= vocab_size()) {
    return out_of_range("token id {} is outside the vocabulary of {} tokens", id, vocab_size());
  }
  return std::string_view(state_->vocabulary.tokens[id]);
}

std::optional<TokenId> Tokenizer::find_piece(std::string_view piece) const {
  const auto it = state_->piece_ids.find(piece);
  if (it == state_->piece_ids.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::is_special(TokenId id) const {
  if (id < 0 || id >= vocab_size()) return false;
  const TokenType type = state_->vocabulary.types[id];
  return type == TokenType::kControl || type == TokenType::kUnknown ||
         type == TokenType::kUserDefined;
}

bool Tokenizer::is_end_of_generation(TokenId id) const {
  const Vocabulary& vocabulary = state_->vocabulary;
  return id == vocabulary.eos || id == vocabulary.end_of_turn || id == vocabulary.end_of_message;
}

const Vocabulary& Tokenizer::vocabulary() const {
  return state_->vocabulary;
}
int64_t Tokenizer::vocab_size() const {
  return state_->vocabulary.size();
}
TokenizerModel Tokenizer::model() const {
  return state_->vocabulary.model;
}
std::optional<TokenId> Tokenizer::bos() const {
  return state_->vocabulary.bos;
}
std::optional<TokenId> Tokenizer::eos() const {
  return state_->vocabulary.eos;
}

Result<std::string> IncrementalDecoder::push(TokenId id) {
  FOLIO_ASSIGN_OR_RETURN(std::string bytes, tokenizer_->token_bytes(id, options_.render_special));
  pending_ += bytes;
  const size_t complete = complete_utf8_prefix_length(pending_);
  std::string text = pending_.substr(0, complete);
  pending_.erase(0, complete);
  const Vocabulary& vocabulary = tokenizer_->vocabulary();
  if (vocabulary.model == TokenizerModel::kSentencePiece) {
    // Pieces already spell spaces as spaces; this catches a "▁" spelled by byte tokens (a
    // vocabulary without a "▁" piece), which SentencePiece decodes as a space too. `text` ends
    // on a character boundary, so no "▁" is split between two pushes.
    if (text.find(kSentencePieceSpace) != std::string::npos) text = unescape_spaces(text);
  }
  if (at_start_ && !text.empty()) {
    at_start_ = false;
    if (options_.strip_leading_space && vocabulary.model == TokenizerModel::kSentencePiece &&
        vocabulary.add_space_prefix && text[0] == ' ') {
      text.erase(0, 1);
    }
  }
  return text;
}

std::string IncrementalDecoder::finish() {
  std::string rest = std::move(pending_);
  pending_.clear();
  return rest;
}

}  // namespace folio::tokenizer
