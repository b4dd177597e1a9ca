// The ggml tensor types a GGUF file may name, with their block geometry.
//
// ggml stores a tensor row as a sequence of blocks: `block_elements` values packed into
// `block_bytes` bytes (1 and sizeof(T) for plain types; e.g. 32 and 18 for q4_0, 256 and 144
// for q4_K). The reader must know the geometry of every type a file may contain to bounds-check
// the data section, even for types Folio cannot compute with: `folio inspect` shows any llama.cpp
// file, while loading a tensor of a type without a folio::DType is an error naming the tensor.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace folio::gguf {

struct GgmlTypeInfo {
  int code;  // the ggml_type value stored in the file
  std::string_view name;
  int64_t block_elements;
  int64_t block_bytes;
};

// Nullopt for codes ggml never defined or has retired from files (4, 5, 31-33, 36-38).
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t code);

}  // namespace folio::gguf
