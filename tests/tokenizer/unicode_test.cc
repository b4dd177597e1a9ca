// UTF-8 decoding is strict, character classes follow Unicode's categories, and the streaming
// helper holds back exactly the bytes more input could still complete.
#include "folio/tokenizer/unicode.h"

#include <gtest/gtest.h>

namespace folio::tokenizer {
namespace {

TEST(UnicodeTest, DecodesValidSequencesOfEveryLength) {
  EXPECT_EQ(decode_utf8("A", 0).code_point, 0x41u);
  EXPECT_EQ(decode_utf8("\xc3\xa9", 0).code_point, 0xE9u);
  EXPECT_EQ(decode_utf8("\xc3\xa9", 0).length, 2u);
  EXPECT_EQ(decode_utf8("\xe2\x96\x81", 0).code_point, 0x2581u);
  EXPECT_EQ(decode_utf8("\xf0\x9f\xa6\x99", 0).code_point, 0x1F999u);
  EXPECT_EQ(decode_utf8("\xf4\x8f\xbf\xbf", 0).code_point, 0x10FFFFu);
  std::string encoded;
  for (uint32_t code_point : {0x41u, 0xE9u, 0x2581u, 0x1F999u, 0x10FFFFu}) {
    encoded.clear();
    append_utf8(code_point, encoded);
    EXPECT_EQ(decode_utf8(encoded, 0).code_point, code_point);
    EXPECT_EQ(decode_utf8(encoded, 0).length, encoded.size());
  }
}

TEST(UnicodeTest, EveryInvalidByteStandsAlone) {
  for (std::string_view invalid : {
           std::string_view("\x80"),              // stray continuation
           std::string_view("\xc0\xaf"),          // overlong '/'
           std::string_view("\xe0\x80\xaf"),      // overlong, 3 bytes
           std::string_view("\xed\xa0\x80"),      // surrogate U+D800
           std::string_view("\xf4\x90\x80\x80"),  // above U+10FFFF
           std::string_view("\xf8\x88\x80\x80"),  // 5-byte form
           std::string_view("\xe4\xb8"),          // cut short
           std::string_view("\xe4\x41\x42"),      // continuation missing
       }) {
    EXPECT_EQ(decode_utf8(invalid, 0).code_point, kInvalidCodePoint) << invalid.size();
    EXPECT_EQ(decode_utf8(invalid, 0).length, 1u);
  }
  const std::vector<std::string_view> pieces = split_utf8_characters(
      "a\xe4\xb8"
      "b\xc3\xa9");
  ASSERT_EQ(pieces.size(), 5u);
  EXPECT_EQ(pieces[1], "\xe4");
  EXPECT_EQ(pieces[4], "\xc3\xa9");
}

TEST(UnicodeTest, CharacterClassesFollowUnicodeCategories) {
  for (uint32_t letter :
       {0x61u, 0x5Au, 0xAAu, 0xE9u, 0x105u, 0x416u, 0x5D0u, 0x4E2Du, 0xAC00u, 0x3042u, 0x1D400u}) {
    EXPECT_TRUE(is_letter(letter)) << std::hex << letter;
    EXPECT_FALSE(is_number(letter)) << std::hex << letter;
  }
  for (uint32_t number : {0x30u, 0x39u, 0xB2u, 0xBDu, 0x663u, 0x2163u, 0xFF11u, 0x1D7CEu}) {
    EXPECT_TRUE(is_number(number)) << std::hex << number;
    EXPECT_FALSE(is_letter(number)) << std::hex << number;
  }
  for (uint32_t other :
       {0x20u, 0x24u, 0x2Bu, 0x7Eu, 0xFF5Eu, 0x2581u, 0x1F999u, 0x301u, kInvalidCodePoint}) {
    EXPECT_EQ(character_class(other), CharacterClass::kOther) << std::hex << other;
  }
  // P*: ASCII punctuation (not the symbols $ + ~ above), dashes, quotes, CJK and fullwidth marks.
  for (uint32_t punctuation : {0x21u, 0x5Fu, 0x7Bu, 0x2014u, 0x2018u, 0x3002u, 0xFF01u, 0x58Au}) {
    EXPECT_TRUE(is_punctuation(punctuation)) << std::hex << punctuation;
    EXPECT_EQ(character_class(punctuation), CharacterClass::kPunctuation)
        << std::hex << punctuation;
  }
  for (uint32_t space : {0x9u, 0xAu, 0xDu, 0x20u, 0x85u, 0xA0u, 0x2003u, 0x3000u}) {
    EXPECT_TRUE(is_whitespace(space)) << std::hex << space;
  }
  for (uint32_t not_space : {0x41u, 0x200Bu, 0x2581u, 0x1Fu}) {
    EXPECT_FALSE(is_whitespace(not_space)) << std::hex << not_space;
  }
}

TEST(UnicodeTest, CompletePrefixHoldsBackOnlyCharactersThatCanStillComplete) {
  EXPECT_EQ(complete_utf8_prefix_length(""), 0u);
  EXPECT_EQ(complete_utf8_prefix_length("abc"), 3u);
  EXPECT_EQ(complete_utf8_prefix_length("a\xe4\xb8"), 1u);
  EXPECT_EQ(complete_utf8_prefix_length("a\xe4\xb8\xad"), 4u);
  EXPECT_EQ(complete_utf8_prefix_length("\xf0\x9f\xa6"), 0u);
  EXPECT_EQ(complete_utf8_prefix_length("\xf0"), 0u);
  EXPECT_EQ(complete_utf8_prefix_length("a\xff"), 2u);     // can never be valid
  EXPECT_EQ(complete_utf8_prefix_length("\xe4\x41"), 2u);  // already broken
  EXPECT_EQ(complete_utf8_prefix_length("\xed\xa0"), 2u);  // would be a surrogate
  EXPECT_EQ(complete_utf8_prefix_length("\x80\x80"), 2u);  // stray continuations
}

}  // namespace
}  // namespace folio::tokenizer
