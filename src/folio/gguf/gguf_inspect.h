// render_gguf_summary: the text `folio inspect FILE` prints: the header, every metadata entry
// (long arrays and strings abbreviated), the tensor table (name, type, ggml-order shape, bytes,
// offset) and totals per type.
#pragma once

#include <cstddef>
#include <string>

#include "folio/gguf/gguf_file.h"

namespace folio::gguf {

struct InspectOptions {
  size_t max_array_elements = 8;  // array elements shown before "..."
  size_t max_string_bytes = 64;   // string bytes shown before "..."
  bool show_tensors = true;       // false: header, metadata and totals only
};

std::string render_gguf_summary(const GgufFile& file, const InspectOptions& options = {});

// "512 B", "1.50 KiB", "3.25 GiB".
std::string format_byte_size(uint64_t bytes);

}  // namespace folio::gguf
