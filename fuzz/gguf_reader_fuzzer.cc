// libFuzzer target for the GGUF reader. Any input must parse to a GgufFile or a Status, never
// crash, hang or touch memory outside the input (AddressSanitizer checks every read). Inputs
// that parse are pushed through everything the format layer does with a file: every tensor's
// bytes are read, every tensor is looked up by name and the inspect summary is rendered. It
// links only the format layer (folio_gguf); model_file_fuzzer.cc carries the same inputs on to
// the Llama shape and the tokenizer.
#include <cstddef>
#include <cstdint>
#include <span>

#include "folio/base/check.h"
#include "folio/gguf/gguf_file.h"
#include "folio/gguf/gguf_inspect.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace folio::gguf;
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
  return 0;
}
