// Tokenizer: text <-> token ids for a Vocabulary (vocabulary.h), llama.cpp-compatible.
//
// Encoding (encode):
//   1. Special-token matching: the input is cut at every occurrence of a user-defined token's
//      text, and, when parse_special is set, of a control or unknown token's text (at each
//      position the longest match wins); the matched pieces become their ids directly.
//   2. Each remaining fragment is encoded by the vocabulary's model:
//      SentencePiece ("llama"): spaces become U+2581 "▁"; a "▁" is prepended to the fragment
//        when add_space_prefix is set and the fragment starts the text or follows a special
//        token; the fragment is split into characters, and the adjacent pair whose
//        concatenation is the highest-scoring piece (leftmost on ties) is merged until no pair
//        forms a piece; each symbol left is its piece, or, when it is not one, its bytes as
//        byte tokens <0xXX> (byte fallback).
//      Byte-level BPE ("gpt2"): the pre-tokenizer (pre_tokenizer.h) splits the fragment into
//        words; each word's bytes are spelled with GPT-2's byte-to-character map, and the
//        adjacent pair with the lowest merge rank (leftmost on ties) is merged until no merge
//        applies; each symbol left is its piece, or its single bytes' pieces.
//   3. With add_special, BOS (and EOS) are added when the vocabulary says so.
// Only normal pieces take part in merges, so text never turns into a control, byte or unused
// token by accident (llama.cpp would, for vocabularies that spell such tokens with mergeable
// text; for real vocabularies the two agree).
//
// Decoding: a normal byte-level piece mapped back to bytes; a byte token its byte; a
// user-defined token its text; control and unknown tokens their text only when render_special
// is set; unused tokens nothing; SentencePiece output has every "▁" turned into a space (also
// one spelled by byte tokens), and decode strips the space SentencePiece's prefix added. A token's
// bytes may end inside a UTF-8 character (byte tokens, byte-level pieces): token_bytes exposes
// that, and IncrementalDecoder holds such bytes back until the character completes, for streaming.
//
// decode(encode(text)) == text for any bytes when parse_special is false, except that a
// SentencePiece vocabulary decodes a literal "▁" in the input as a space, and a byte-level
// vocabulary that does not spell every byte with a normal piece loses or respells those bytes.
//
// Thread-safety: a Tokenizer is immutable and cheap to copy (shared state); every method may be
// called from any thread. An IncrementalDecoder belongs to one sequence and one thread.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "folio/base/result.h"
#include "folio/tokenizer/vocabulary.h"

namespace folio::gguf {
class GgufFile;
}  // namespace folio::gguf

namespace folio::tokenizer {

struct EncodeOptions {
  bool add_special = true;     // add BOS / EOS as the vocabulary asks
  bool parse_special = false;  // match control tokens' text ("<s>", "<|eot_id|>") in the input
};

struct DecodeOptions {
  bool render_special = false;      // control and unknown tokens decode to their text
  bool strip_leading_space = true;  // drop the space a SentencePiece prefix added
};

class Tokenizer {
 public:
  // Reads the vocabulary from tokenizer.ggml.* metadata (read_vocabulary) and builds the
  // tokenizer.
  static Result<Tokenizer> from_gguf(const gguf::GgufFile& file);
  // Errors (kInvalidArgument): an invalid vocabulary; a byte token that is not "<0xXX>";
  // (SentencePiece) a byte no token can spell: no <0xXX> token, no single-byte piece and no
  // unknown token. A byte-level vocabulary may lack bytes: encoding drops them, as llama.cpp.
  static Result<Tokenizer> from_vocabulary(Vocabulary vocabulary);

  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& options = {}) const;

  // kOutOfRange naming the first id outside [0, vocab_size()).
  Result<std::string> decode(std::span<const TokenId> ids, const DecodeOptions& options = {}) const;
  // The raw bytes a token contributes (possibly part of a UTF-8 character).
  Result<std::string> token_bytes(TokenId id, bool render_special = false) const;
  // The token's piece as stored in the vocabulary ("▁the", "<0x0A>", "Ġthe").
  Result<std::string_view> token_piece(TokenId id) const;
  // The id of a piece, if the vocabulary has it (the first such id).
  std::optional<TokenId> find_piece(std::string_view piece) const;

  // Control, unknown and user-defined tokens. False for out-of-range ids.
  bool is_special(TokenId id) const;
  // EOS, end-of-turn and end-of-message tokens: generation stops after them.
  bool is_end_of_generation(TokenId id) const;

  const Vocabulary& vocabulary() const;
  int64_t vocab_size() const;
  TokenizerModel model() const;
  std::optional<TokenId> bos() const;
  std::optional<TokenId> eos() const;

  struct State;  // defined in tokenizer_state.h

 private:
  explicit Tokenizer(std::shared_ptr<const State> state) : state_(std::move(state)) {}
  std::shared_ptr<const State> state_;
};

// Decodes a stream of tokens into text that never ends inside a UTF-8 character: bytes of an
// unfinished character are held until the token completing them arrives (or finish() is
// called). The concatenation of every push() and finish() equals decode() of all the ids with
// the same options.
class IncrementalDecoder {
 public:
  // The tokenizer must outlive the decoder.
  explicit IncrementalDecoder(const Tokenizer& tokenizer, const DecodeOptions& options = {})
      : tokenizer_(&tokenizer), options_(options) {}

  // Text now complete. kOutOfRange for an invalid id (the decoder is unchanged).
  Result<std::string> push(TokenId id);
  // Whatever is held back (an unfinished character's bytes, as they are).
  std::string finish();
  // What finish() would return now, without ending the stream: decode() of the ids pushed so
  // far is the concatenation of every push() and held().
  std::string_view held() const { return pending_; }

 private:
  const Tokenizer* tokenizer_;
  DecodeOptions options_;
  std::string pending_;
  bool at_start_ = true;  // nothing emitted yet: a leading space may still be stripped
};

}  // namespace folio::tokenizer
