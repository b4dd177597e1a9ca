// UTF-8 and Unicode helpers for the tokenizers.
//
// Decoding is strict (RFC 3629): overlong forms, surrogates, code points above U+10FFFF, stray
// continuation bytes and sequences cut short are invalid, and each invalid byte stands alone as
// a one-byte unit. Tokenizers keep every input byte (invalid ones too) and reach it through byte
// tokens, so decode(encode(text)) == text for any bytes, not only valid UTF-8.
//
// Character classes follow the regular-expression classes the BPE pre-tokenizers use:
//   letter  \p{L}: general category L* (table generated from Unicode data, unicode_tables.inc)
//   number  \p{N}: general category N*
//   punctuation \p{P}: general category P* (only some pre-tokenizers ask; in the other
//           patterns it is simply neither a letter nor a number)
//   space   \s:    the White_Space property
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace folio::tokenizer {

inline constexpr uint32_t kInvalidCodePoint = 0xFFFFFFFF;

struct Utf8Unit {
  uint32_t code_point;  // kInvalidCodePoint for an invalid byte
  size_t length;        // bytes consumed: 1-4 (1 for an invalid byte)
};

// The unit starting at text[position]. Requires: position < text.size().
Utf8Unit decode_utf8(std::string_view text, size_t position);

// Splits text into characters (valid sequences) and single invalid bytes, in order. The views
// point into `text`.
std::vector<std::string_view> split_utf8_characters(std::string_view text);

// Appends the UTF-8 encoding of a code point. Requires: code_point <= 0x10FFFF, not a surrogate.
void append_utf8(uint32_t code_point, std::string& out);

enum class CharacterClass : uint8_t { kOther, kLetter, kNumber, kPunctuation };
CharacterClass character_class(uint32_t code_point);  // kOther for kInvalidCodePoint
bool is_letter(uint32_t code_point);
bool is_number(uint32_t code_point);
bool is_punctuation(uint32_t code_point);
bool is_whitespace(uint32_t code_point);

// Length of the longest prefix of `bytes` that does not end inside a UTF-8 sequence that more
// bytes could still complete. Bytes that can never become valid are not held back. Used to
// stream decoded text: emit bytes[0, result), keep the rest for the next token.
size_t complete_utf8_prefix_length(std::string_view bytes);

}  // namespace folio::tokenizer
