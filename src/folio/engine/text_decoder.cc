#include "folio/engine/text_decoder.h"

#include <string_view>
#include <utility>
#include <vector>

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

}  // namespace

TextDecoderFactory make_span_text_decoder_factory(
    std::function<std::string(std::span<const int32_t>)> decode) {
  return [decode = std::move(decode)]() -> std::unique_ptr<TextDecoder> {
    return std::make_unique<SpanTextDecoder>(decode);
  };
}

}  // namespace folio::engine
