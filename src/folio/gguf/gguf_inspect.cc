#include "folio/gguf/gguf_inspect.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

namespace folio::gguf {

std::string format_byte_size(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.2f} {}", value, kUnits[unit]);
}

namespace {

std::string type_label(const GgufValue& value) {
  if (!value.is_array()) return std::string(gguf_value_type_name(value.type()));
  return fmt::format("array<{}>", gguf_value_type_name(value.element_type()));
}

std::string shape_label(const std::vector<int64_t>& dimensions) {
  return fmt::format("[{}]", fmt::join(dimensions, ", "));
}

void render_metadata(const GgufFile& file, const InspectOptions& options, std::string& out) {
  size_t key_width = 0;
  for (const GgufKeyValue& entry : file.metadata()) {
    key_width = std::max(key_width, entry.key.size());
  }
  out += fmt::format("metadata ({} entries):\n", file.metadata().size());
  for (const GgufKeyValue& entry : file.metadata()) {
    out += fmt::format(
        "  {:<{}}  {:<15} {}\n", entry.key, key_width, type_label(entry.value),
        render_gguf_value(entry.value, options.max_array_elements, options.max_string_bytes));
  }
}

void render_tensors(const GgufFile& file, std::string& out) {
  size_t name_width = 4;
  size_t shape_width = 5;
  for (const GgufTensorInfo& info : file.tensors()) {
    name_width = std::max(name_width, info.name.size());
    shape_width = std::max(shape_width, shape_label(info.dimensions).size());
  }
  out += fmt::format("tensors ({}):\n", file.tensors().size());
  out += fmt::format("  {:<{}}  {:<8} {:<{}}  {:>12}  {:>12}\n", "name", name_width, "type",
                     "shape", shape_width, "bytes", "offset");
  for (const GgufTensorInfo& info : file.tensors()) {
    out += fmt::format("  {:<{}}  {:<8} {:<{}}  {:>12}  {:>12}\n", info.name, name_width,
                       info.type.name, shape_label(info.dimensions), shape_width, info.byte_size,
                       file.data_offset() + info.offset);
  }
}

void render_totals(const GgufFile& file, std::string& out) {
  struct Total {
    size_t tensors = 0;
    int64_t elements = 0;
    uint64_t bytes = 0;
  };
  std::map<std::string_view, Total> by_type;
  Total all;
  for (const GgufTensorInfo& info : file.tensors()) {
    for (Total* total : {&by_type[info.type.name], &all}) {
      ++total->tensors;
      total->elements += info.element_count;
      total->bytes += info.byte_size;
    }
  }
  out += fmt::format("totals: {} tensors, {} parameters, {} of tensor data ({} bytes)\n",
                     all.tensors, all.elements, format_byte_size(all.bytes), all.bytes);
  for (const auto& [type, total] : by_type) {
    out += fmt::format("  {:<8} {:>6} tensors  {:>14} parameters  {:>12}\n", type, total.tensors,
                       total.elements, format_byte_size(total.bytes));
  }
}

}  // namespace

std::string render_gguf_summary(const GgufFile& file, const InspectOptions& options) {
  std::string out = fmt::format(
      "file: {} ({}, {} bytes)\nformat: GGUF version {}, alignment {}, data section "
      "at byte offset {}\n",
      file.source(), format_byte_size(file.file_size()), file.file_size(), file.version(),
      file.alignment(), file.data_offset());
  render_metadata(file, options, out);
  if (options.show_tensors) render_tensors(file, out);
  render_totals(file, out);
  return out;
}

}  // namespace folio::gguf
