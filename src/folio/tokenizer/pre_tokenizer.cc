#include "folio/tokenizer/pre_tokenizer.h"

#include "folio/tokenizer/unicode.h"

namespace folio::tokenizer {

namespace {

// The text as code points, each with the byte offset where it starts.
class CodePoints {
 public:
  explicit CodePoints(std::string_view text) {
    for (size_t position = 0; position < text.size();) {
      const Utf8Unit unit = decode_utf8(text, position);
      code_points_.push_back(unit.code_point);
      offsets_.push_back(position);
      position += unit.length;
    }
    offsets_.push_back(text.size());
  }
  size_t size() const { return code_points_.size(); }
  size_t offset(size_t index) const { return offsets_[index]; }
  // kInvalidCodePoint past the end, which belongs to no class and is not whitespace.
  uint32_t at(size_t index) const {
    return index < code_points_.size() ? code_points_[index] : kInvalidCodePoint;
  }
  bool letter(size_t index) const { return index < size() && is_letter(at(index)); }
  bool number(size_t index) const { return index < size() && is_number(at(index)); }
  bool space(size_t index) const { return index < size() && is_whitespace(at(index)); }
  bool other(size_t index) const {  // [^\s\p{L}\p{N}]
    return index < size() && !is_whitespace(at(index)) &&
           character_class(at(index)) == CharacterClass::kOther;
  }
  bool newline(size_t index) const { return at(index) == '\r' || at(index) == '\n'; }

 private:
  std::vector<uint32_t> code_points_;
  std::vector<size_t> offsets_;
};

uint32_t ascii_lower(uint32_t c) {
  return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

// 's 't 're 've 'm 'll 'd: length in code points, 0 when none matches.
size_t match_contraction(const CodePoints& text, size_t i, bool ignore_case) {
  if (text.at(i) != '\'') return 0;
  auto letter_at = [&](size_t index) {
    return ignore_case ? ascii_lower(text.at(index)) : text.at(index);
  };
  const uint32_t first = letter_at(i + 1);
  if (first == 's' || first == 't' || first == 'm' || first == 'd') return 2;
  const uint32_t second = letter_at(i + 2);
  if ((first == 'r' && second == 'e') || (first == 'v' && second == 'e') ||
      (first == 'l' && second == 'l')) {
    return 3;
  }
  return 0;
}

// ` ?X+` for a class predicate X.
template <typename Predicate>
size_t match_optional_space_then_run(const CodePoints& text, size_t i, Predicate in_class) {
  size_t j = i;
  if (text.at(j) == ' ' && in_class(j + 1)) ++j;
  if (!in_class(j)) return 0;
  while (in_class(j)) ++j;
  return j - i;
}

size_t whitespace_run(const CodePoints& text, size_t i) {
  size_t j = i;
  while (text.space(j)) ++j;
  return j - i;
}

// \s+(?!\S) then \s+: a whitespace run, minus its last character when a non-space follows
// (that character then starts the next word, e.g. " world").
size_t match_whitespace(const CodePoints& text, size_t i) {
  const size_t run = whitespace_run(text, i);
  if (run == 0) return 0;
  if (i + run == text.size() || run == 1) return run;
  return run - 1;
}

size_t match_gpt2(const CodePoints& text, size_t i) {
  if (size_t n = match_contraction(text, i, /*ignore_case=*/false)) return n;
  if (size_t n = match_optional_space_then_run(text, i, [&](size_t k) { return text.letter(k); })) {
    return n;
  }
  if (size_t n = match_optional_space_then_run(text, i, [&](size_t k) { return text.number(k); })) {
    return n;
  }
  if (size_t n = match_optional_space_then_run(text, i, [&](size_t k) { return text.other(k); })) {
    return n;
  }
  return match_whitespace(text, i);
}

size_t match_llama3(const CodePoints& text, size_t i, size_t max_digits) {
  if (size_t n = match_contraction(text, i, /*ignore_case=*/true)) return n;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  size_t j = i;
  if (!text.newline(j) && !text.letter(j) && !text.number(j) && j < text.size() &&
      text.letter(j + 1)) {
    ++j;
  }
  if (text.letter(j)) {
    while (text.letter(j)) ++j;
    return j - i;
  }
  // \p{N}{1,max_digits}
  j = i;
  while (j - i < max_digits && text.number(j)) ++j;
  if (j > i) return j - i;
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  if (size_t n = match_optional_space_then_run(text, i, [&](size_t k) { return text.other(k); })) {
    j = i + n;
    while (text.newline(j)) ++j;
    return j - i;
  }
  // \s*[\r\n]+: the whitespace run up to and including its last newline.
  const size_t run = whitespace_run(text, i);
  for (size_t k = run; k > 0; --k) {
    if (text.newline(i + k - 1)) return k;
  }
  return match_whitespace(text, i);
}

}  // namespace

std::vector<std::string_view> pre_tokenize(PreTokenizerKind kind, std::string_view text) {
  const CodePoints code_points(text);
  std::vector<std::string_view> words;
  for (size_t i = 0; i < code_points.size();) {
    size_t length = 0;
    switch (kind) {
      case PreTokenizerKind::kGpt2:
        length = match_gpt2(code_points, i);
        break;
      case PreTokenizerKind::kLlama3:
        length = match_llama3(code_points, i, 3);
        break;
      case PreTokenizerKind::kQwen2:
        length = match_llama3(code_points, i, 1);
        break;
    }
    // Every code point is whitespace, a letter, a number or other, so some alternative
    // matches; the guard keeps the loop finite whatever the matchers do.
    if (length == 0) length = 1;
    const size_t begin = code_points.offset(i);
    const size_t end = code_points.offset(i + length);
    words.push_back(text.substr(begin, end - begin));
    i += length;
  }
  return words;
}

}  // namespace folio::tokenizer
