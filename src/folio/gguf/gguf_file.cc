#include "folio/gguf/gguf_file.h"

#include <vector>

#include <fmt/ranges.h>

namespace folio::gguf {

Result<GgufFile> GgufFile::open(const std::string& path, const GgufLimits& limits) {
  FOLIO_ASSIGN_OR_RETURN(MappedFile mapping, MappedFile::open(path));
  const std::span<const uint8_t> bytes = mapping.bytes();
  FOLIO_ASSIGN_OR_RETURN(GgufFile file, parse(bytes, path, limits));
  // The mapping's address does not change when it moves, so `bytes_` stays valid.
  file.mapping_.emplace(std::move(mapping));
  return file;
}

Result<GgufFile> GgufFile::parse_owned(std::vector<uint8_t> bytes, std::string source,
                                       const GgufLimits& limits) {
  // Parse the vector where it will live: moving a vector keeps its heap buffer.
  std::vector<uint8_t> owned = std::move(bytes);
  const std::span<const uint8_t> view = owned;
  FOLIO_ASSIGN_OR_RETURN(GgufFile file, parse(view, std::move(source), limits));
  file.owned_bytes_ = std::move(owned);
  return file;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].value;
}

Result<const GgufValue*> GgufFile::require(std::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return not_found("{}: metadata key '{}' is missing", source_, key);
  return value;
}

Status GgufFile::wrong_type(std::string_view key, const GgufValue& value,
                            std::string_view expected) const {
  std::string actual(gguf_value_type_name(value.type()));
  if (value.is_array()) {
    actual = fmt::format("array of {}", gguf_value_type_name(value.element_type()));
  }
  return invalid_argument("{}: metadata key '{}' is {} {}, expected {}", source_, key,
                          value.is_array() ? "an" : "a", actual, expected);
}

Result<int64_t> GgufFile::get_integer(std::string_view key) const {
  FOLIO_ASSIGN_OR_RETURN(const GgufValue* value, require(key));
  if (auto integer = value->as_integer()) return *integer;
  if (value->type() == GgufValueType::kUint64) {
    return invalid_argument("{}: metadata key '{}' = {} does not fit in int64", source_, key,
                            *value->as<uint64_t>());
  }
  return wrong_type(key, *value, "an integer");
}

Result<double> GgufFile::get_floating(std::string_view key) const {
  FOLIO_ASSIGN_OR_RETURN(const GgufValue* value, require(key));
  if (auto floating = value->as_floating()) return *floating;
  return wrong_type(key, *value, "a float32 or float64");
}

Result<std::string_view> GgufFile::get_string(std::string_view key) const {
  FOLIO_ASSIGN_OR_RETURN(const GgufValue* value, require(key));
  if (auto text = value->as_string()) return *text;
  return wrong_type(key, *value, "a string");
}

Result<std::span<const std::string>> GgufFile::get_string_array(std::string_view key) const {
  FOLIO_ASSIGN_OR_RETURN(const GgufValue* value, require(key));
  if (value->is_array() && value->element_type() == GgufValueType::kString) {
    return value->string_elements();
  }
  return wrong_type(key, *value, "an array of string");
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<GgufTensor> GgufFile::tensor(std::string_view name) const {
  const GgufTensorInfo* info = find_tensor(name);
  if (info == nullptr) return not_found("{}: tensor '{}' is missing", source_, name);
  const std::optional<DType> dtype = dtype_from_ggml_type(info->type.code);
  if (!dtype) {
    std::vector<std::string_view> supported;
    for (DType known : kAllDTypes) supported.push_back(dtype_name(known));
    return invalid_argument(
        "{}: tensor '{}' has ggml type {} ({}), which Folio does not compute with "
        "(supported: {})",
        source_, name, info->type.name, info->type.code, fmt::join(supported, ", "));
  }
  return GgufTensor{info, *dtype, tensor_bytes(*info)};
}

std::span<const std::byte> GgufFile::tensor_bytes(const GgufTensorInfo& info) const {
  FOLIO_DCHECK(&info >= tensors_.data() && &info < tensors_.data() + tensors_.size());
  // Parsing checked data_offset_ + offset + byte_size <= file size.
  const auto* base = reinterpret_cast<const std::byte*>(bytes_.data());
  return {base + data_offset_ + info.offset, info.byte_size};
}

void GgufFile::drop_resident_pages(const GgufTensorInfo& info) const {
  FOLIO_DCHECK(&info >= tensors_.data() && &info < tensors_.data() + tensors_.size());
  // Only a mapping that spans bytes_ from its start: parsed bytes are the caller's or ours.
  if (mapping_.has_value())
    mapping_->drop_resident_pages(data_offset_ + info.offset, info.byte_size);
}

}  // namespace folio::gguf
