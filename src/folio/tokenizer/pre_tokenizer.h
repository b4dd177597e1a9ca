// Pre-tokenizers for byte-level BPE: split text into the words BPE merges within, by the
// regular expressions the models were trained with, implemented as hand-written matchers over
// code points (no regex engine; \p{L}, \p{N}, \p{P} and \s as in unicode.h).
//
// A pre-tokenizer is a list of patterns applied in turn, as llama.cpp's unicode_regex_split
// applies its list: each pattern runs on every piece the previous ones left, and the text
// between two of its matches stays a piece of its own. A pattern sees its piece as the whole
// text (lookaheads and $ stop at the piece's end). Two kinds of pattern:
//   word patterns, whose alternatives match at every position and so cut a piece into words:
//     GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//              ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//     Qwen 2:  Llama 3's with \p{N} (one digit per word) instead of \p{N}{1,3}.
//     Alternatives are tried in order at each position, as a backtracking regex engine does.
//   searched patterns, found leftmost-first without overlap:
//     [\p{P}$+<=>^~|]+ (default; Falcon adds `), \p{N}+, \p{N}, [0-9][0-9][0-9], [\r\n], and
//     DeepSeek LLM's \s?[letters]+, \s?[punctuation]+, \s+$ and [CJK]+ over its own ranges.
// The lists:
//   gpt-2:        GPT-2
//   llama3:       Llama 3            qwen2: Qwen 2
//   default:      [\p{P}$+<=>^~|]+, GPT-2, \p{N}+, [0-9][0-9][0-9]
//   falcon:       [\p{P}$+<=>^~|`]+, GPT-2, [0-9][0-9][0-9]
//   starcoder:    \p{N}, GPT-2
//   deepseek-llm: [\r\n], \s?[letters]+, \s?[punctuation]+, \s+$, [CJK]+, \p{N}+
// A byte that is not valid UTF-8 counts as a character of no class (GPT-2's and Llama 3's
// [^\s\p{L}\p{N}] match it), so every byte lands in exactly one word: the words concatenate to
// the input.
#pragma once

#include <string_view>
#include <vector>

#include "folio/tokenizer/vocabulary.h"

namespace folio::tokenizer {

// Views into `text`, in order, covering it exactly.
std::vector<std::string_view> pre_tokenize(PreTokenizerKind kind, std::string_view text);

}  // namespace folio::tokenizer
