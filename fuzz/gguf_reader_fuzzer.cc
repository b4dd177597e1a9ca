// libFuzzer target for the GGUF reader. Any input must parse to a GgufFile or a Status, never
// crash, hang or touch memory outside the input (AddressSanitizer checks every read). Inputs
// that parse are pushed through everything that consumes a file: every tensor's bytes are read,
// the inspect summary is rendered, the Llama shape is read, and when the metadata holds a
// vocabulary the tokenizer is built and used on fixed texts and on the input's own tail.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "folio/model/gguf_file.h"
#include "folio/model/gguf_inspect.h"
#include "folio/model/llama_model_file.h"
#include "folio/model/tokenizer.h"

namespace {

using namespace folio::model;

void exercise_tokenizer(const Tokenizer& tokenizer, std::string_view input_tail) {
  const std::string_view texts[] = {
      "", "Hello world", " \t\n  x", "<s>caf\xc3\xa9</s>", "\xff\xfe\xe4\xb8", input_tail};
  for (std::string_view text : texts) {
    for (bool parse_special : {false, true}) {
      const std::vector<TokenId> ids =
          tokenizer.encode(text, {.add_special = true, .parse_special = parse_special});
      for (TokenId id : ids) FOLIO_CHECK(id >= 0 && id < tokenizer.vocab_size(), "id {}", id);
      // Every id encode produces must decode.
      FOLIO_CHECK(tokenizer.decode(ids).ok());
      FOLIO_CHECK(tokenizer.decode(ids, {.render_special = true}).ok());
    }
  }
  FOLIO_CHECK(!tokenizer.token_bytes(static_cast<TokenId>(tokenizer.vocab_size())).ok());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  folio::Result<GgufFile> file = GgufFile::parse(std::span<const uint8_t>(data, size), "fuzz");
  if (!file.ok()) {
    FOLIO_CHECK(!file.status().message().empty());
    return 0;
  }
  unsigned checksum = 0;
  for (const GgufTensorInfo& info : file->tensors()) {
    for (std::byte byte : file->tensor_bytes(info)) checksum += static_cast<unsigned>(byte);
    (void)file->tensor(info.name);
  }
  const std::string summary = render_gguf_summary(*file);
  FOLIO_CHECK(!summary.empty() || checksum == 0);
  (void)read_llama_shape(*file);
  folio::Result<Tokenizer> tokenizer = Tokenizer::from_gguf(*file);
  if (tokenizer.ok()) {
    const size_t tail = std::min<size_t>(size, 64);
    exercise_tokenizer(*tokenizer,
                       std::string_view(reinterpret_cast<const char*>(data) + size - tail, tail));
  }
  return 0;
}
