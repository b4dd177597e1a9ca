#include "folio/gguf/gguf_writer.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "folio/gguf/gguf_file.h"

namespace folio::gguf {

// Where serialized bytes go: a growing buffer or a file.
class GgufWriter::Sink {
 public:
  virtual ~Sink() = default;
  virtual Status write(std::span<const uint8_t> bytes) = 0;

  template <typename T>
  Status write_scalar(T value) {
    uint8_t bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    return write(bytes);
  }
  Status write_string(std::string_view text) {
    FOLIO_RETURN_IF_ERROR(write_scalar<uint64_t>(text.size()));
    return write({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  }
  Status write_zeros(uint64_t count) {
    static constexpr uint8_t kZeros[64] = {};
    while (count > 0) {
      const uint64_t chunk = std::min<uint64_t>(count, sizeof(kZeros));
      FOLIO_RETURN_IF_ERROR(write({kZeros, chunk}));
      count -= chunk;
    }
    return Status();
  }
  uint64_t bytes_written() const { return bytes_written_; }

 protected:
  uint64_t bytes_written_ = 0;
};

namespace {

class BufferSink final : public GgufWriter::Sink {
 public:
  Status write(std::span<const uint8_t> bytes) override {
    buffer.insert(buffer.end(), bytes.begin(), bytes.end());
    bytes_written_ += bytes.size();
    return Status();
  }
  std::vector<uint8_t> buffer;
};

class FileSink final : public GgufWriter::Sink {
 public:
  FileSink(std::FILE* file, std::string path) : file_(file), path_(std::move(path)) {}
  Status write(std::span<const uint8_t> bytes) override {
    if (bytes.empty()) return Status();
    if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) {
      return errno_status("fwrite", fmt::format("writing '{}'", path_));
    }
    bytes_written_ += bytes.size();
    return Status();
  }

 private:
  std::FILE* file_;
  std::string path_;
};

Status write_value_payload(GgufWriter::Sink& sink, const GgufValue& value);

Status write_array_payload(GgufWriter::Sink& sink, const GgufValue& value) {
  FOLIO_RETURN_IF_ERROR(sink.write_scalar(static_cast<uint32_t>(value.element_type())));
  FOLIO_RETURN_IF_ERROR(sink.write_scalar<uint64_t>(value.array_size()));
  switch (value.element_type()) {
    case GgufValueType::kString:
      for (const std::string& text : value.string_elements()) {
        FOLIO_RETURN_IF_ERROR(sink.write_string(text));
      }
      return Status();
    case GgufValueType::kArray:
      for (const GgufValue& element : value.array_elements()) {
        FOLIO_RETURN_IF_ERROR(write_array_payload(sink, element));
      }
      return Status();
    default:
      return sink.write(value.numeric_bytes());
  }
}

Status write_value_payload(GgufWriter::Sink& sink, const GgufValue& value) {
  if (value.type() == GgufValueType::kString) return sink.write_string(*value.as_string());
  if (value.is_array()) return write_array_payload(sink, value);
  return sink.write(value.numeric_bytes());
}

uint64_t round_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

}  // namespace

void GgufWriter::set(std::string key, GgufValue value) {
  for (auto& [existing_key, existing_value] : metadata_) {
    if (existing_key == key) {
      existing_value = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
}

Status GgufWriter::add_tensor(std::string name, DType dtype, std::vector<int64_t> dimensions,
                              TensorFill fill) {
  if (name.empty() || name.size() > 64) {
    return invalid_argument("tensor name '{}' must be 1 to 64 bytes long", name);
  }
  for (const Tensor& tensor : tensors_) {
    if (tensor.name == name) return invalid_argument("tensor '{}' is added twice", name);
  }
  if (dimensions.empty() || dimensions.size() > kGgufMaxDimensions) {
    return invalid_argument("tensor '{}' has {} dimensions; GGUF allows 1 to {}", name,
                            dimensions.size(), kGgufMaxDimensions);
  }
  const DTypeInfo info = dtype_info(dtype);
  uint64_t elements = 1;
  for (int64_t extent : dimensions) {
    if (extent < 0) return invalid_argument("tensor '{}' has a negative extent {}", name, extent);
    const auto unsigned_extent = static_cast<uint64_t>(extent);
    if (unsigned_extent != 0 && elements > std::numeric_limits<int64_t>::max() / unsigned_extent) {
      return invalid_argument("tensor '{}' has too many elements", name);
    }
    elements *= unsigned_extent;
  }
  if (dimensions[0] % info.block_elements != 0) {
    return invalid_argument("tensor '{}': row length {} is not a multiple of the {} block size {}",
                            name, dimensions[0], info.name, info.block_elements);
  }
  const uint64_t blocks = elements / static_cast<uint64_t>(info.block_elements);
  if (blocks > std::numeric_limits<int64_t>::max() / static_cast<uint64_t>(info.block_bytes)) {
    return invalid_argument("tensor '{}' is too large", name);
  }
  const uint64_t byte_size = blocks * static_cast<uint64_t>(info.block_bytes);
  tensors_.push_back({std::move(name), dtype, std::move(dimensions), byte_size, std::move(fill)});
  return Status();
}

Status GgufWriter::add_tensor_bytes(std::string name, DType dtype, std::vector<int64_t> dimensions,
                                    std::vector<std::byte> bytes) {
  const std::string name_copy = name;
  auto shared = std::make_shared<const std::vector<std::byte>>(std::move(bytes));
  FOLIO_RETURN_IF_ERROR(add_tensor(
      std::move(name), dtype, std::move(dimensions), [shared](std::span<std::byte> destination) {
        if (!destination.empty()) {
          std::memcpy(destination.data(), shared->data(), destination.size());
        }
        return Status();
      }));
  if (tensors_.back().byte_size != shared->size()) {
    const uint64_t expected = tensors_.back().byte_size;
    tensors_.pop_back();
    return invalid_argument("tensor '{}' needs {} bytes, {} given", name_copy, expected,
                            shared->size());
  }
  return Status();
}

Result<uint64_t> GgufWriter::alignment() const {
  for (const auto& [key, value] : metadata_) {
    if (key != kGgufAlignmentKey) continue;
    const std::optional<uint32_t> alignment = value.as<uint32_t>();
    if (!alignment || !std::has_single_bit(*alignment)) {
      return invalid_argument("metadata '{}' must be a uint32 power of two", kGgufAlignmentKey);
    }
    return uint64_t{*alignment};
  }
  return uint64_t{kGgufDefaultAlignment};
}

Status GgufWriter::write(Sink& sink) const {
  FOLIO_ASSIGN_OR_RETURN(const uint64_t alignment, this->alignment());
  FOLIO_RETURN_IF_ERROR(sink.write({reinterpret_cast<const uint8_t*>("GGUF"), 4}));
  FOLIO_RETURN_IF_ERROR(sink.write_scalar<uint32_t>(3));
  FOLIO_RETURN_IF_ERROR(sink.write_scalar<uint64_t>(tensors_.size()));
  FOLIO_RETURN_IF_ERROR(sink.write_scalar<uint64_t>(metadata_.size()));
  for (const auto& [key, value] : metadata_) {
    FOLIO_RETURN_IF_ERROR(sink.write_string(key));
    FOLIO_RETURN_IF_ERROR(sink.write_scalar(static_cast<uint32_t>(value.type())));
    FOLIO_RETURN_IF_ERROR(write_value_payload(sink, value));
  }
  uint64_t offset = 0;
  for (const Tensor& tensor : tensors_) {
    FOLIO_RETURN_IF_ERROR(sink.write_string(tensor.name));
    FOLIO_RETURN_IF_ERROR(sink.write_scalar<uint32_t>(tensor.dimensions.size()));
    for (int64_t extent : tensor.dimensions) {
      FOLIO_RETURN_IF_ERROR(sink.write_scalar<uint64_t>(extent));
    }
    FOLIO_RETURN_IF_ERROR(sink.write_scalar<uint32_t>(dtype_info(tensor.dtype).ggml_type));
    FOLIO_RETURN_IF_ERROR(sink.write_scalar<uint64_t>(offset));
    offset = round_up(offset + tensor.byte_size, alignment);
  }
  FOLIO_RETURN_IF_ERROR(
      sink.write_zeros(round_up(sink.bytes_written(), alignment) - sink.bytes_written()));
  std::vector<std::byte> buffer;
  for (const Tensor& tensor : tensors_) {
    buffer.assign(tensor.byte_size, std::byte{0});
    FOLIO_RETURN_IF_ERROR(tensor.fill(buffer));
    FOLIO_RETURN_IF_ERROR(
        sink.write({reinterpret_cast<const uint8_t*>(buffer.data()), buffer.size()}));
    FOLIO_RETURN_IF_ERROR(
        sink.write_zeros(round_up(tensor.byte_size, alignment) - tensor.byte_size));
  }
  return Status();
}

Result<std::vector<uint8_t>> GgufWriter::write_to_buffer() const {
  BufferSink sink;
  FOLIO_RETURN_IF_ERROR(write(sink));
  return std::move(sink.buffer);
}

Status GgufWriter::write_file(const std::string& path) const {
  const std::string temporary = path + ".tmp";
  std::FILE* file = std::fopen(temporary.c_str(), "wb");
  if (file == nullptr) return errno_status("fopen", fmt::format("creating '{}'", temporary));
  FileSink sink(file, temporary);
  Status status = write(sink);
  if (status.ok() && std::fflush(file) != 0) {
    status = errno_status("fflush", fmt::format("writing '{}'", temporary));
  }
  if (std::fclose(file) != 0 && status.ok()) {
    status = errno_status("fclose", fmt::format("writing '{}'", temporary));
  }
  if (status.ok() && std::rename(temporary.c_str(), path.c_str()) != 0) {
    status = errno_status("rename", fmt::format("moving '{}' to '{}'", temporary, path));
  }
  if (!status.ok()) std::remove(temporary.c_str());
  return status;
}

}  // namespace folio::gguf
