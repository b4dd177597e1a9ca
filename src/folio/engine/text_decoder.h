// TextDecoder: the engine's view of detokenization, one per sequence, fed token by token.
//
// Stop strings are matched on decoded text and streamed text deltas come from it, so the engine
// needs text as tokens arrive. A TextDecoder turns a stream of generated token ids into text
// that never ends inside a UTF-8 character: push() returns the text made final by one more
// token, finish() whatever is still held. tokenizer::IncrementalDecoder has exactly this shape; a
// factory wrapping it is three lines. make_span_text_decoder_factory adapts a plain
// "decode these ids" callback instead (simpler, O(n) per token).
//
// Thread-safety: a TextDecoder belongs to one sequence and is used by the engine thread only; a
// factory is called on the engine thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "folio/base/result.h"
#include "folio/tokenizer/tokenizer.h"

namespace folio::engine {

class TextDecoder {
 public:
  virtual ~TextDecoder() = default;
  // The text that becomes final with `token`. An error (an id outside the vocabulary) leaves
  // the decoder unchanged.
  virtual Result<std::string> push(int32_t token) = 0;
  // Everything held back (an unfinished character's bytes). The decoder is then spent.
  virtual std::string finish() = 0;
};

using TextDecoderFactory = std::function<std::unique_ptr<TextDecoder>()>;

// Decodes the whole generated sequence with `decode` after every token and returns what was
// added since the last call, holding back a trailing unfinished UTF-8 character. Its output is
// always valid UTF-8: bytes that can never be part of a character (a lone continuation byte, a
// lead byte followed by something else, the bytes still held at finish()) become U+FFFD, one
// per maximal ill-formed subsequence (replace_invalid_utf8), so the concatenated output equals
// replace_invalid_utf8 of the whole decoded text however the tokens split it. Each push is
// an error (kFailedPrecondition) if the new decoding does not extend what was already returned
// (a decoder whose output is not prefix-stable cannot be streamed this way).
TextDecoderFactory make_span_text_decoder_factory(
    std::function<std::string(std::span<const int32_t>)> decode);

// Streams each sequence through a tokenizer::IncrementalDecoder of `tokenizer` (which must
// outlive every decoder made) with `options`, under the same output rule as
// make_span_text_decoder_factory: deltas are valid UTF-8 (maximal ill-formed subparts become
// U+FFFD), and every push and finish returns exactly what the span decoder over
// `tokenizer->decode(ids, options)` returns. Work per token is constant: the span decoder
// re-decodes every generated token at each push (about 20 us per token at 256 tokens of a
// 32,000-token vocabulary, 13% of a tiny model's decode step; quadratic in the output length).
// A push of an id outside the vocabulary is kOutOfRange and changes nothing.
TextDecoderFactory make_tokenizer_text_decoder_factory(const tokenizer::Tokenizer* tokenizer,
                                                       const tokenizer::DecodeOptions& options);

// Bytes at the end of `text` that begin a UTF-8 character not yet complete (0 to 3). Bytes that
// cannot start or continue a character are treated as complete.
size_t incomplete_utf8_suffix(std::string_view text);

// `text` with every maximal ill-formed subsequence replaced by U+FFFD (Unicode's "substitution
// of maximal subparts", as WHATWG's decoder and Python's errors="replace" do): overlong forms,
// surrogates and values above U+10FFFF are ill-formed too. Valid UTF-8 is returned unchanged.
std::string replace_invalid_utf8(std::string_view text);

}  // namespace folio::engine
