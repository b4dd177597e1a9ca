// Pre-tokenizers for byte-level BPE: split text into the words BPE merges within, by the
// regular expressions the models were trained with, implemented as hand-written matchers over
// code points (no regex engine; \p{L}, \p{N} and \s as in unicode.h).
//
//   GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   Qwen 2:  Llama 3's with \p{N} (one digit per word) instead of \p{N}{1,3}.
// Alternatives are tried in order at each position, as a backtracking regex engine does. A byte
// that is not valid UTF-8 counts as a character of none of the classes (it matches
// [^\s\p{L}\p{N}]), so every byte lands in exactly one word: the words concatenate to the input.
#pragma once

#include <string_view>
#include <vector>

#include "folio/tokenizer/vocabulary.h"

namespace folio::tokenizer {

// Views into `text`, in order, covering it exactly.
std::vector<std::string_view> pre_tokenize(PreTokenizerKind kind, std::string_view text);

}  // namespace folio::tokenizer
