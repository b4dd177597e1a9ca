#include "folio/tokenizer/spm_vocabulary_builder.h"

#include <algorithm>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "folio/tokenizer/unicode.h"

namespace folio::tokenizer {

namespace {

constexpr std::string_view kTrainingText =
#include "folio/tokenizer/spm_training_text.inc"
    ;
constexpr int64_t kMaxGeneratedVocabularySize = 1'000'000;

// A word of the training text as a sequence of symbol ids, with how often it occurs.
struct Word {
  std::vector<int32_t> symbols;
  int64_t count;
};

uint64_t pair_key(int32_t left, int32_t right) {
  return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
}

// Byte-pair learning over the words of the training text. `pieces` receives every distinct
// character (most frequent first, ties by byte order) and then every new string each merge
// makes, in order, until every word is a single symbol.
class PieceLearner {
 public:
  std::vector<std::string> learn() {
    split_words();
    while (merge_best_pair()) {
    }
    return std::move(pieces_);
  }

 private:
  int32_t symbol_id(const std::string& text) {
    auto [it, inserted] = symbol_ids_.emplace(text, static_cast<int32_t>(symbols_.size()));
    if (inserted) symbols_.push_back(text);
    return it->second;
  }

  void split_words() {
    std::map<std::string, int64_t> word_counts;  // ordered, so symbol ids are deterministic
    size_t position = 0;
    while (position < kTrainingText.size()) {
      while (position < kTrainingText.size() && is_ascii_space(kTrainingText[position])) {
        ++position;
      }
      const size_t start = position;
      while (position < kTrainingText.size() && !is_ascii_space(kTrainingText[position])) {
        ++position;
      }
      if (position > start) {
        ++word_counts[std::string(kSentencePieceSpace) +
                      std::string(kTrainingText.substr(start, position - start))];
      }
    }
    std::map<std::string, int64_t> character_counts;
    for (const auto& [text, count] : word_counts) {
      for (std::string_view character : split_utf8_characters(text)) {
        character_counts[std::string(character)] += count;
      }
    }
    std::vector<std::pair<std::string, int64_t>> characters(character_counts.begin(),
                                                            character_counts.end());
    std::stable_sort(characters.begin(), characters.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    for (const auto& [character, count] : characters) {
      symbol_id(character);
      pieces_.push_back(character);
    }
    for (const auto& [text, count] : word_counts) {
      Word word{{}, count};
      for (std::string_view character : split_utf8_characters(text)) {
        word.symbols.push_back(symbol_ids_.at(std::string(character)));
      }
      words_.push_back(std::move(word));
    }
  }

  static bool is_ascii_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

  // The most frequent adjacent pair; ties go to the smaller (left, right) strings.
  bool merge_best_pair() {
    std::unordered_map<uint64_t, int64_t>& pair_counts = pair_counts_;
    pair_counts.clear();  // keeps its buckets between merges
    for (const Word& word : words_) {
      for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
        pair_counts[pair_key(word.symbols[i], word.symbols[i + 1])] += word.count;
      }
    }
    if (pair_counts.empty()) return false;
    uint64_t best = 0;
    int64_t best_count = -1;
    for (const auto& [key, count] : pair_counts) {
      if (count > best_count || (count == best_count && pair_less(key, best))) {
        best = key;
        best_count = count;
      }
    }
    const auto left = static_cast<int32_t>(best >> 32);
    const auto right = static_cast<int32_t>(best & 0xffffffffu);
    const std::string merged = symbols_[left] + symbols_[right];
    const bool is_new = !symbol_ids_.contains(merged);
    const int32_t merged_id = symbol_id(merged);
    if (is_new) pieces_.push_back(merged);
    for (Word& word : words_) {
      if (!contains_pair(word, left, right)) continue;
      std::vector<int32_t> rewritten;
      rewritten.reserve(word.symbols.size());
      for (size_t i = 0; i < word.symbols.size(); ++i) {
        if (i + 1 < word.symbols.size() && word.symbols[i] == left &&
            word.symbols[i + 1] == right) {
          rewritten.push_back(merged_id);
          ++i;
        } else {
          rewritten.push_back(word.symbols[i]);
        }
      }
      word.symbols = std::move(rewritten);
    }
    return true;
  }

  static bool contains_pair(const Word& word, int32_t left, int32_t right) {
    for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
      if (word.symbols[i] == left && word.symbols[i + 1] == right) return true;
    }
    return false;
  }

  bool pair_less(uint64_t a, uint64_t b) const {
    const auto a_left = static_cast<int32_t>(a >> 32), b_left = static_cast<int32_t>(b >> 32);
    const auto a_right = static_cast<int32_t>(a & 0xffffffffu);
    const auto b_right = static_cast<int32_t>(b & 0xffffffffu);
    if (symbols_[a_left] != symbols_[b_left]) return symbols_[a_left] < symbols_[b_left];
    return symbols_[a_right] < symbols_[b_right];
  }

  std::vector<std::string> symbols_;
  std::unordered_map<std::string, int32_t> symbol_ids_;
  std::vector<Word> words_;
  std::vector<std::string> pieces_;
  std::unordered_map<uint64_t, int64_t> pair_counts_;
};

// Every piece the embedded text yields, learned once per process (the text never changes; a
// smaller vocabulary takes a prefix).
const std::vector<std::string>& all_learned_pieces() {
  static const std::vector<std::string> pieces = PieceLearner().learn();
  return pieces;
}

// "▁" followed by the index-th string of the bijective base-26 sequence a..z, aa..zz, aaa...
std::string filler_piece(int64_t index) {
  std::string letters;
  for (int64_t n = index + 1; n > 0; n = (n - 1) / 26) {
    letters.insert(letters.begin(), static_cast<char>('a' + (n - 1) % 26));
  }
  return std::string(kSentencePieceSpace) + letters;
}

}  // namespace

int64_t learned_piece_count() {
  return static_cast<int64_t>(all_learned_pieces().size());
}

Result<Vocabulary> build_llama_vocabulary(int64_t vocabulary_size) {
  if (vocabulary_size < kMinGeneratedVocabularySize ||
      vocabulary_size > kMaxGeneratedVocabularySize) {
    return invalid_argument(
        "vocabulary size {} is outside [{}, {}]: a generated vocabulary needs <unk>, <s>, </s> "
        "and the 256 byte tokens",
        vocabulary_size, kMinGeneratedVocabularySize, kMaxGeneratedVocabularySize);
  }
  Vocabulary vocabulary;
  vocabulary.model = TokenizerModel::kSentencePiece;
  vocabulary.bos = 1;
  vocabulary.eos = 2;
  vocabulary.unknown = 0;
  vocabulary.add_bos = true;
  vocabulary.add_eos = false;
  vocabulary.add_space_prefix = true;
  auto add = [&vocabulary](std::string piece, float score, TokenType type) {
    vocabulary.tokens.push_back(std::move(piece));
    vocabulary.scores.push_back(score);
    vocabulary.types.push_back(type);
  };
  add("<unk>", 0.0f, TokenType::kUnknown);
  add("<s>", 0.0f, TokenType::kControl);
  add("</s>", 0.0f, TokenType::kControl);
  for (int byte = 0; byte < 256; ++byte)
    add(fmt::format("<0x{:02X}>", byte), 0.0f, TokenType::kByte);

  const auto piece_budget = static_cast<size_t>(vocabulary_size - kMinGeneratedVocabularySize);
  const std::vector<std::string>& learned = all_learned_pieces();
  std::vector<std::string> pieces(learned.begin(),
                                  learned.begin() + std::min(learned.size(), piece_budget));
  std::set<std::string, std::less<>> taken(pieces.begin(), pieces.end());
  for (int64_t filler = 0; pieces.size() < piece_budget; ++filler) {
    std::string piece = filler_piece(filler);
    if (taken.insert(piece).second) pieces.push_back(std::move(piece));
  }
  for (size_t k = 0; k < pieces.size(); ++k) {
    add(std::move(pieces[k]), -static_cast<float>(k), TokenType::kNormal);
  }
  FOLIO_CHECK(vocabulary.size() == vocabulary_size);
  FOLIO_RETURN_IF_ERROR(validate_vocabulary(vocabulary));
  return vocabulary;
}

}  // namespace folio::tokenizer
