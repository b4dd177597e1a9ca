#include "folio/engine/text_decoder.h"

#include <algorithm>
#include <string_view>
#include <utility>
#include <vector>

#include "folio/base/check.h"

namespace folio::engine {

size_t incomplete_utf8_suffix(std::string_view text) {
  // Walk back over at most three continuation bytes to the lead byte of the last character.
  const size_t size = text.size();
  for (size_t back = 1; back <= std::min<size_t>(4, size); ++back) {
    const auto byte = static_cast<unsigned char>(text[size - back]);
    if ((byte & 0xC0) == 0x80) continue;  // continuation byte
    size_t length = 1;
    if ((byte & 0xE0) == 0xC0) {
      length = 2;
    } else if ((byte & 0xF0) == 0xE0) {
      length = 3;
    } else if ((byte & 0xF8) == 0xF0) {
      length = 4;
    }
    return back < length ? back : 0;
  }
  return 0;
}

namespace {

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// The length of the well-formed character starting at text[start], or 0 when the bytes there
// are ill-formed; `*maximal_subpart` is then how many bytes (>= 1) one U+FFFD replaces: the
// lead byte and the continuation bytes that still fit a valid character (Unicode table 3-7).
size_t well_formed_length(std::string_view text, size_t start, size_t* maximal_subpart) {
  const auto lead = static_cast<unsigned char>(text[start]);
  *maximal_subpart = 1;
  if (lead < 0x80) return 1;
  size_t length = 0;
  unsigned char second_low = 0x80, second_high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_low = 0xA0;   // overlong below U+0800
    if (lead == 0xED) second_high = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_low = 0x90;   // overlong below U+10000
    if (lead == 0xF4) second_high = 0x8F;  // above U+10FFFF
  } else {
    return 0;  // a continuation byte, C0, C1 or F5..FF: never starts a character
  }
  for (size_t offset = 1; offset < length; ++offset) {
    if (start + offset >= text.size()) return 0;
    const auto byte = static_cast<unsigned char>(text[start + offset]);
    const unsigned char low = offset == 1 ? second_low : 0x80;
    const unsigned char high = offset == 1 ? second_high : 0xBF;
    if (byte < low || byte > high) return 0;
    *maximal_subpart = offset + 1;
  }
  return length;
}

}  // namespace

std::string replace_invalid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t position = 0;
  while (position < text.size()) {
    size_t maximal_subpart = 1;
    const size_t length = well_formed_length(text, position, &maximal_subpart);
    if (length > 0) {
      out.append(text.substr(position, length));
      position += length;
    } else {
      out.append(kReplacementCharacter);
      position += maximal_subpart;
    }
  }
  return out;
}

namespace {

class SpanTextDecoder final : public TextDecoder {
 public:
  explicit SpanTextDecoder(std::function<std::string(std::span<const int32_t>)> decode)
      : decode_(std::move(decode)) {}

  Result<std::string> push(int32_t token) override {
    tokens_.push_back(token);
    std::string text = decode_(tokens_);
    if (text.compare(0, emitted_bytes_, decoded_, 0, emitted_bytes_) != 0 ||
        text.size() < emitted_bytes_) {
      tokens_.pop_back();
      return failed_precondition(
          "the detokenizer's output for {} tokens does not extend its output for {} tokens; "
          "stream through an incremental decoder instead",
          tokens_.size() + 1, tokens_.size());
    }
    decoded_ = std::move(text);
    const size_t final_bytes = decoded_.size() - incomplete_utf8_suffix(decoded_);
    // A held-back suffix is exactly a maximal subpart still open at the end, so no ill-formed
    // sequence straddles final_bytes and replacing per delta equals replacing the whole text.
    std::string delta = replace_invalid_utf8(
        std::string_view(decoded_).substr(emitted_bytes_, final_bytes - emitted_bytes_));
    emitted_bytes_ = final_bytes;
    return delta;
  }

  std::string finish() override {
    // Held bytes never completed a character: each maximal subpart becomes U+FFFD.
    std::string rest = replace_invalid_utf8(std::string_view(decoded_).substr(emitted_bytes_));
    emitted_bytes_ = decoded_.size();
    return rest;
  }

 private:
  std::function<std::string(std::span<const int32_t>)> decode_;
  std::vector<int32_t> tokens_;
  std::string decoded_;       // decode_(tokens_)
  size_t emitted_bytes_ = 0;  // prefix of decoded_ already returned
};

// The span decoder's rule applied to a stream instead of the whole text. Decoding the ids so far
// gives what the incremental decoder released plus what it holds (held()); that text only grows
// (the span decoder requires it). The tokenizer holds back by its own rule, which may keep bytes
// the span rule already calls final (an ill-formed lead byte followed by another lead byte), so
// the view is computed over released and held bytes alike: `unreleased_` are released bytes not
// yet returned, `ahead_` counts held bytes already returned, skipped when they are released.
class IncrementalTextDecoder final : public TextDecoder {
 public:
  IncrementalTextDecoder(const tokenizer::Tokenizer& tokenizer,
                         const tokenizer::DecodeOptions& options)
      : decoder_(tokenizer, options) {}

  Result<std::string> push(int32_t token) override {
    FOLIO_ASSIGN_OR_RETURN(std::string released, decoder_.push(token));
    take_released(released);
    const std::string_view held = decoder_.held();
    // Invariant: bytes are returned ahead of their release only once every released byte was.
    FOLIO_DCHECK(ahead_ == 0 || unreleased_.empty());
    const std::string view = unreleased_ + std::string(held.substr(std::min(ahead_, held.size())));
    const size_t final_bytes = view.size() - incomplete_utf8_suffix(view);
    std::string delta = replace_invalid_utf8(std::string_view(view).substr(0, final_bytes));
    if (final_bytes <= unreleased_.size()) {
      unreleased_.erase(0, final_bytes);
    } else {
      ahead_ += final_bytes - unreleased_.size();
      unreleased_.clear();
    }
    return delta;
  }

  std::string finish() override {
    take_released(decoder_.finish());
    std::string rest = replace_invalid_utf8(unreleased_);
    unreleased_.clear();
    return rest;
  }

 private:
  void take_released(std::string_view released) {
    const size_t skipped = std::min(ahead_, released.size());
    ahead_ -= skipped;
    unreleased_.append(released.substr(skipped));
  }

  tokenizer::IncrementalDecoder decoder_;
  std::string unreleased_;  // released by decoder_, not yet returned
  size_t ahead_ = 0;        // bytes returned while decoder_ still held them
};

}  // namespace

TextDecoderFactory make_tokenizer_text_decoder_factory(const tokenizer::Tokenizer* tokenizer,
                                                       const tokenizer::DecodeOptions& options) {
  return [tokenizer, options]() -> std::unique_ptr<TextDecoder> {
    return std::make_unique<IncrementalTextDecoder>(*tokenizer, options);
  };
}

TextDecoderFactory make_span_text_decoder_factory(
    std::function<std::string(std::span<const int32_t>)> decode) {
  return [decode = std::move(decode)]() -> std::unique_ptr<TextDecoder> {
    return std::make_unique<SpanTextDecoder>(decode);
  };
}

}  // namespace folio::engine
