// Vocabularies: the generated SentencePiece vocabulary's layout and determinism, metadata round
// trips, and read errors that name the key at fault.
#include "folio/tokenizer/vocabulary.h"

#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "folio/gguf/gguf_file.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/tokenizer/spm_vocabulary_builder.h"

namespace folio::tokenizer {
namespace {

using ::testing::HasSubstr;

void expect_same(const Vocabulary& a, const Vocabulary& b) {
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.pre_tokenizer, b.pre_tokenizer);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.scores, b.scores);
  EXPECT_EQ(a.types, b.types);
  EXPECT_EQ(a.merges, b.merges);
  EXPECT_EQ(a.bos, b.bos);
  EXPECT_EQ(a.eos, b.eos);
  EXPECT_EQ(a.unknown, b.unknown);
  EXPECT_EQ(a.padding, b.padding);
  EXPECT_EQ(a.add_bos, b.add_bos);
  EXPECT_EQ(a.add_eos, b.add_eos);
  EXPECT_EQ(a.add_space_prefix, b.add_space_prefix);
}

TEST(GeneratedVocabularyTest, HasTheDocumentedLayout) {
  const Vocabulary vocabulary = *build_llama_vocabulary(32000);
  ASSERT_EQ(vocabulary.size(), 32000);
  EXPECT_EQ(vocabulary.tokens[0], "<unk>");
  EXPECT_EQ(vocabulary.types[0], TokenType::kUnknown);
  EXPECT_EQ(vocabulary.tokens[1], "<s>");
  EXPECT_EQ(vocabulary.types[1], TokenType::kControl);
  EXPECT_EQ(vocabulary.tokens[2], "</s>");
  EXPECT_EQ(vocabulary.tokens[3 + 0x0A], "<0x0A>");
  EXPECT_EQ(vocabulary.tokens[258], "<0xFF>");
  EXPECT_EQ(vocabulary.types[258], TokenType::kByte);
  EXPECT_EQ(vocabulary.tokens[259], "\xe2\x96\x81");  // the most frequent character: a space
  std::set<std::string> unique(vocabulary.tokens.begin(), vocabulary.tokens.end());
  EXPECT_EQ(unique.size(), vocabulary.tokens.size());
  for (int64_t id = 260; id < vocabulary.size(); ++id) {
    EXPECT_EQ(vocabulary.types[id], TokenType::kNormal);
    ASSERT_LT(vocabulary.scores[id], vocabulary.scores[id - 1]) << id;
  }
  // Words of the embedded text are whole pieces; fillers follow the learned pieces.
  EXPECT_TRUE(unique.contains("\xe2\x96\x81lighthouse"));
  EXPECT_TRUE(
      unique.contains("\xe2\x96\x81"
                      "caf\xc3\xa9"));
  const int64_t first_filler = 259 + learned_piece_count();
  std::set<std::string> learned(vocabulary.tokens.begin() + 259,
                                vocabulary.tokens.begin() + first_filler);
  std::string expected_filler;
  for (char letter = 'a'; letter <= 'z' && expected_filler.empty(); ++letter) {
    const std::string piece = std::string("\xe2\x96\x81") + letter;
    if (!learned.contains(piece)) expected_filler = piece;
  }
  EXPECT_EQ(vocabulary.tokens[first_filler], expected_filler);
  EXPECT_TRUE(validate_vocabulary(vocabulary).ok());
}

TEST(GeneratedVocabularyTest, IsDeterministicAndSmallerSizesArePrefixes) {
  const Vocabulary large = *build_llama_vocabulary(5000);
  expect_same(large, *build_llama_vocabulary(5000));
  for (int64_t size : {259, 260, 400, 1226, 1227, 4999}) {
    const Vocabulary small = *build_llama_vocabulary(size);
    ASSERT_EQ(small.size(), size);
    EXPECT_TRUE(std::equal(small.tokens.begin(), small.tokens.end(), large.tokens.begin())) << size;
    EXPECT_TRUE(std::equal(small.scores.begin(), small.scores.end(), large.scores.begin())) << size;
  }
  EXPECT_EQ(build_llama_vocabulary(258).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(build_llama_vocabulary(2'000'000).status().code(), StatusCode::kInvalidArgument);
}

Vocabulary small_bpe() {
  Vocabulary vocabulary;
  vocabulary.model = TokenizerModel::kBytePairEncoding;
  vocabulary.pre_tokenizer = PreTokenizerKind::kQwen2;
  vocabulary.tokens = {"a", "b", "ab", "<|end|>"};
  vocabulary.scores = {0, 0, 0, 0};
  vocabulary.types = {TokenType::kNormal, TokenType::kNormal, TokenType::kNormal,
                      TokenType::kControl};
  vocabulary.merges = {"a b"};
  vocabulary.eos = 3;
  vocabulary.end_of_turn = 3;
  vocabulary.add_bos = false;
  vocabulary.add_space_prefix = false;
  return vocabulary;
}

TEST(VocabularyTest, MetadataRoundTripsForBothModels) {
  for (const Vocabulary& vocabulary : {*build_llama_vocabulary(300), small_bpe()}) {
    gguf::GgufWriter writer;
    write_vocabulary_metadata(vocabulary, writer);
    const gguf::GgufFile file = *gguf::GgufFile::parse_owned(*writer.write_to_buffer());
    Result<Vocabulary> read = read_vocabulary(file);
    ASSERT_TRUE(read.ok()) << read.status().to_string();
    expect_same(*read, vocabulary);
    EXPECT_EQ(read->end_of_turn, vocabulary.end_of_turn);
  }
}

// Every pre-tokenizer is written under a name that reads back as itself; a file without the
// key reads as llama.cpp's "default".
TEST(VocabularyTest, PreTokenizerNamesRoundTrip) {
  for (PreTokenizerKind kind :
       {PreTokenizerKind::kGpt2, PreTokenizerKind::kLlama3, PreTokenizerKind::kQwen2,
        PreTokenizerKind::kDefault, PreTokenizerKind::kFalcon, PreTokenizerKind::kStarcoder,
        PreTokenizerKind::kDeepseekLlm}) {
    Vocabulary vocabulary = small_bpe();
    vocabulary.pre_tokenizer = kind;
    gguf::GgufWriter writer;
    write_vocabulary_metadata(vocabulary, writer);
    Result<Vocabulary> read =
        read_vocabulary(*gguf::GgufFile::parse_owned(*writer.write_to_buffer()));
    ASSERT_TRUE(read.ok()) << read.status().to_string();
    EXPECT_EQ(read->pre_tokenizer, kind) << pre_tokenizer_name(kind);
  }
  gguf::GgufWriter writer;
  writer.set("tokenizer.ggml.model", gguf::GgufValue::of_string("gpt2"));
  writer.set("tokenizer.ggml.tokens", gguf::GgufValue::array_of_strings({"a", "b", "ab"}));
  writer.set("tokenizer.ggml.merges", gguf::GgufValue::array_of_strings({"a b"}));
  Result<Vocabulary> read =
      read_vocabulary(*gguf::GgufFile::parse_owned(*writer.write_to_buffer()));
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(read->pre_tokenizer, PreTokenizerKind::kDefault);
}

// A byte-level file with only the keys a minimal converter writes.
gguf::GgufFile minimal_bpe_file(std::string_view pre, bool with_add_bos_key) {
  gguf::GgufWriter writer;
  writer.set("tokenizer.ggml.model", gguf::GgufValue::of_string("gpt2"));
  writer.set("tokenizer.ggml.pre", gguf::GgufValue::of_string(std::string(pre)));
  writer.set("tokenizer.ggml.tokens", gguf::GgufValue::array_of_strings({"a", "b", "ab", "<s>"}));
  writer.set("tokenizer.ggml.merges", gguf::GgufValue::array_of_strings({"a b"}));
  writer.set("tokenizer.ggml.bos_token_id", gguf::GgufValue::of(uint32_t{3}));
  if (with_add_bos_key) writer.set("tokenizer.ggml.add_bos_token", gguf::GgufValue::of(false));
  return *gguf::GgufFile::parse_owned(*writer.write_to_buffer());
}

// As llama.cpp: the Llama 3 names add BOS unless the file has tokenizer.ggml.add_bos_token;
// other byte-level vocabularies add none unless it says so.
TEST(VocabularyTest, Llama3AddsBosUnlessTheFileSaysOtherwise) {
  EXPECT_TRUE(read_vocabulary(minimal_bpe_file("llama-bpe", false))->add_bos);
  EXPECT_FALSE(read_vocabulary(minimal_bpe_file("llama-bpe", true))->add_bos);
  EXPECT_FALSE(read_vocabulary(minimal_bpe_file("gpt-2", false))->add_bos);
}

// A file with small_bpe()'s metadata, then `edit` applied to the writer.
Status read_with(void (*edit)(gguf::GgufWriter&)) {
  gguf::GgufWriter writer;
  write_vocabulary_metadata(small_bpe(), writer);
  edit(writer);
  return read_vocabulary(*gguf::GgufFile::parse_owned(*writer.write_to_buffer(), "v.gguf"))
      .status();
}

TEST(VocabularyTest, ReadErrorsNameTheKey) {
  struct Case {
    void (*edit)(gguf::GgufWriter&);
    const char* message;
  };
  const Case cases[] = {
      {[](gguf::GgufWriter& w) {
         w.set("tokenizer.ggml.model", gguf::GgufValue::of_string("bert"));
       },
       "tokenizer.ggml.model 'bert' is not supported"},
      {[](gguf::GgufWriter& w) {
         w.set("tokenizer.ggml.pre", gguf::GgufValue::of_string("tekken"));
       },
       "tokenizer.ggml.pre 'tekken' is not a pre-tokenizer Folio knows"},
      {[](gguf::GgufWriter& w) {
         w.set("tokenizer.ggml.tokens", gguf::GgufValue::of<uint32_t>(1));
       },
       "'tokenizer.ggml.tokens' is a uint32, expected an array of string"},
      {[](gguf::GgufWriter& w) {
         const std::array<float, 2> scores = {0, 0};
         w.set("tokenizer.ggml.scores", gguf::GgufValue::array_of<float>(scores));
       },
       "tokenizer.ggml.scores has 2 entries for 4 tokens"},
      {[](gguf::GgufWriter& w) {
         const std::array<float, 4> scores = {0, NAN, 0, 0};
         w.set("tokenizer.ggml.scores", gguf::GgufValue::array_of<float>(scores));
       },
       "tokenizer.ggml.scores[1] is not finite"},
      {[](gguf::GgufWriter& w) {
         const std::array<int32_t, 4> types = {1, 1, 9, 3};
         w.set("tokenizer.ggml.token_type", gguf::GgufValue::array_of<int32_t>(types));
       },
       "tokenizer.ggml.token_type[2] = 9 is not a token type"},
      {[](gguf::GgufWriter& w) {
         w.set("tokenizer.ggml.eos_token_id", gguf::GgufValue::of<uint32_t>(4));
       },
       "tokenizer.ggml.eos_token_id = 4 is outside the vocabulary of 4 tokens"},
      {[](gguf::GgufWriter& w) {
         w.set("tokenizer.ggml.merges", gguf::GgufValue::array_of_strings({"ab"}));
       },
       "tokenizer.ggml.merges[0] 'ab' is not two pieces separated by a space"},
      {[](gguf::GgufWriter& w) {
         w.set("tokenizer.ggml.add_bos_token", gguf::GgufValue::of(true));
       },
       "adds a BOS token but has no BOS id"},
  };
  for (const Case& c : cases) {
    const Status status = read_with(c.edit);
    EXPECT_FALSE(status.ok()) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
    EXPECT_THAT(status.message(), HasSubstr("v.gguf"));
  }
  gguf::GgufWriter empty;
  const Status missing =
      read_vocabulary(*gguf::GgufFile::parse_owned(*empty.write_to_buffer())).status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("'tokenizer.ggml.model' is missing"));
}

TEST(VocabularyTest, NegativeOrAllOnesIdsMeanNoToken) {
  const Status status = read_with([](gguf::GgufWriter& w) {
    w.set("tokenizer.ggml.padding_token_id", gguf::GgufValue::of<int32_t>(-1));
    w.set("tokenizer.ggml.bos_token_id", gguf::GgufValue::of<uint32_t>(0xFFFFFFFF));
  });
  EXPECT_TRUE(status.ok()) << status.to_string();
}

}  // namespace
}  // namespace folio::tokenizer
