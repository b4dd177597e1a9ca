// build_llama_vocabulary: a real, working SentencePiece-style (tokenizer.ggml.model = "llama")
// vocabulary of any size >= 259, built deterministically, for generated models.
//
// Layout, in id order:
//   0 <unk> (unknown), 1 <s> (BOS, control), 2 </s> (EOS, control),
//   3..258 the byte tokens <0x00>..<0xFF>, so every input encodes (byte fallback);
//   then pieces learned by byte-pair merging over a short English text embedded in Folio
//   (every character of the text first, most frequent first, then each merge in the order
//   learned); then, if more tokens are asked for, filler pieces "▁a", "▁b", ..., "▁aa", ...
//   Piece k (0-based, after the byte tokens) scores -k, so earlier merges win, as in a trained
//   SentencePiece BPE model. Sizes below the learned count keep a prefix of it.
// The result depends only on `vocabulary_size`; 32,000 tokens take milliseconds.
#pragma once

#include <cstdint>

#include "folio/base/result.h"
#include "folio/tokenizer/vocabulary.h"

namespace folio::tokenizer {

inline constexpr int64_t kMinGeneratedVocabularySize = 3 + 256;

// kInvalidArgument when vocabulary_size < 259 or above 1,000,000.
Result<Vocabulary> build_llama_vocabulary(int64_t vocabulary_size);

// How many pieces the embedded text yields (characters plus merges), for tests and docs.
int64_t learned_piece_count();

}  // namespace folio::tokenizer
