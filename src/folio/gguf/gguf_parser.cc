// The GGUF parser behind GgufFile::parse. Every read goes through Cursor, which checks the
// bytes that remain before touching them; every count is checked against the bytes it needs
// (count <= remaining / minimum element size, so no multiplication can overflow) before any
// allocation sized by it.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>

#include "folio/gguf/gguf_file.h"

namespace folio::gguf {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
// Smallest possible records, used to bound counts by the bytes left.
constexpr uint64_t kMinKeyValueBytes = 8 + 1 + 4 + 1;        // key length, 1-byte key, type, u8
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 4 + 8;  // name, 0 dims, type, offset
constexpr uint64_t kMinArrayBytes = 4 + 8;                   // element type, count

// A read position inside the file's bytes. Reads never go past the end: each returns false and
// leaves the position unchanged when fewer bytes remain than it needs.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  uint64_t offset() const { return offset_; }
  uint64_t remaining() const { return bytes_.size() - offset_; }

  template <typename T>
  bool read(T* out) {
    if (remaining() < sizeof(T)) return false;
    std::memcpy(out, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return true;
  }
  bool read_span(uint64_t count, std::span<const uint8_t>* out) {
    if (remaining() < count) return false;
    *out = bytes_.subspan(offset_, count);
    offset_ += count;
    return true;
  }

 private:
  std::span<const uint8_t> bytes_;
  uint64_t offset_ = 0;
};

}  // namespace

// Fills a GgufFile from its bytes. `context_` names the record being read ("metadata key #3
// 'general.name'") so that every error says which field failed and where.
class GgufParser {
 public:
  GgufParser(GgufFile& file, const GgufLimits& limits)
      : file_(file), limits_(limits), cursor_(file.bytes_) {}

  Status parse() {
    uint64_t tensor_count = 0;
    uint64_t metadata_count = 0;
    FOLIO_RETURN_IF_ERROR(parse_header(&tensor_count, &metadata_count));
    FOLIO_RETURN_IF_ERROR(parse_metadata(metadata_count));
    FOLIO_RETURN_IF_ERROR(parse_alignment());
    FOLIO_RETURN_IF_ERROR(parse_tensor_infos(tensor_count));
    return place_tensor_data();
  }

 private:
  Status corrupt(uint64_t offset, std::string_view problem) const {
    const std::string where = context_.empty() ? "" : context_ + ": ";
    return data_loss("GGUF file {}: {}{} (at byte offset {})", file_.source_, where, problem,
                     offset);
  }
  Status truncated(std::string_view field, uint64_t bytes_needed) const {
    return corrupt(cursor_.offset(),
                   fmt::format("truncated: {} needs {} bytes but only {} remain of {}", field,
                               bytes_needed, cursor_.remaining(), file_.bytes_.size()));
  }
  template <typename T>
  Status read(std::string_view field, T* out) {
    if (!cursor_.read(out)) return truncated(field, sizeof(T));
    return Status();
  }
  // Checks `count` elements of at least `min_bytes` each can fit in what remains.
  Status check_count(std::string_view field, uint64_t count, uint64_t min_bytes,
                     uint64_t offset) const {
    if (count > cursor_.remaining() / min_bytes) {
      return corrupt(offset, fmt::format("{} {} cannot fit in the {} bytes that remain", field,
                                         count, cursor_.remaining()));
    }
    return Status();
  }

  Status parse_header(uint64_t* tensor_count, uint64_t* metadata_count);
  Status parse_metadata(uint64_t count);
  Status parse_alignment();
  Status parse_tensor_infos(uint64_t count);
  Status parse_tensor_info(size_t index);
  Status place_tensor_data();
  Result<std::string> parse_string(std::string_view field, uint64_t max_bytes);
  Result<GgufValue> parse_value(GgufValueType type, int depth);
  Result<GgufValue> parse_array(int depth);
  Result<GgufValueType> parse_type(std::string_view field);
  Status check_bools(std::span<const uint8_t> bytes, uint64_t offset) const;

  GgufFile& file_;
  const GgufLimits& limits_;
  Cursor cursor_;
  std::string context_;
};

Status GgufParser::parse_header(uint64_t* tensor_count, uint64_t* metadata_count) {
  context_ = "header";
  uint32_t magic = 0;
  FOLIO_RETURN_IF_ERROR(read("magic", &magic));
  if (magic != kGgufMagic) {
    char text[5] = {};
    std::memcpy(text, &magic, 4);
    const bool legacy = std::string_view(text) == "lmgg" || std::string_view(text) == "fmgg" ||
                        std::string_view(text) == "tjgg";
    return corrupt(0, legacy
                          ? "magic says a legacy ggml/ggjt file, which predates GGUF; "
                            "convert it with a current llama.cpp"
                          : fmt::format("magic is 0x{:08x}, not \"GGUF\": not a GGUF file", magic));
  }
  uint32_t version = 0;
  FOLIO_RETURN_IF_ERROR(read("version", &version));
  if (version == 1) {
    return invalid_argument(
        "GGUF file {}: version 1 (at byte offset 4) is not supported: it uses 32-bit counts; "
        "re-convert the model with a llama.cpp from after August 2023",
        file_.source_);
  }
  if (version != 2 && version != 3) {
    const uint32_t swapped = __builtin_bswap32(version);
    if (swapped >= 1 && swapped <= 3) {
      return invalid_argument(
          "GGUF file {}: version field (at byte offset 4) says the file is big-endian, "
          "which Folio does not read",
          file_.source_);
    }
    return invalid_argument(
        "GGUF file {}: version {} (at byte offset 4) is not supported (only 2 and 3)",
        file_.source_, version);
  }
  file_.version_ = version;
  FOLIO_RETURN_IF_ERROR(read("tensor count", tensor_count));
  FOLIO_RETURN_IF_ERROR(read("metadata count", metadata_count));
  // Both sections follow, so each count must fit in what remains on its own.
  FOLIO_RETURN_IF_ERROR(check_count("tensor count", *tensor_count, kMinTensorInfoBytes, 8));
  return check_count("metadata count", *metadata_count, kMinKeyValueBytes, 16);
}

Result<std::string> GgufParser::parse_string(std::string_view field, uint64_t max_bytes) {
  const uint64_t offset = cursor_.offset();
  uint64_t length = 0;
  FOLIO_RETURN_IF_ERROR(read(fmt::format("{} length", field), &length));
  if (length > max_bytes) {
    return corrupt(offset, fmt::format("{} length {} exceeds the limit of {} bytes", field, length,
                                       max_bytes));
  }
  std::span<const uint8_t> bytes;
  if (!cursor_.read_span(length, &bytes)) return truncated(field, length);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

Result<GgufValueType> GgufParser::parse_type(std::string_view field) {
  const uint64_t offset = cursor_.offset();
  uint32_t code = 0;
  FOLIO_RETURN_IF_ERROR(read(field, &code));
  if (auto type = gguf_value_type_from_code(code)) return *type;
  return corrupt(offset, fmt::format("{} {} is not a GGUF value type (0-12)", field, code));
}

Status GgufParser::check_bools(std::span<const uint8_t> bytes, uint64_t offset) const {
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] > 1) {
      return corrupt(offset + i, fmt::format("bool value {} is neither 0 nor 1", bytes[i]));
    }
  }
  return Status();
}

Result<GgufValue> GgufParser::parse_value(GgufValueType type, int depth) {
  const uint64_t offset = cursor_.offset();
  switch (type) {
    case GgufValueType::kString: {
      FOLIO_ASSIGN_OR_RETURN(std::string text,
                             parse_string("string value", limits_.max_string_bytes));
      return GgufValue::of_string(std::move(text));
    }
    case GgufValueType::kArray:
      return parse_array(depth + 1);
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
    case GgufValueType::kBool:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      break;
  }
  const size_t size = gguf_value_type_size(type);
  std::span<const uint8_t> bytes;
  if (!cursor_.read_span(size, &bytes)) {
    return truncated(fmt::format("{} value", gguf_value_type_name(type)), size);
  }
  if (type == GgufValueType::kBool) FOLIO_RETURN_IF_ERROR(check_bools(bytes, offset));
  return GgufValue::scalar_from_bytes(type, bytes);
}

Result<GgufValue> GgufParser::parse_array(int depth) {
  if (depth > limits_.max_array_nesting) {
    return corrupt(cursor_.offset(), fmt::format("arrays nest deeper than the limit of {}",
                                                 limits_.max_array_nesting));
  }
  FOLIO_ASSIGN_OR_RETURN(GgufValueType element_type, parse_type("array element type"));
  const uint64_t count_offset = cursor_.offset();
  uint64_t count = 0;
  FOLIO_RETURN_IF_ERROR(read("array length", &count));
  if (count > limits_.max_array_elements) {
    return corrupt(count_offset, fmt::format("array length {} exceeds the limit of {}", count,
                                             limits_.max_array_elements));
  }
  if (element_type == GgufValueType::kString) {
    FOLIO_RETURN_IF_ERROR(check_count("string array length", count, 8, count_offset));
    std::vector<std::string> strings;
    strings.reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
      FOLIO_ASSIGN_OR_RETURN(std::string text, parse_string(fmt::format("string element {}", i),
                                                            limits_.max_string_bytes));
      strings.push_back(std::move(text));
    }
    return GgufValue::array_of_strings(std::move(strings));
  }
  if (element_type == GgufValueType::kArray) {
    FOLIO_RETURN_IF_ERROR(check_count("nested array length", count, kMinArrayBytes, count_offset));
    std::vector<GgufValue> arrays;
    arrays.reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
      FOLIO_ASSIGN_OR_RETURN(GgufValue element, parse_array(depth + 1));
      arrays.push_back(std::move(element));
    }
    return GgufValue::array_of_arrays(std::move(arrays));
  }
  const size_t size = gguf_value_type_size(element_type);
  FOLIO_RETURN_IF_ERROR(
      check_count(fmt::format("{} array length", gguf_value_type_name(element_type)), count, size,
                  count_offset));
  const uint64_t data_offset = cursor_.offset();
  std::span<const uint8_t> bytes;
  FOLIO_CHECK(cursor_.read_span(count * size, &bytes));  // checked just above
  if (element_type == GgufValueType::kBool) FOLIO_RETURN_IF_ERROR(check_bools(bytes, data_offset));
  return GgufValue::array_from_bytes(element_type, count, bytes);
}

Status GgufParser::parse_metadata(uint64_t count) {
  file_.metadata_.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t record_offset = cursor_.offset();
    context_ = fmt::format("metadata entry #{}", i);
    FOLIO_ASSIGN_OR_RETURN(std::string key, parse_string("key", limits_.max_key_bytes));
    if (key.empty()) return corrupt(record_offset, "key is empty");
    context_ = fmt::format("metadata entry #{} '{}'", i, key);
    if (file_.metadata_index_.contains(key)) {
      return corrupt(record_offset, "key appears twice");
    }
    FOLIO_ASSIGN_OR_RETURN(GgufValueType type, parse_type("value type"));
    FOLIO_ASSIGN_OR_RETURN(GgufValue value, parse_value(type, 0));
    file_.metadata_index_.emplace(key, file_.metadata_.size());
    file_.metadata_.push_back({std::move(key), std::move(value), record_offset});
  }
  context_.clear();
  return Status();
}

Status GgufParser::parse_alignment() {
  const auto it = file_.metadata_index_.find(kGgufAlignmentKey);
  if (it == file_.metadata_index_.end()) return Status();
  const GgufKeyValue& entry = file_.metadata_[it->second];
  context_ = fmt::format("metadata '{}'", kGgufAlignmentKey);
  const std::optional<uint32_t> alignment = entry.value.as<uint32_t>();
  if (!alignment) {
    return corrupt(entry.file_offset, fmt::format("must be a uint32, found a {}",
                                                  gguf_value_type_name(entry.value.type())));
  }
  if (!std::has_single_bit(*alignment)) {
    return corrupt(entry.file_offset,
                   fmt::format("alignment {} is not a power of two", *alignment));
  }
  file_.alignment_ = *alignment;
  context_.clear();
  return Status();
}

Status GgufParser::parse_tensor_infos(uint64_t count) {
  FOLIO_RETURN_IF_ERROR(check_count("tensor count", count, kMinTensorInfoBytes, 8));
  file_.tensors_.reserve(count);
  for (uint64_t i = 0; i < count; ++i) FOLIO_RETURN_IF_ERROR(parse_tensor_info(i));
  context_.clear();
  return Status();
}

Status GgufParser::parse_tensor_info(size_t index) {
  GgufTensorInfo info{};
  info.info_offset = cursor_.offset();
  context_ = fmt::format("tensor info #{}", index);
  FOLIO_ASSIGN_OR_RETURN(info.name, parse_string("name", limits_.max_tensor_name_bytes));
  if (info.name.empty()) return corrupt(info.info_offset, "name is empty");
  context_ = fmt::format("tensor info #{} '{}'", index, info.name);
  if (file_.tensor_index_.contains(info.name)) {
    return corrupt(info.info_offset, "name appears twice");
  }
  const uint64_t dimensions_offset = cursor_.offset();
  uint32_t dimension_count = 0;
  FOLIO_RETURN_IF_ERROR(read("dimension count", &dimension_count));
  if (dimension_count > kGgufMaxDimensions) {
    return corrupt(dimensions_offset, fmt::format("{} dimensions exceed the maximum of {}",
                                                  dimension_count, kGgufMaxDimensions));
  }
  info.element_count = 1;
  for (uint32_t d = 0; d < dimension_count; ++d) {
    const uint64_t offset = cursor_.offset();
    uint64_t extent = 0;
    FOLIO_RETURN_IF_ERROR(read(fmt::format("dimension {}", d), &extent));
    constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    if (extent > kMax ||
        (extent != 0 && static_cast<uint64_t>(info.element_count) > kMax / extent)) {
      return corrupt(offset,
                     fmt::format("dimension {} = {} makes the element count overflow", d, extent));
    }
    info.dimensions.push_back(static_cast<int64_t>(extent));
    info.element_count *= static_cast<int64_t>(extent);
  }
  const uint64_t type_offset = cursor_.offset();
  uint32_t type_code = 0;
  FOLIO_RETURN_IF_ERROR(read("ggml type", &type_code));
  const std::optional<GgmlTypeInfo> type = ggml_type_info(type_code);
  if (!type) return corrupt(type_offset, fmt::format("ggml type {} is unknown", type_code));
  info.type = *type;
  const int64_t row_length = dimension_count == 0 ? 1 : info.dimensions[0];
  if (row_length % type->block_elements != 0) {
    return corrupt(dimensions_offset,
                   fmt::format("row length {} is not a multiple of the {} block size {}",
                               row_length, type->name, type->block_elements));
  }
  // element_count / block_elements blocks; bytes = blocks * block_bytes must not overflow.
  const auto blocks = static_cast<uint64_t>(info.element_count / type->block_elements);
  if (blocks > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(type->block_bytes)) {
    return corrupt(dimensions_offset, "byte size overflows 64 bits");
  }
  info.byte_size = blocks * static_cast<uint64_t>(type->block_bytes);
  FOLIO_RETURN_IF_ERROR(read("data offset", &info.offset));
  file_.tensor_index_.emplace(info.name, file_.tensors_.size());
  file_.tensors_.push_back(std::move(info));
  return Status();
}

Status GgufParser::place_tensor_data() {
  const uint64_t end_of_infos = cursor_.offset();
  const uint64_t alignment = file_.alignment_;
  const uint64_t file_size = file_.bytes_.size();
  // end_of_infos <= file_size, so rounding up cannot overflow.
  file_.data_offset_ = (end_of_infos + alignment - 1) / alignment * alignment;
  const uint64_t data_size = file_.data_offset_ <= file_size ? file_size - file_.data_offset_ : 0;
  for (const GgufTensorInfo& info : file_.tensors_) {
    context_ = fmt::format("tensor '{}'", info.name);
    const uint64_t field_offset =
        info.info_offset + 8 + info.name.size() + 4 + 8 * info.dimensions.size() + 4;
    if (info.offset % alignment != 0) {
      return corrupt(field_offset, fmt::format("data offset {} is not a multiple of the "
                                               "alignment {}",
                                               info.offset, alignment));
    }
    if (info.offset > data_size || info.byte_size > data_size - info.offset) {
      return corrupt(field_offset,
                     fmt::format("data [{}, +{}) extends past the end of the data section, "
                                 "which holds {} bytes from file offset {}",
                                 info.offset, info.byte_size, data_size, file_.data_offset_));
    }
  }
  // Overlap: sorted by offset, each non-empty tensor must end before the next one starts.
  std::vector<size_t> order(file_.tensors_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return file_.tensors_[a].offset < file_.tensors_[b].offset;
  });
  const GgufTensorInfo* previous = nullptr;
  for (size_t index : order) {
    const GgufTensorInfo& info = file_.tensors_[index];
    if (info.byte_size == 0) continue;
    if (previous != nullptr && previous->offset + previous->byte_size > info.offset) {
      context_ = fmt::format("tensor '{}'", info.name);
      return corrupt(info.info_offset,
                     fmt::format("data [{}, {}) overlaps tensor '{}' at [{}, {})", info.offset,
                                 info.offset + info.byte_size, previous->name, previous->offset,
                                 previous->offset + previous->byte_size));
    }
    previous = &info;
  }
  context_.clear();
  return Status();
}

Result<GgufFile> GgufFile::parse(std::span<const uint8_t> bytes, std::string source,
                                 const GgufLimits& limits) {
  GgufFile file;
  file.source_ = std::move(source);
  file.bytes_ = bytes;
  GgufParser parser(file, limits);
  FOLIO_RETURN_IF_ERROR(parser.parse());
  return file;
}

}  // namespace folio::gguf
