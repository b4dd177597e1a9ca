// Byte-level BPE: pre-tokenizer splits against hand-derived expectations for each pattern, a
// small vocabulary with hand-computed encodings, round trips of every kind of text, special
// tokens, and loading through GGUF metadata.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "folio/base/random.h"
#include "folio/gguf/gguf_file.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/tokenizer/pre_tokenizer.h"
#include "folio/tokenizer/tokenizer.h"
#include "folio/tokenizer/unicode.h"
#include "testing/round_trip_corpus.h"

namespace folio::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr PreTokenizerKind kEveryPreTokenizer[] = {
    PreTokenizerKind::kGpt2,       PreTokenizerKind::kLlama3, PreTokenizerKind::kQwen2,
    PreTokenizerKind::kDefault,    PreTokenizerKind::kFalcon, PreTokenizerKind::kStarcoder,
    PreTokenizerKind::kDeepseekLlm};

std::vector<std::string> split(PreTokenizerKind kind, std::string_view text) {
  const std::vector<std::string_view> words = pre_tokenize(kind, text);
  return {words.begin(), words.end()};
}

TEST(PreTokenizerTest, Gpt2Pattern) {
  EXPECT_THAT(split(PreTokenizerKind::kGpt2, "Hello world's  test 123abc!!\n\n"),
              ElementsAre("Hello", " world", "'s", " ", " test", " 123", "abc", "!!", "\n\n"));
  // Contractions are case-sensitive in GPT-2's pattern.
  EXPECT_THAT(split(PreTokenizerKind::kGpt2, "WE'VE we've"),
              ElementsAre("WE", "'", "VE", " we", "'ve"));
  EXPECT_THAT(split(PreTokenizerKind::kGpt2, "a\n b"), ElementsAre("a", "\n", " b"));
  EXPECT_THAT(split(PreTokenizerKind::kGpt2, "x ..."), ElementsAre("x", " ..."));
}

TEST(PreTokenizerTest, Gpt2PatternOnUnicodeAndInvalidBytes) {
  // 你好世界 are letters (Lo), ą ę letters (Ll), ½ a number (No), 🦙 neither.
  EXPECT_THAT(split(PreTokenizerKind::kGpt2,
                    "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c \xc4\x85\xc4\x99 \xc2\xbd"
                    "\xf0\x9f\xa6\x99"),
              ElementsAre("\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c", " \xc4\x85\xc4\x99",
                          " \xc2\xbd", "\xf0\x9f\xa6\x99"));
  // Invalid bytes belong to no class: they group like punctuation.
  EXPECT_THAT(split(PreTokenizerKind::kGpt2,
                    "\xff\xfe"
                    "ab \xc3"),
              ElementsAre("\xff\xfe", "ab", " \xc3"));
}

TEST(PreTokenizerTest, Llama3Pattern) {
  EXPECT_THAT(
      split(PreTokenizerKind::kLlama3, "Hello world's  test 12345abc!!\n\n x"),
      ElementsAre("Hello", " world", "'s", " ", " test", " ", "123", "45", "abc", "!!\n\n", " x"));
  // Contractions ignore case; one non-letter may lead a word; newlines end whitespace runs.
  EXPECT_THAT(split(PreTokenizerKind::kLlama3, "WE'VE\tgo  \n\n  end"),
              ElementsAre("WE", "'VE", "\tgo", "  \n\n", " ", " end"));
  EXPECT_THAT(split(PreTokenizerKind::kLlama3, "(x)"), ElementsAre("(x", ")"));
}

TEST(PreTokenizerTest, Qwen2PatternSplitsEveryDigit) {
  EXPECT_THAT(split(PreTokenizerKind::kQwen2, "a 2024!"),
              ElementsAre("a", " ", "2", "0", "2", "4", "!"));
}

// The pattern lists cut in turn; each later pattern sees only the pieces earlier ones left, and
// unmatched text between matches stays a piece (splits worked out by hand from the patterns in
// pre_tokenizer.h).
TEST(PreTokenizerTest, StarcoderSplitsDigitsBeforeGpt2) {
  // \p{N} first: "abc " ends a piece, so GPT-2's \s+ keeps its space alone, and " 1" never forms.
  EXPECT_THAT(split(PreTokenizerKind::kStarcoder, "abc 123 x"),
              ElementsAre("abc", " ", "1", "2", "3", " x"));
}

TEST(PreTokenizerTest, FalconCutsPunctuationThenThreeDigits) {
  EXPECT_THAT(split(PreTokenizerKind::kFalcon, "Hello, world!! 12345"),
              ElementsAre("Hello", ",", " world", "!!", " ", "123", "45"));
  // Falcon's punctuation class has the backtick; the default list's does not.
  EXPECT_THAT(split(PreTokenizerKind::kFalcon, "x `y`"), ElementsAre("x", " ", "`", "y", "`"));
  EXPECT_THAT(split(PreTokenizerKind::kDefault, "x `y`"), ElementsAre("x", " `", "y", "`"));
}

TEST(PreTokenizerTest, DefaultSplitsNumberRunsFromTheirSpace) {
  EXPECT_THAT(split(PreTokenizerKind::kDefault, "a+=b 12345"),
              ElementsAre("a", "+=", "b", " ", "123", "45"));
}

TEST(PreTokenizerTest, DeepseekLlmPatterns) {
  // [\r\n] alone; letters with one leading space; "." alone (a digit, not a space, precedes it);
  // 你好 by the CJK class; digit runs cut from the spaces around them.
  EXPECT_THAT(
      split(PreTokenizerKind::kDeepseekLlm, "Hello world\n  3.14 \xe4\xbd\xa0\xe5\xa5\xbd"),
      ElementsAre("Hello", " world", "\n", "  ", "3", ".", "14", " ", "\xe4\xbd\xa0\xe5\xa5\xbd"));
  // Greek letters are in the letter ranges; Khmer is not, but falls in the CJK class's wide
  // U+0800 range (without a leading space); trailing whitespace is one piece.
  EXPECT_THAT(split(PreTokenizerKind::kDeepseekLlm, "\xce\xb1\xce\xb2 \xe1\x9e\x80  "),
              ElementsAre("\xce\xb1\xce\xb2", " ", "\xe1\x9e\x80", "  "));
}

TEST(PreTokenizerTest, WordsAlwaysConcatenateToTheInput) {
  Xoshiro256StarStar random(1234);
  const std::string alphabet[] = {"a",
                                  "Z",
                                  "7",
                                  " ",
                                  "\n",
                                  "\r",
                                  "\t",
                                  "'",
                                  "s",
                                  "!",
                                  "\xc2\xbd",
                                  "\xe4\xbd\xa0",
                                  "\xf0\x9f\xa6\x99",
                                  "\xff",
                                  "\xc3",
                                  "\xe2\x80\x83"};
  for (int trial = 0; trial < 500; ++trial) {
    std::string text;
    const int length = static_cast<int>(random.next() % 24);
    for (int i = 0; i < length; ++i) text += alphabet[random.next() % std::size(alphabet)];
    for (PreTokenizerKind kind : kEveryPreTokenizer) {
      std::string joined;
      for (std::string_view word : pre_tokenize(kind, text)) {
        EXPECT_FALSE(word.empty());
        joined += word;
      }
      EXPECT_EQ(joined, text);
    }
  }
}

// GPT-2's byte-to-character map spells byte b as itself when printable, else as U+0100 + n.
std::string byte_character(uint8_t byte) {
  uint32_t substitute = 0x100;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    if (b == byte) {
      std::string out;
      append_utf8(printable ? b : substitute, out);
      return out;
    }
    if (!printable) ++substitute;
  }
  return {};
}

// Ids 0-255 spell single bytes (id == byte); then the merged pieces; then specials:
//   256 "Ġt"  (merge rank 0: "Ġ t")    257 "he"   (rank 1: "h e")
//   258 "Ġthe" (rank 2: "Ġt he")        259 "aa"   (rank 3: "a a")
//   (rank 4: "x y" makes "xy", which is not a piece)
//   260 "<|endoftext|>" control        261 "<|user|>" user-defined
Vocabulary small_bpe_vocabulary() {
  Vocabulary vocabulary;
  vocabulary.model = TokenizerModel::kBytePairEncoding;
  vocabulary.pre_tokenizer = PreTokenizerKind::kGpt2;
  for (int byte = 0; byte < 256; ++byte) vocabulary.tokens.push_back(byte_character(byte));
  const std::string g = byte_character(' ');  // "Ġ"
  for (const std::string& piece : {g + "t", std::string("he"), g + "the", std::string("aa")}) {
    vocabulary.tokens.push_back(piece);
  }
  vocabulary.tokens.push_back("<|endoftext|>");
  vocabulary.tokens.push_back("<|user|>");
  vocabulary.merges = {g + " t", "h e", g + "t he", "a a", "x y"};
  vocabulary.scores.assign(vocabulary.tokens.size(), 0.0f);
  vocabulary.types.assign(vocabulary.tokens.size(), TokenType::kNormal);
  vocabulary.types[260] = TokenType::kControl;
  vocabulary.types[261] = TokenType::kUserDefined;
  vocabulary.eos = 260;
  vocabulary.add_bos = false;
  vocabulary.add_space_prefix = false;
  return vocabulary;
}

TEST(ByteLevelBpeTokenizerTest, SmallVocabularyEncodesAsWorkedOutByHand) {
  const Tokenizer tokenizer = *Tokenizer::from_vocabulary(small_bpe_vocabulary());
  // "the": t h e; "h e" (rank 1) merges; "t he" is no merge.
  EXPECT_THAT(tokenizer.encode("the"), ElementsAre('t', 257));
  // " the": Ġ t h e; "Ġ t" (rank 0) first, then "h e", then "Ġt he".
  EXPECT_THAT(tokenizer.encode(" the"), ElementsAre(258));
  EXPECT_THAT(tokenizer.encode("the the"), ElementsAre('t', 257, 258));
  // Equal ranks: the leftmost pair merges first.
  EXPECT_THAT(tokenizer.encode("aaa"), ElementsAre(259, 'a'));
  // "x y" merges, but "xy" is no piece: it is spelled byte by byte.
  EXPECT_THAT(tokenizer.encode("xy"), ElementsAre('x', 'y'));
  // Bytes outside printable ASCII use their own single-byte pieces.
  EXPECT_THAT(tokenizer.encode("\n\xff"), ElementsAre('\n', 0xff));
  // No space prefix and no BOS for this vocabulary; EOS is not added either.
  EXPECT_EQ(*tokenizer.decode(tokenizer.encode(" the")), " the");
}

TEST(ByteLevelBpeTokenizerTest, SpecialTokensAreMatchedBeforePreTokenizing) {
  const Tokenizer tokenizer = *Tokenizer::from_vocabulary(small_bpe_vocabulary());
  EXPECT_THAT(tokenizer.encode("the<|endoftext|>", {.parse_special = true}),
              ElementsAre('t', 257, 260));
  const std::vector<TokenId> literal = tokenizer.encode("the<|endoftext|>");
  EXPECT_EQ(literal.size(), 2u + 13u);  // "<|endoftext|>" spelled byte by byte
  // User-defined tokens always match.
  EXPECT_THAT(tokenizer.encode("<|user|> the"), ElementsAre(261, 258));
  EXPECT_TRUE(tokenizer.is_special(260));
  EXPECT_TRUE(tokenizer.is_special(261));
  EXPECT_FALSE(tokenizer.is_special(258));
  EXPECT_TRUE(tokenizer.is_end_of_generation(260));
  EXPECT_EQ(*tokenizer.decode(std::vector<TokenId>{258, 260}), " the");
  EXPECT_EQ(*tokenizer.decode(std::vector<TokenId>{258, 260}, {.render_special = true}),
            " the<|endoftext|>");
}

TEST(ByteLevelBpeTokenizerTest, RoundTripsEveryKindOfTextWithEveryPreTokenizer) {
  for (PreTokenizerKind kind : kEveryPreTokenizer) {
    Vocabulary vocabulary = small_bpe_vocabulary();
    vocabulary.pre_tokenizer = kind;
    const Tokenizer tokenizer = *Tokenizer::from_vocabulary(std::move(vocabulary));
    for (const std::string& text : testing::round_trip_corpus()) {
      EXPECT_EQ(*tokenizer.decode(tokenizer.encode(text)), text) << "'" << text << "'";
    }
  }
}

TEST(ByteLevelBpeTokenizerTest, LoadsFromGgufMetadata) {
  gguf::GgufWriter writer;
  Vocabulary vocabulary = small_bpe_vocabulary();
  vocabulary.pre_tokenizer = PreTokenizerKind::kLlama3;
  write_vocabulary_metadata(vocabulary, writer);
  const gguf::GgufFile file = *gguf::GgufFile::parse_owned(*writer.write_to_buffer());
  EXPECT_EQ(*file.get_string("tokenizer.ggml.pre"), "llama-bpe");
  Result<Tokenizer> tokenizer = Tokenizer::from_gguf(file);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  EXPECT_EQ(tokenizer->model(), TokenizerModel::kBytePairEncoding);
  EXPECT_EQ(tokenizer->vocabulary().pre_tokenizer, PreTokenizerKind::kLlama3);
  EXPECT_THAT(tokenizer->encode("the the"), ElementsAre('t', 257, 258));
}

// Llama 3 takes a word that is a whole piece as it is (Hugging Face's ignore_merges), even when
// no merge sequence builds it; the other pre-tokenizers merge.
TEST(ByteLevelBpeTokenizerTest, Llama3TakesWholePiecesUnmerged) {
  for (PreTokenizerKind kind : kEveryPreTokenizer) {
    Vocabulary vocabulary = small_bpe_vocabulary();
    vocabulary.pre_tokenizer = kind;
    vocabulary.tokens.push_back("abc");  // id 262; no merge makes it
    vocabulary.scores.push_back(0.0f);
    vocabulary.types.push_back(TokenType::kNormal);
    const Tokenizer tokenizer = *Tokenizer::from_vocabulary(std::move(vocabulary));
    if (kind == PreTokenizerKind::kLlama3) {
      EXPECT_THAT(tokenizer.encode("abc"), ElementsAre(262));
    } else {
      EXPECT_THAT(tokenizer.encode("abc"), ElementsAre('a', 'b', 'c')) << pre_tokenizer_name(kind);
    }
    // A word that is no piece is merged as usual: "aa" then "b".
    EXPECT_THAT(tokenizer.encode("aab"), ElementsAre(259, 'b')) << pre_tokenizer_name(kind);
  }
}

// Real vocabularies lack some bytes (StarCoder's and Falcon's: those that never occur in valid
// UTF-8, and Falcon's some control characters); llama.cpp drops such a byte, and so does Folio.
TEST(ByteLevelBpeTokenizerTest, ByteWithoutAPieceIsDropped) {
  Vocabulary vocabulary = small_bpe_vocabulary();
  vocabulary.tokens[0x41] = "not A";
  Result<Tokenizer> tokenizer = Tokenizer::from_vocabulary(std::move(vocabulary));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  EXPECT_THAT(tokenizer->encode("bAc"), ElementsAre('b', 'c'));
}

// A byte whose character is only a user-defined token's text is spelled by that token, as
// llama.cpp's lookup of leftover symbols finds it (DeepSeek LLM's "À" for byte 0xC0).
TEST(ByteLevelBpeTokenizerTest, ByteSpelledOnlyByAUserDefinedTokenUsesIt) {
  // Byte 0xC0 (never in valid UTF-8, so the input's own text cannot match the token's "À").
  Vocabulary vocabulary = small_bpe_vocabulary();
  const std::string mapped_character = vocabulary.tokens[0xC0];
  vocabulary.tokens[0xC0] = "not the byte";
  vocabulary.tokens.push_back(mapped_character);
  vocabulary.scores.push_back(0.0f);
  vocabulary.types.push_back(TokenType::kUserDefined);
  Result<Tokenizer> tokenizer = Tokenizer::from_vocabulary(std::move(vocabulary));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  EXPECT_THAT(tokenizer->encode("b\xc0"
                                "c"),
              ElementsAre('b', 262, 'c'));
}

}  // namespace
}  // namespace folio::tokenizer
