// SentencePiece-style tokenization: known encodings with the real Llama 2 vocabulary (when
// ../shared/data is present) and with a tiny vocabulary whose merges are worked out by hand;
// round trips of every kind of text; special tokens; streaming decode.
#include <filesystem>
#include <map>
#include <unordered_map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "folio/base/random.h"
#include "folio/gguf/gguf_file.h"
#include "folio/tokenizer/spm_vocabulary_builder.h"
#include "folio/tokenizer/tokenizer.h"
#include "folio/tokenizer/unicode.h"
#include "testing/round_trip_corpus.h"

namespace folio::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

const std::string kLlamaVocabularyPath =
    std::string(FOLIO_SHARED_DATA_DIR) + "/ggml-vocab-llama-spm.gguf";

class LlamaVocabularyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kLlamaVocabularyPath)) {
      GTEST_SKIP() << "the Llama 2 vocabulary is not at " << kLlamaVocabularyPath
                   << " (../shared/data is absent beside this checkout)";
    }
    Result<gguf::GgufFile> file = gguf::GgufFile::open(kLlamaVocabularyPath);
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    Result<Tokenizer> tokenizer = Tokenizer::from_gguf(*file);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
    tokenizer_.emplace(std::move(*tokenizer));
  }
  std::optional<Tokenizer> tokenizer_;
};

TEST_F(LlamaVocabularyTest, OnceUponATimeIsTheKnownEncoding) {
  EXPECT_THAT(tokenizer_->encode("Once upon a time"), ElementsAre(1, 9038, 2501, 263, 931));
  // The pieces behind the ids, as SentencePiece's algorithm predicts: "▁" + each word.
  EXPECT_EQ(*tokenizer_->token_piece(9038), "\xe2\x96\x81Once");
  EXPECT_EQ(*tokenizer_->token_piece(263),
            "\xe2\x96\x81"
            "a");
  EXPECT_EQ(*tokenizer_->bos(), 1);
  EXPECT_EQ(*tokenizer_->eos(), 2);
  EXPECT_TRUE(tokenizer_->is_end_of_generation(2));
  EXPECT_FALSE(tokenizer_->is_end_of_generation(263));
}

// Expected ids from llama.cpp's models/ggml-vocab-llama-spm.gguf.out, which the Hugging Face
// tokenizer generated (no BOS).
TEST_F(LlamaVocabularyTest, MatchesReferenceEncodings) {
  const std::vector<std::pair<std::string, std::vector<TokenId>>> cases = {
      {"", {}},
      {" ", {259}},
      {"  ", {1678}},
      {"   ", {268}},
      {"\t", {29871, 12}},
      {"\n", {29871, 13}},
      {"\n\n", {29871, 13, 13}},
      {"\t\n", {29871, 12, 13}},
      {"Hello world", {15043, 3186}},
      {" Hello world", {29871, 15043, 3186}},
      {"Hello World", {15043, 2787}},
      {" Hello World!", {29871, 15043, 2787, 29991}},
      {"Hello, world!", {15043, 29892, 3186, 29991}},
      {" this is \xf0\x9f\xa6\x99.cpp", {29871, 445, 338, 29871, 243, 162, 169, 156, 29889, 8223}},
      {"w048 7tuijk dsdfhu",
       {281, 29900, 29946, 29947, 29871, 29955, 9161, 13535, 18031, 2176, 6905}},
      {"\xd0\xbd\xd0\xb5\xd1\x89\xd0\xbe \xd0\xbd\xd0\xb0 "
       "\xd0\x91\xd1\x8a\xd0\xbb\xd0\xb3\xd0\xb0\xd1\x80\xd1\x81\xd0\xba\xd0\xb8",
       {1538, 4851, 665, 1386, 29713, 1305}},
      {"    Hello\n    Hello", {268, 15043, 13, 1678, 15043}},
      {" (", {29871, 313}},
      {"\n =", {29871, 13, 353}},
      {"' era", {525, 3152}},
      {"ied 4 \xc2\xbd months", {474, 287, 29871, 29946, 29871, 30226, 7378}},
      {"F\xc3\xbchrer", {383, 4000, 261}},
      {"333", {29871, 29941, 29941, 29941}},
      {"Hello, y'all! How are you \xf0\x9f\x98\x81 ?\xe6\x88\x91\xe6\x83\xb3\xe5\x9c\xa8"
       "apple\xe5\xb7\xa5\xe4\xbd\x9c"
       "1314151\xe5\xa4\xa9\xef\xbd\x9e",
       {15043, 29892, 343,   29915, 497,   29991, 1128,  526,   366,   29871,
        243,   162,   155,   132,   1577,  30672, 31522, 30505, 11548, 31041,
        30732, 29896, 29941, 29896, 29946, 29896, 29945, 29896, 30408, 30739}},
  };
  for (const auto& [text, expected] : cases) {
    EXPECT_THAT(tokenizer_->encode(text, {.add_special = false}), ElementsAreArray(expected))
        << "'" << text << "'";
  }
}

TEST_F(LlamaVocabularyTest, RoundTripsEveryKindOfText) {
  for (const std::string& text : testing::round_trip_corpus()) {
    const std::vector<TokenId> ids = tokenizer_->encode(text);
    EXPECT_EQ(*tokenizer_->decode(ids), text) << "'" << text << "'";
  }
}

TEST_F(LlamaVocabularyTest, ControlTokensAreParsedOnlyOnRequest) {
  EXPECT_THAT(tokenizer_->encode("<s>Hello</s>", {.add_special = false, .parse_special = true}),
              ElementsAre(1, 15043, 2));
  const std::vector<TokenId> literal = tokenizer_->encode("<s>Hello</s>", {.add_special = false});
  EXPECT_EQ(std::count(literal.begin(), literal.end(), 1), 0);
  EXPECT_EQ(*tokenizer_->decode(literal), "<s>Hello</s>");
  EXPECT_EQ(*tokenizer_->decode(std::vector<TokenId>{1, 15043, 2}), "Hello");
  EXPECT_EQ(*tokenizer_->decode(std::vector<TokenId>{1, 15043, 2}, {.render_special = true}),
            "<s> Hello</s>");
}

TEST_F(LlamaVocabularyTest, StreamingDecodeHoldsBackPartialCharacters) {
  // 🦙 has no piece: it is four byte tokens, and only the fourth completes a character.
  IncrementalDecoder decoder(*tokenizer_, {.strip_leading_space = false});
  EXPECT_EQ(*decoder.push(445), " this");
  EXPECT_EQ(*decoder.push(243), "");
  EXPECT_EQ(*decoder.push(162), "");
  EXPECT_EQ(*decoder.push(169), "");
  EXPECT_EQ(*decoder.push(156), "\xf0\x9f\xa6\x99");
  EXPECT_EQ(*decoder.push(243), "");
  EXPECT_EQ(decoder.finish(), "\xf0");  // an unfinished character is flushed as it is
  for (const std::string& text : testing::round_trip_corpus()) {
    const std::vector<TokenId> ids = tokenizer_->encode(text);
    IncrementalDecoder stream(*tokenizer_);
    std::string streamed;
    for (TokenId id : ids) streamed += *stream.push(id);
    streamed += stream.finish();
    EXPECT_EQ(streamed, *tokenizer_->decode(ids)) << "'" << text << "'";
  }
}

TEST_F(LlamaVocabularyTest, OutOfRangeIdsAreErrors) {
  const Status status = tokenizer_->decode(std::vector<TokenId>{15043, 32000}).status();
  EXPECT_EQ(status.code(), StatusCode::kOutOfRange);
  EXPECT_THAT(status.message(), HasSubstr("token id 32000"));
  EXPECT_EQ(tokenizer_->token_bytes(-1).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(tokenizer_->token_piece(40000).status().code(), StatusCode::kOutOfRange);
  EXPECT_FALSE(tokenizer_->is_special(-5));
  IncrementalDecoder decoder(*tokenizer_);
  EXPECT_FALSE(decoder.push(99999).ok());
  EXPECT_EQ(*decoder.push(15043), "Hello");  // the failed push changed nothing
}

// A vocabulary small enough to run SentencePiece's merges by hand:
//   ids 0-2 <unk> <s> </s>, 3-258 byte tokens, then
//   259 "▁t" (-1), 260 "he" (-2), 261 "▁the" (-3), 262 "▁" (-10), 263 "a" (-11), 264 "b" (-12),
//   265 "ab" (-4), 266 "bb" (-5), 267 "<sep>" (user-defined).
Vocabulary tiny_vocabulary() {
  Vocabulary vocabulary;
  auto add = [&](std::string piece, float score, TokenType type) {
    vocabulary.tokens.push_back(std::move(piece));
    vocabulary.scores.push_back(score);
    vocabulary.types.push_back(type);
  };
  add("<unk>", 0, TokenType::kUnknown);
  add("<s>", 0, TokenType::kControl);
  add("</s>", 0, TokenType::kControl);
  for (int byte = 0; byte < 256; ++byte) add(fmt::format("<0x{:02X}>", byte), 0, TokenType::kByte);
  add("\xe2\x96\x81t", -1, TokenType::kNormal);
  add("he", -2, TokenType::kNormal);
  add("\xe2\x96\x81the", -3, TokenType::kNormal);
  add("\xe2\x96\x81", -10, TokenType::kNormal);
  add("a", -11, TokenType::kNormal);
  add("b", -12, TokenType::kNormal);
  add("ab", -4, TokenType::kNormal);
  add("bb", -5, TokenType::kNormal);
  add("<sep>", 0, TokenType::kUserDefined);
  vocabulary.bos = 1;
  vocabulary.eos = 2;
  vocabulary.unknown = 0;
  return vocabulary;
}

TEST(SentencePieceTokenizerTest, TinyVocabularyMergesAsWorkedOutByHand) {
  const Tokenizer tokenizer = *Tokenizer::from_vocabulary(tiny_vocabulary());
  const EncodeOptions plain{.add_special = false};
  // "▁the": ▁t (-1) merges first, then he (-2), then ▁t+he = ▁the (-3).
  EXPECT_THAT(tokenizer.encode("the", plain), ElementsAre(261));
  EXPECT_THAT(tokenizer.encode("the"), ElementsAre(1, 261));
  // "▁abb": ab (-4) beats bb (-5); then ▁ab and abb are not pieces.
  EXPECT_THAT(tokenizer.encode("abb", plain), ElementsAre(262, 265, 264));
  // "▁bbb": two bb pairs score the same; the leftmost merges.
  EXPECT_THAT(tokenizer.encode("bbb", plain), ElementsAre(262, 266, 264));
  // "c" and "é" are no pieces: byte fallback, byte b at id 3 + b.
  EXPECT_THAT(tokenizer.encode("c", plain), ElementsAre(262, 3 + 0x63));
  EXPECT_THAT(tokenizer.encode("\xc3\xa9", plain), ElementsAre(262, 3 + 0xC3, 3 + 0xA9));
  // " the": "▁▁the"; ▁▁ is no piece, so the second ▁ joins "the".
  EXPECT_THAT(tokenizer.encode(" the", plain), ElementsAre(262, 261));
  // A user-defined token is always matched, and text after it gets a space prefix again.
  EXPECT_THAT(tokenizer.encode("a<sep>the", plain), ElementsAre(262, 263, 267, 261));
  EXPECT_EQ(*tokenizer.decode(tokenizer.encode("a<sep>the")), "a<sep> the");
}

TEST(SentencePieceTokenizerTest, WithoutSpacePrefixTheFirstWordHasNoMarker) {
  Vocabulary vocabulary = tiny_vocabulary();
  vocabulary.add_space_prefix = false;
  const Tokenizer tokenizer = *Tokenizer::from_vocabulary(std::move(vocabulary));
  EXPECT_THAT(tokenizer.encode("the the", {.add_special = false}), ElementsAre(3 + 't', 260, 261));
  EXPECT_EQ(*tokenizer.decode(tokenizer.encode("the the")), "the the");
}

TEST(SentencePieceTokenizerTest, GeneratedVocabulariesRoundTripEveryKindOfText) {
  for (int64_t size : {259, 300, 2000, 32000}) {
    const Tokenizer tokenizer = *Tokenizer::from_vocabulary(*build_llama_vocabulary(size));
    for (const std::string& text : testing::round_trip_corpus()) {
      const std::vector<TokenId> ids = tokenizer.encode(text);
      ASSERT_FALSE(ids.empty());
      EXPECT_EQ(ids.front(), 1);
      for (TokenId id : ids) ASSERT_LT(id, size);
      EXPECT_EQ(*tokenizer.decode(ids), text) << size << " tokens: '" << text << "'";
    }
  }
}

TEST(SentencePieceTokenizerTest, LargerGeneratedVocabulariesCompressEnglishMore) {
  const std::string text = "The keeper had left his logbooks in a cupboard under the stairs.";
  size_t previous = std::numeric_limits<size_t>::max();
  for (int64_t size : {259, 400, 800, 32000}) {
    const Tokenizer tokenizer = *Tokenizer::from_vocabulary(*build_llama_vocabulary(size));
    const size_t count = tokenizer.encode(text).size();
    EXPECT_LT(count, previous) << size;
    previous = count;
  }
  // With every learned piece, each word of the training text is one piece.
  EXPECT_LE(previous, 13u);
}

// An independent, deliberately naive SentencePiece encoder: rescan every adjacent pair after
// each merge and merge the best (highest score, leftmost). Quadratic, obviously right.
class NaiveSentencePiece {
 public:
  explicit NaiveSentencePiece(const Vocabulary& vocabulary) : vocabulary_(vocabulary) {
    for (TokenId id = 0; id < vocabulary.size(); ++id) {
      const std::string& piece = vocabulary.tokens[id];
      if (vocabulary.types[id] == TokenType::kNormal) pieces_.emplace(piece, id);
      if (vocabulary.types[id] == TokenType::kByte) {
        bytes_[static_cast<uint8_t>(std::stoi(piece.substr(3, 2), nullptr, 16))] = id;
      }
    }
  }

  std::vector<TokenId> encode(std::string_view text) const {
    if (text.empty()) return {};  // no fragment, so no space prefix either
    const std::string space = "\xe2\x96\x81";
    std::string escaped = space;
    for (char c : text) escaped += c == ' ' ? space : std::string(1, c);
    std::vector<std::string> symbols;
    for (std::string_view character : split_utf8_characters(escaped)) {
      symbols.emplace_back(character);
    }
    while (true) {
      size_t best = symbols.size();
      float best_score = 0;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        const auto it = pieces_.find(symbols[i] + symbols[i + 1]);
        if (it == pieces_.end()) continue;
        const float score = vocabulary_.scores[it->second];
        if (best == symbols.size() || score > best_score) {
          best = i;
          best_score = score;
        }
      }
      if (best == symbols.size()) break;
      symbols[best] += symbols[best + 1];
      symbols.erase(symbols.begin() + best + 1);
    }
    std::vector<TokenId> ids;
    for (const std::string& symbol : symbols) {
      if (auto it = pieces_.find(symbol); it != pieces_.end()) {
        ids.push_back(it->second);
      } else {
        for (char byte : symbol) ids.push_back(bytes_.at(static_cast<uint8_t>(byte)));
      }
    }
    return ids;
  }

 private:
  const Vocabulary& vocabulary_;
  std::unordered_map<std::string, TokenId> pieces_;
  std::map<uint8_t, TokenId> bytes_;
};

std::string random_text(Xoshiro256StarStar& random) {
  static const std::string alphabet[] = {"a",
                                         "e",
                                         "t",
                                         "h",
                                         "o",
                                         "n",
                                         "s",
                                         "r",
                                         "i",
                                         "l",
                                         " ",
                                         " ",
                                         "  ",
                                         ".",
                                         ",",
                                         "T",
                                         "\n",
                                         "the",
                                         " the",
                                         "ing",
                                         "\xc3\xa9",
                                         "\xe6\x88\x91",
                                         "\xf0\x9f\xa6\x99",
                                         "\xff",
                                         "\xe4\xb8",
                                         "\xe2\x96\x81"};
  std::string text;
  const int length = static_cast<int>(random.next() % 40);
  for (int i = 0; i < length; ++i) text += alphabet[random.next() % std::size(alphabet)];
  return text;
}

TEST(SentencePieceTokenizerTest, MatchesANaiveReferenceOnRandomText) {
  std::vector<Vocabulary> vocabularies = {tiny_vocabulary(), *build_llama_vocabulary(32000)};
  if (std::filesystem::exists(kLlamaVocabularyPath)) {
    vocabularies.push_back(*read_vocabulary(*gguf::GgufFile::open(kLlamaVocabularyPath)));
  }
  Xoshiro256StarStar random(99);
  for (const Vocabulary& vocabulary : vocabularies) {
    const Tokenizer tokenizer = *Tokenizer::from_vocabulary(vocabulary);
    const NaiveSentencePiece naive(vocabulary);
    for (int trial = 0; trial < 300; ++trial) {
      const std::string text = random_text(random);
      ASSERT_EQ(tokenizer.encode(text, {.add_special = false}), naive.encode(text))
          << vocabulary.size() << " tokens: '" << text << "'";
    }
  }
}

TEST(SentencePieceTokenizerTest, VocabulariesThatCannotSpellAByteAreRejected) {
  Vocabulary vocabulary = tiny_vocabulary();
  vocabulary.types[3 + 0x41] = TokenType::kNormal;  // <0x41> is no longer a byte token
  vocabulary.unknown.reset();
  vocabulary.types[0] = TokenType::kNormal;
  EXPECT_THAT(Tokenizer::from_vocabulary(vocabulary).status().message(),
              HasSubstr("cannot spell byte 0x41"));
  Vocabulary malformed = tiny_vocabulary();
  malformed.tokens[3] = "<0xZZ>";
  EXPECT_THAT(Tokenizer::from_vocabulary(malformed).status().message(),
              HasSubstr("byte token 3 is '<0xZZ>'"));
}

}  // namespace
}  // namespace folio::tokenizer
