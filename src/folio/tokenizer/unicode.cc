#include "folio/tokenizer/unicode.h"

#include <algorithm>
#include <iterator>

#include "folio/base/check.h"

namespace folio::tokenizer {

namespace {

struct ClassRange {
  uint32_t first;
  uint32_t last;
  CharacterClass character_class;
};
constexpr CharacterClass kLetter = CharacterClass::kLetter;
constexpr CharacterClass kNumber = CharacterClass::kNumber;
constexpr CharacterClass kPunctuation = CharacterClass::kPunctuation;
constexpr ClassRange kClassRanges[] = {
#include "folio/tokenizer/unicode_tables.inc"
};

bool is_continuation(uint8_t byte) {
  return (byte & 0xC0) == 0x80;
}

// Expected sequence length from a lead byte; 0 for bytes that cannot start a sequence.
size_t sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;  // continuation bytes, C0/C1 (always overlong), F5-FF (beyond U+10FFFF)
}

// Whether `second` may follow `lead` (excludes overlongs, surrogates and > U+10FFFF early, so
// a sequence is rejected as soon as its second byte shows it cannot be valid).
bool valid_second_byte(uint8_t lead, uint8_t second) {
  if (!is_continuation(second)) return false;
  if (lead == 0xE0) return second >= 0xA0;
  if (lead == 0xED) return second <= 0x9F;
  if (lead == 0xF0) return second >= 0x90;
  if (lead == 0xF4) return second <= 0x8F;
  return true;
}

}  // namespace

Utf8Unit decode_utf8(std::string_view text, size_t position) {
  FOLIO_DCHECK(position < text.size());
  const auto lead = static_cast<uint8_t>(text[position]);
  const size_t length = sequence_length(lead);
  if (length == 1) return {lead, 1};
  if (length == 0 || position + length > text.size()) return {kInvalidCodePoint, 1};
  if (!valid_second_byte(lead, static_cast<uint8_t>(text[position + 1]))) {
    return {kInvalidCodePoint, 1};
  }
  uint32_t code_point = lead & (0xFF >> (length + 1));
  for (size_t i = 1; i < length; ++i) {
    const auto byte = static_cast<uint8_t>(text[position + i]);
    if (!is_continuation(byte)) return {kInvalidCodePoint, 1};
    code_point = code_point << 6 | (byte & 0x3F);
  }
  return {code_point, length};
}

std::vector<std::string_view> split_utf8_characters(std::string_view text) {
  std::vector<std::string_view> characters;
  characters.reserve(text.size());
  for (size_t position = 0; position < text.size();) {
    const size_t length = decode_utf8(text, position).length;
    characters.push_back(text.substr(position, length));
    position += length;
  }
  return characters;
}

void append_utf8(uint32_t code_point, std::string& out) {
  FOLIO_DCHECK(code_point <= 0x10FFFF && (code_point < 0xD800 || code_point > 0xDFFF));
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | code_point >> 6);
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | code_point >> 12);
    out += static_cast<char>(0x80 | (code_point >> 6 & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | code_point >> 18);
    out += static_cast<char>(0x80 | (code_point >> 12 & 0x3F));
    out += static_cast<char>(0x80 | (code_point >> 6 & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

CharacterClass character_class(uint32_t code_point) {
  if (code_point < 0x80) {  // the common case, without a search
    if (code_point >= '0' && code_point <= '9') return CharacterClass::kNumber;
    const uint32_t lower = code_point | 0x20;
    if (lower >= 'a' && lower <= 'z') return CharacterClass::kLetter;
    // ASCII punctuation (P*); $ + < = > ^ ` | ~ are symbols (S*), and controls and space other.
    switch (code_point) {
      case '!':
      case '"':
      case '#':
      case '%':
      case '&':
      case '\'':
      case '(':
      case ')':
      case '*':
      case ',':
      case '-':
      case '.':
      case '/':
      case ':':
      case ';':
      case '?':
      case '@':
      case '[':
      case '\\':
      case ']':
      case '_':
      case '{':
      case '}':
        return CharacterClass::kPunctuation;
      default:
        return CharacterClass::kOther;
    }
  }
  if (code_point == kInvalidCodePoint) return CharacterClass::kOther;
  // The first range whose last code point is >= code_point.
  const auto* range = std::lower_bound(
      std::begin(kClassRanges), std::end(kClassRanges), code_point,
      [](const ClassRange& candidate, uint32_t value) { return candidate.last < value; });
  if (range != std::end(kClassRanges) && range->first <= code_point) {
    return range->character_class;
  }
  return CharacterClass::kOther;
}

bool is_letter(uint32_t code_point) {
  return character_class(code_point) == CharacterClass::kLetter;
}

bool is_number(uint32_t code_point) {
  return character_class(code_point) == CharacterClass::kNumber;
}

bool is_punctuation(uint32_t code_point) {
  return character_class(code_point) == CharacterClass::kPunctuation;
}

bool is_whitespace(uint32_t code_point) {
  switch (code_point) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return code_point >= 0x2000 && code_point <= 0x200A;
  }
}

size_t complete_utf8_prefix_length(std::string_view bytes) {
  // Only the last three bytes can belong to an unfinished sequence.
  const size_t start = bytes.size() > 3 ? bytes.size() - 3 : 0;
  for (size_t lead_position = start; lead_position < bytes.size(); ++lead_position) {
    const auto lead = static_cast<uint8_t>(bytes[lead_position]);
    const size_t length = sequence_length(lead);
    const size_t available = bytes.size() - lead_position;
    if (length <= 1 || available >= length) continue;
    // An unfinished sequence is held back only if what is there could still become valid.
    bool viable =
        available < 2 || valid_second_byte(lead, static_cast<uint8_t>(bytes[lead_position + 1]));
    for (size_t i = 2; viable && i < available; ++i) {
      viable = is_continuation(static_cast<uint8_t>(bytes[lead_position + i]));
    }
    if (viable) return lead_position;
  }
  return bytes.size();
}

}  // namespace folio::tokenizer
