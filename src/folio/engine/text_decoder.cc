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
    std::string delta = decoded_.substr(emitted_bytes_, final_bytes - emitted_bytes_);
    emitted_bytes_ = final_bytes;
    return delta;
  }

  std::string finish() override {
    std::string rest = decoded_.substr(emitted_bytes_);
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
