#include "folio/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <span>

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
  uint32_t operator[](size_t index) const { return code_points_[index]; }

 private:
  std::vector<uint32_t> code_points_;
  std::vector<size_t> offsets_;
};

// The text as one pattern sees it: the code points up to the end of the segment being split.
// Past the end there is nothing (kInvalidCodePoint, of no class and not whitespace), so
// lookaheads and "end of text" ($, (?!\S)) stop at the segment's end, as in llama.cpp, where
// each pattern of a list runs on the pieces the previous ones left.
class Window {
 public:
  Window(const CodePoints& text, size_t end) : text_(&text), end_(end) {}
  size_t size() const { return end_; }
  uint32_t at(size_t index) const { return index < end_ ? (*text_)[index] : kInvalidCodePoint; }
  bool letter(size_t index) const { return index < end_ && is_letter(at(index)); }
  bool number(size_t index) const { return index < end_ && is_number(at(index)); }
  bool space(size_t index) const { return index < end_ && is_whitespace(at(index)); }
  bool other(size_t index) const {  // [^\s\p{L}\p{N}]
    return index < end_ && !is_whitespace(at(index)) && !is_letter(at(index)) &&
           !is_number(at(index));
  }
  bool newline(size_t index) const { return at(index) == '\r' || at(index) == '\n'; }

 private:
  const CodePoints* text_;
  size_t end_;
};

uint32_t ascii_lower(uint32_t c) {
  return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

// 's 't 're 've 'm 'll 'd: length in code points, 0 when none matches.
size_t match_contraction(const Window& text, size_t i, bool ignore_case) {
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
size_t match_optional_space_then_run(const Window& text, size_t i, Predicate in_class) {
  size_t j = i;
  if (text.at(j) == ' ' && in_class(j + 1)) ++j;
  if (!in_class(j)) return 0;
  while (in_class(j)) ++j;
  return j - i;
}

size_t whitespace_run(const Window& text, size_t i) {
  size_t j = i;
  while (text.space(j)) ++j;
  return j - i;
}

// \s+(?!\S) then \s+: a whitespace run, minus its last character when a non-space follows
// (that character then starts the next word, e.g. " world").
size_t match_whitespace(const Window& text, size_t i) {
  const size_t run = whitespace_run(text, i);
  if (run == 0) return 0;
  if (i + run == text.size() || run == 1) return run;
  return run - 1;
}

size_t match_gpt2(const Window& text, size_t i) {
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

size_t match_llama3(const Window& text, size_t i, size_t max_digits) {
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

// One step of a pre-tokenizer. A pattern is either a word pattern, which matches at every
// position and so cuts a segment into words end to end (GPT-2's, Llama 3's), or a searched
// pattern, found leftmost-first and without overlap as a regex search finds it; the text between
// two matches becomes a segment of its own, as llama.cpp's unicode_regex_split keeps it.
enum class Pattern {
  kGpt2Words,            // GPT-2's pattern (pre_tokenizer.h)
  kLlama3Words,          // Llama 3's pattern
  kQwen2Words,           // Llama 3's with single digits
  kPunctuationRun,       // [\p{P}$\+<=>\^~\|]+
  kFalconPunctuation,    // [\p{P}$\+<=>\^~\|`]+
  kNumberRun,            // \p{N}+
  kSingleNumber,         // \p{N}
  kThreeAsciiDigits,     // [0-9][0-9][0-9]
  kNewline,              // [\r\n]
  kDeepseekLetters,      // \s?[cased letters]+ (kDeepseekLetterRanges)
  kDeepseekPunctuation,  // \s?[punctuation]+ (kDeepseekPunctuationRanges)
  kTrailingWhitespace,   // \s+$
  kDeepseekCjk,          // [CJK]+ (kDeepseekCjkRanges)
};

// A code point range of a searched pattern's bracket expression, first and last included.
struct CodePointRange {
  uint32_t first;
  uint32_t last;
};

bool in_ranges(std::span<const CodePointRange> ranges, uint32_t code_point) {
  const auto* range = std::lower_bound(
      ranges.data(), ranges.data() + ranges.size(), code_point,
      [](const CodePointRange& candidate, uint32_t value) { return candidate.last < value; });
  return range != ranges.data() + ranges.size() && range->first <= code_point;
}

// DeepSeek LLM's letter class: the cased letters (Lu, Ll, Lt) of the Unicode version its
// pattern was written against, which the pattern spells out range by range (some ends are
// compatibility characters such as U+212A KELVIN SIGN, kept as such). Sorted, disjoint.
constexpr CodePointRange kDeepseekLetterRanges[] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},
    {0xD8, 0xF6},       {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},
    {0x295, 0x2AF},     {0x370, 0x373},     {0x376, 0x377},     {0x37B, 0x37D},
    {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},     {0x38C, 0x38C},
    {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},
    {0x1C90, 0x1CBA},   {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},
    {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},   {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},
    {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},   {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB},   {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},
    {0x2102, 0x2102},   {0x2107, 0x2107},   {0x210A, 0x2113},   {0x2115, 0x2115},
    {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},   {0x2128, 0x2128},
    {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},
    {0x2C7E, 0x2CE4},   {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},
    {0xA680, 0xA69B},   {0xA722, 0xA76F},   {0xA771, 0xA787},   {0xA78B, 0xA78E},
    {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},   {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943}};

// DeepSeek LLM's punctuation class: ASCII ! to / and : to ~ (letters included: they were split
// off before), fullwidth ！ to ／ and ： to ～, quotation marks ‘ to ‟, and 、 。. U+3000 is in
// the pattern's range too, but as whitespace it never matches (llama.cpp hands its regex any
// non-ASCII whitespace as \v, and Folio follows).
constexpr CodePointRange kDeepseekPunctuationRanges[] = {{0x21, 0x2F},     {0x3A, 0x7E},
                                                         {0x2018, 0x201F}, {0x3001, 0x3002},
                                                         {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E}};

// DeepSeek LLM's CJK class: U+0800 to U+9FA5 (two overlapping ranges in the pattern) and the
// Hangul syllables block U+AC00 to U+D7FF; whitespace in them never matches, as above.
constexpr CodePointRange kDeepseekCjkRanges[] = {{0x800, 0x9FA5}, {0xAC00, 0xD7FF}};

bool falcon_symbol(uint32_t c, bool with_backtick) {
  return c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' || c == '~' ||
         c == '|' || (with_backtick && c == '`');
}

struct Match {
  size_t begin;
  size_t end;
};

// The first run of code points in the class at or after `from`.
template <typename Predicate>
std::optional<Match> find_run(const Window& text, size_t from, Predicate in_class) {
  size_t begin = from;
  while (begin < text.size() && !in_class(begin)) ++begin;
  if (begin == text.size()) return std::nullopt;
  size_t end = begin;
  while (end < text.size() && in_class(end)) ++end;
  return Match{begin, end};
}

// \s?X+: a run of the class, with the one whitespace character before it when there is one.
template <typename Predicate>
std::optional<Match> find_run_after_optional_space(const Window& text, size_t from,
                                                   Predicate in_class) {
  std::optional<Match> run = find_run(text, from, in_class);
  if (run && run->begin > from && text.space(run->begin - 1)) --run->begin;
  return run;
}

std::optional<Match> find_match(Pattern pattern, const Window& text, size_t from) {
  const auto class_of = [&](auto predicate) {
    return [&text, predicate](size_t k) { return k < text.size() && predicate(text.at(k)); };
  };
  switch (pattern) {
    case Pattern::kGpt2Words:
    case Pattern::kLlama3Words:
    case Pattern::kQwen2Words:
      break;  // word patterns: see match_word
    case Pattern::kPunctuationRun:
    case Pattern::kFalconPunctuation: {
      const bool with_backtick = pattern == Pattern::kFalconPunctuation;
      return find_run(text, from, class_of([with_backtick](uint32_t c) {
                        return is_punctuation(c) || falcon_symbol(c, with_backtick);
                      }));
    }
    case Pattern::kNumberRun:
      return find_run(text, from, [&](size_t k) { return text.number(k); });
    case Pattern::kSingleNumber: {
      std::optional<Match> run = find_run(text, from, [&](size_t k) { return text.number(k); });
      if (run) run->end = run->begin + 1;
      return run;
    }
    case Pattern::kThreeAsciiDigits:
      for (size_t begin = from; begin + 3 <= text.size(); ++begin) {
        const auto digit = [&](size_t k) { return text.at(k) >= '0' && text.at(k) <= '9'; };
        if (digit(begin) && digit(begin + 1) && digit(begin + 2)) return Match{begin, begin + 3};
      }
      return std::nullopt;
    case Pattern::kNewline: {
      std::optional<Match> run = find_run(text, from, [&](size_t k) { return text.newline(k); });
      if (run) run->end = run->begin + 1;
      return run;
    }
    case Pattern::kDeepseekLetters:
      return find_run_after_optional_space(
          text, from, class_of([](uint32_t c) { return in_ranges(kDeepseekLetterRanges, c); }));
    case Pattern::kDeepseekPunctuation:
      return find_run_after_optional_space(text, from, class_of([](uint32_t c) {
                                             return !is_whitespace(c) &&
                                                    in_ranges(kDeepseekPunctuationRanges, c);
                                           }));
    case Pattern::kTrailingWhitespace: {
      size_t begin = text.size();
      while (begin > from && text.space(begin - 1)) --begin;
      if (begin == text.size()) return std::nullopt;
      return Match{begin, text.size()};
    }
    case Pattern::kDeepseekCjk:
      return find_run(text, from, class_of([](uint32_t c) {
                        return !is_whitespace(c) && in_ranges(kDeepseekCjkRanges, c);
                      }));
  }
  return std::nullopt;
}

// The length of the word a word pattern matches at i (at least 1).
size_t match_word(Pattern pattern, const Window& text, size_t i) {
  size_t length = 0;
  switch (pattern) {
    case Pattern::kGpt2Words:
      length = match_gpt2(text, i);
      break;
    case Pattern::kLlama3Words:
      length = match_llama3(text, i, 3);
      break;
    case Pattern::kQwen2Words:
      length = match_llama3(text, i, 1);
      break;
    case Pattern::kPunctuationRun:
    case Pattern::kFalconPunctuation:
    case Pattern::kNumberRun:
    case Pattern::kSingleNumber:
    case Pattern::kThreeAsciiDigits:
    case Pattern::kNewline:
    case Pattern::kDeepseekLetters:
    case Pattern::kDeepseekPunctuation:
    case Pattern::kTrailingWhitespace:
    case Pattern::kDeepseekCjk:
      break;
  }
  // Every code point is whitespace, a letter, a number or other, so some alternative matches;
  // the guard keeps the loop finite whatever the matchers do.
  return std::max<size_t>(length, 1);
}

bool is_word_pattern(Pattern pattern) {
  return pattern == Pattern::kGpt2Words || pattern == Pattern::kLlama3Words ||
         pattern == Pattern::kQwen2Words;
}

// The patterns of each pre-tokenizer, in the order they cut (llama.cpp's llm_tokenizer_bpe).
std::span<const Pattern> patterns_of(PreTokenizerKind kind) {
  static constexpr Pattern kGpt2[] = {Pattern::kGpt2Words};
  static constexpr Pattern kLlama3[] = {Pattern::kLlama3Words};
  static constexpr Pattern kQwen2[] = {Pattern::kQwen2Words};
  static constexpr Pattern kDefault[] = {Pattern::kPunctuationRun, Pattern::kGpt2Words,
                                         Pattern::kNumberRun, Pattern::kThreeAsciiDigits};
  static constexpr Pattern kFalcon[] = {Pattern::kFalconPunctuation, Pattern::kGpt2Words,
                                        Pattern::kThreeAsciiDigits};
  static constexpr Pattern kStarcoder[] = {Pattern::kSingleNumber, Pattern::kGpt2Words};
  static constexpr Pattern kDeepseekLlm[] = {Pattern::kNewline,
                                             Pattern::kDeepseekLetters,
                                             Pattern::kDeepseekPunctuation,
                                             Pattern::kTrailingWhitespace,
                                             Pattern::kDeepseekCjk,
                                             Pattern::kNumberRun};
  switch (kind) {
    case PreTokenizerKind::kGpt2:
      return kGpt2;
    case PreTokenizerKind::kLlama3:
      return kLlama3;
    case PreTokenizerKind::kQwen2:
      return kQwen2;
    case PreTokenizerKind::kDefault:
      return kDefault;
    case PreTokenizerKind::kFalcon:
      return kFalcon;
    case PreTokenizerKind::kStarcoder:
      return kStarcoder;
    case PreTokenizerKind::kDeepseekLlm:
      return kDeepseekLlm;
  }
  return kGpt2;
}

// Segments as [begin, end) code point indices, in order, covering the text.
struct Segment {
  size_t begin;
  size_t end;
};

void cut(Pattern pattern, const CodePoints& text, Segment segment, std::vector<Segment>& out) {
  const Window window(text, segment.end);
  if (is_word_pattern(pattern)) {
    for (size_t i = segment.begin; i < segment.end;) {
      const size_t length = match_word(pattern, window, i);
      out.push_back({i, i + length});
      i += length;
    }
    return;
  }
  size_t position = segment.begin;
  while (position < segment.end) {
    const std::optional<Match> match = find_match(pattern, window, position);
    if (!match) break;
    if (match->begin > position) out.push_back({position, match->begin});
    out.push_back({match->begin, match->end});
    position = match->end;
  }
  if (position < segment.end) out.push_back({position, segment.end});
}

}  // namespace

std::vector<std::string_view> pre_tokenize(PreTokenizerKind kind, std::string_view text) {
  const CodePoints code_points(text);
  std::vector<Segment> segments;
  if (code_points.size() > 0) segments.push_back({0, code_points.size()});
  std::vector<Segment> next;
  for (Pattern pattern : patterns_of(kind)) {
    next.clear();
    for (const Segment& segment : segments) cut(pattern, code_points, segment, next);
    segments.swap(next);
  }
  std::vector<std::string_view> words;
  words.reserve(segments.size());
  for (const Segment& segment : segments) {
    const size_t begin = code_points.offset(segment.begin);
    words.push_back(text.substr(begin, code_points.offset(segment.end) - begin));
  }
  return words;
}

}  // namespace folio::tokenizer
