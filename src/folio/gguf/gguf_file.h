// GgufFile: a parsed GGUF file (versions 2 and 3): its metadata, its tensor table, and its
// tensor data used in place.
//
// Layout (all integers little-endian):
//   header      "GGUF", uint32 version, uint64 tensor_count, uint64 metadata_count
//   metadata    metadata_count x (string key, uint32 value_type, value)
//   tensor info tensor_count x (string name, uint32 n_dims, uint64 dims[n_dims],
//                               uint32 ggml_type, uint64 offset)
//   padding     to a multiple of `general.alignment` (default 32)
//   data        tensor bytes; each tensor at data_offset() + its offset, offsets aligned
// A string is uint64 length + bytes (no terminator). Dimensions are in ggml order: dims[0] is
// the row length (the contiguous dimension), dims[1] the number of rows, and so on.
//
// Guarantees: parsing never reads outside the given bytes and never trusts a count, size or
// offset before checking it, with overflow-safe arithmetic, against the bytes that remain, so a
// truncated, corrupt or hostile file gets a Status (kDataLoss for a malformed file,
// kInvalidArgument for a well-formed one Folio does not support) naming the field and its byte
// offset. Memory use while parsing is bounded by a small multiple of the file size. After a
// successful parse every tensor lies inside the file, is aligned, and overlaps no other tensor.
//
// Thread-safety: immutable after parse; every const method may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "folio/base/result.h"
#include "folio/gguf/ggml_type.h"
#include "folio/gguf/gguf_value.h"
#include "folio/gguf/mapped_file.h"
#include "folio/tensor/dtype.h"

namespace folio::gguf {

inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr int kGgufMaxDimensions = 4;  // GGML_MAX_DIMS
inline constexpr std::string_view kGgufAlignmentKey = "general.alignment";

// Limits beyond the file-size bounds, against files that are well-formed but absurd.
struct GgufLimits {
  uint64_t max_key_bytes = 65535;                 // the spec's limit for keys
  uint64_t max_tensor_name_bytes = 64;            // the spec's limit for tensor names
  uint64_t max_string_bytes = uint64_t{1} << 28;  // 256 MiB (chat templates are kilobytes)
  uint64_t max_array_elements = uint64_t{1} << 31;
  int max_array_nesting = 4;  // arrays of arrays of ... (1 = no nesting)
};

struct GgufKeyValue {
  std::string key;
  GgufValue value;
  uint64_t file_offset;  // where the record (its key length) starts
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dimensions;  // ggml order; dimensions[0] is the contiguous row length
  GgmlTypeInfo type;
  uint64_t offset;        // from data_offset(); a multiple of the alignment
  uint64_t byte_size;     // exact, without padding
  int64_t element_count;  // product of dimensions (1 for zero dimensions)
  uint64_t info_offset;   // where the tensor's info record starts in the file
};

// A tensor of a type Folio computes with, inside the file's bytes.
struct GgufTensor {
  const GgufTensorInfo* info;
  DType dtype;
  std::span<const std::byte> data;  // dtype [dimensions reversed], info->byte_size bytes
};

class GgufFile {
 public:
  // Maps the file read-only and parses it. Errors name the path.
  static Result<GgufFile> open(const std::string& path, const GgufLimits& limits = {});
  // Parses bytes the caller keeps alive for the life of the GgufFile and of every span taken
  // from it. `source` names the bytes in error messages.
  static Result<GgufFile> parse(std::span<const uint8_t> bytes, std::string source = "<memory>",
                                const GgufLimits& limits = {});
  // Parses bytes the GgufFile takes ownership of.
  static Result<GgufFile> parse_owned(std::vector<uint8_t> bytes, std::string source = "<memory>",
                                      const GgufLimits& limits = {});

  GgufFile(GgufFile&&) = default;
  GgufFile& operator=(GgufFile&&) = default;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& source() const { return source_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return bytes_.size(); }
  // File offset of the data section (may equal file_size() when there are no tensors).
  uint64_t data_offset() const { return data_offset_; }

  // Metadata in file order.
  const std::vector<GgufKeyValue>& metadata() const { return metadata_; }
  // Nullptr when absent.
  const GgufValue* find(std::string_view key) const;
  bool contains(std::string_view key) const { return find(key) != nullptr; }

  // Typed getters: kNotFound when the key is absent, kInvalidArgument when its type differs;
  // both messages name the key.
  template <GgufScalar T>
  Result<T> get(std::string_view key) const {
    FOLIO_ASSIGN_OR_RETURN(const GgufValue* value, require(key));
    if (auto scalar = value->as<T>()) return *scalar;
    return wrong_type(key, *value, gguf_value_type_name(GgufTypeOf<T>::value));
  }
  // Any integer type (uint8 ... int64; a uint64 must fit in int64).
  Result<int64_t> get_integer(std::string_view key) const;
  // float32 or float64.
  Result<double> get_floating(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const { return get<bool>(key); }
  Result<std::string_view> get_string(std::string_view key) const;
  template <GgufScalar T>
  Result<std::vector<T>> get_array(std::string_view key) const {
    FOLIO_ASSIGN_OR_RETURN(const GgufValue* value, require(key));
    if (auto values = value->elements<T>()) return std::move(*values);
    return wrong_type(key, *value,
                      fmt::format("array of {}", gguf_value_type_name(GgufTypeOf<T>::value)));
  }
  Result<std::span<const std::string>> get_string_array(std::string_view key) const;

  // Tensor infos in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // Nullptr when absent.
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  // The tensor with its Folio dtype: kNotFound when absent, kInvalidArgument when its ggml type
  // has no folio::DType (the message names the tensor and the type).
  Result<GgufTensor> tensor(std::string_view name) const;
  // Bytes of any tensor, whatever its type. Requires: `info` is one of tensors().
  std::span<const std::byte> tensor_bytes(const GgufTensorInfo& info) const;
  // Drops the resident pages of `info`'s bytes when the file is mapped (MappedFile::
  // drop_resident_pages: re-read from the file if touched again); nothing for bytes in memory.
  // For a tensor the model keeps in another form (q8_0 weights repacked at load).
  void drop_resident_pages(const GgufTensorInfo& info) const;

 private:
  friend class GgufParser;
  GgufFile() = default;

  Result<const GgufValue*> require(std::string_view key) const;
  Status wrong_type(std::string_view key, const GgufValue& value, std::string_view expected) const;

  std::string source_;
  std::optional<MappedFile> mapping_;  // owns bytes_ when opened from a path
  std::vector<uint8_t> owned_bytes_;   // owns bytes_ when parsed with parse_owned
  std::span<const uint8_t> bytes_;     // stays valid across moves: both owners keep addresses
  uint32_t version_ = 0;
  uint64_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<GgufKeyValue> metadata_;
  std::map<std::string, size_t, std::less<>> metadata_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace folio::gguf
