// libFuzzer target for what consumes a parsed GGUF file: inputs that parse (the reader itself
// is gguf_reader_fuzzer.cc's) have their Llama shape read and, when the metadata holds a
// vocabulary, a tokenizer built and used on fixed texts and on the input's own tail. Nothing may
// crash, hang or read outside the input.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "folio/base/check.h"
#include "folio/gguf/gguf_file.h"
#include "folio/model/llama_model_file.h"
#include "folio/tokenizer/tokenizer.h"

using namespace folio;

namespace {

void exercise_tokenizer(const tokenizer::Tokenizer& tokenizer, std::string_view input_tail) {
  const std::string_view texts[] = {
      "", "Hello world", " \t\n  x", "<s>caf\xc3\xa9</s>", "\xff\xfe\xe4\xb8", input_tail};
  for (std::string_view text : texts) {
    for (bool parse_special : {false, true}) {
      const std::vector<tokenizer::TokenId> ids =
          tokenizer.encode(text, {.add_special = true, .parse_special = parse_special});
      for (tokenizer::TokenId id : ids) {
        FOLIO_CHECK(id >= 0 && id < tokenizer.vocab_size(), "id {}", id);
      }
      // Every id encode produces must decode.
      FOLIO_CHECK(tokenizer.decode(ids).ok());
      FOLIO_CHECK(tokenizer.decode(ids, {.render_special = true}).ok());
    }
  }
  FOLIO_CHECK(!tokenizer.token_bytes(static_cast<tokenizer::TokenId>(tokenizer.vocab_size())).ok());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Result<gguf::GgufFile> file = gguf::GgufFile::parse(std::span<const uint8_t>(data, size), "fuzz");
  if (!file.ok()) {
    FOLIO_CHECK(!file.status().message().empty());
    return 0;
  }
  (void)model::read_llama_shape(*file);
  Result<tokenizer::Tokenizer> tokenizer = tokenizer::Tokenizer::from_gguf(*file);
  if (tokenizer.ok()) {
    const size_t tail = std::min<size_t>(size, 64);
    exercise_tokenizer(*tokenizer,
                       std::string_view(reinterpret_cast<const char*>(data) + size - tail, tail));
  }
  return 0;
}
