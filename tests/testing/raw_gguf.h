// RawGguf assembles a GGUF file field by field, so a test can write exactly
// the malformed bytes it wants to see rejected.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace folio::gguf::testing {

class RawGguf {
 public:
  RawGguf& u32(uint32_t value) { return append(&value, 4); }
  RawGguf& u64(uint64_t value) { return append(&value, 8); }
  RawGguf& u8(uint8_t value) { return append(&value, 1); }
  RawGguf& str(std::string_view text) {
    u64(text.size());
    return append(text.data(), text.size());
  }
  RawGguf& header(uint32_t version, uint64_t tensor_count, uint64_t metadata_count) {
    append("GGUF", 4);
    u32(version);
    u64(tensor_count);
    return u64(metadata_count);
  }
  RawGguf& key_u32(std::string_view key, uint32_t value) {
    str(key);
    u32(4);
    return u32(value);
  }
  // A tensor info record with ggml type `type`.
  RawGguf& tensor_info(std::string_view name, std::vector<uint64_t> dimensions, uint32_t type,
                       uint64_t offset) {
    str(name);
    u32(static_cast<uint32_t>(dimensions.size()));
    for (uint64_t extent : dimensions) u64(extent);
    u32(type);
    return u64(offset);
  }
  RawGguf& pad_to(size_t alignment) {
    while (bytes.size() % alignment != 0) bytes.push_back(0);
    return *this;
  }
  RawGguf& zeros(size_t count) {
    bytes.insert(bytes.end(), count, 0);
    return *this;
  }
  RawGguf& append(const void* data, size_t size) {
    const auto* begin = static_cast<const uint8_t*>(data);
    bytes.insert(bytes.end(), begin, begin + size);
    return *this;
  }

  std::vector<uint8_t> bytes;
};

}  // namespace folio::gguf::testing
