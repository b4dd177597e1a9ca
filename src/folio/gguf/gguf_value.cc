#include "folio/gguf/gguf_value.h"

#include <limits>

#include <fmt/format.h>

namespace folio::gguf {

std::string_view gguf_value_type_name(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return "invalid";
}

std::optional<GgufValueType> gguf_value_type_from_code(uint32_t code) {
  if (code > static_cast<uint32_t>(GgufValueType::kFloat64)) return std::nullopt;
  return static_cast<GgufValueType>(code);
}

size_t gguf_value_type_size(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}

GgufValue GgufValue::of_string(std::string value) {
  GgufValue result(GgufValueType::kString);
  result.count_ = 1;
  result.strings_.push_back(std::move(value));
  return result;
}

GgufValue GgufValue::array_of_strings(std::vector<std::string> values) {
  GgufValue result(GgufValueType::kArray);
  result.element_type_ = GgufValueType::kString;
  result.count_ = values.size();
  result.strings_ = std::move(values);
  return result;
}

GgufValue GgufValue::array_of_arrays(std::vector<GgufValue> arrays) {
  for (const GgufValue& element : arrays) {
    FOLIO_CHECK(element.is_array(), "array_of_arrays: an element is a {}",
                gguf_value_type_name(element.type()));
  }
  GgufValue result(GgufValueType::kArray);
  result.element_type_ = GgufValueType::kArray;
  result.count_ = arrays.size();
  result.arrays_ = std::move(arrays);
  return result;
}

GgufValue GgufValue::array_from_bytes(GgufValueType element_type, uint64_t count,
                                      std::span<const uint8_t> bytes) {
  const size_t element_size = gguf_value_type_size(element_type);
  FOLIO_CHECK(element_size != 0 && bytes.size() == count * element_size,
              "array_from_bytes: {} bytes for {} elements of {}", bytes.size(), count,
              gguf_value_type_name(element_type));
  GgufValue result(GgufValueType::kArray);
  result.element_type_ = element_type;
  result.count_ = count;
  result.numeric_.assign(bytes.begin(), bytes.end());
  return result;
}

GgufValue GgufValue::scalar_from_bytes(GgufValueType type, std::span<const uint8_t> bytes) {
  const size_t size = gguf_value_type_size(type);
  FOLIO_CHECK(size != 0 && bytes.size() == size, "scalar_from_bytes: {} bytes for a {}",
              bytes.size(), gguf_value_type_name(type));
  GgufValue result(type);
  result.count_ = 1;
  result.numeric_.assign(bytes.begin(), bytes.end());
  return result;
}

GgufValueType GgufValue::element_type() const {
  FOLIO_DCHECK(is_array());
  return element_type_;
}

uint64_t GgufValue::array_size() const {
  FOLIO_DCHECK(is_array());
  return count_;
}

std::optional<std::string_view> GgufValue::as_string() const {
  if (type_ != GgufValueType::kString) return std::nullopt;
  return std::string_view(strings_.front());
}

std::optional<int64_t> GgufValue::as_integer() const {
  switch (type_) {
    case GgufValueType::kUint8:
      return *as<uint8_t>();
    case GgufValueType::kInt8:
      return *as<int8_t>();
    case GgufValueType::kUint16:
      return *as<uint16_t>();
    case GgufValueType::kInt16:
      return *as<int16_t>();
    case GgufValueType::kUint32:
      return *as<uint32_t>();
    case GgufValueType::kInt32:
      return *as<int32_t>();
    case GgufValueType::kInt64:
      return *as<int64_t>();
    case GgufValueType::kUint64: {
      const uint64_t value = *as<uint64_t>();
      if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
      return static_cast<int64_t>(value);
    }
    case GgufValueType::kFloat32:
    case GgufValueType::kFloat64:
    case GgufValueType::kBool:
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<double> GgufValue::as_floating() const {
  if (type_ == GgufValueType::kFloat32) return *as<float>();
  if (type_ == GgufValueType::kFloat64) return *as<double>();
  return std::nullopt;
}

std::span<const std::string> GgufValue::string_elements() const {
  if (type_ != GgufValueType::kArray || element_type_ != GgufValueType::kString) return {};
  return strings_;
}

std::span<const GgufValue> GgufValue::array_elements() const {
  if (type_ != GgufValueType::kArray || element_type_ != GgufValueType::kArray) return {};
  return arrays_;
}

namespace {

// Quotes a string, escaping control bytes, quotes and backslashes, and cutting it after
// `max_bytes` bytes (a cut may split a multi-byte character; the rendering is for humans).
std::string quote(std::string_view text, size_t max_bytes) {
  std::string out = "\"";
  const size_t shown = std::min(text.size(), max_bytes);
  for (size_t i = 0; i < shown; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte == '"' || byte == '\\') {
      out += '\\';
      out += static_cast<char>(byte);
    } else if (byte == '\n') {
      out += "\\n";
    } else if (byte == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += static_cast<char>(byte);
    }
  }
  if (shown < text.size()) out += "...";
  out += '"';
  return out;
}

std::string render_numeric_element(GgufValueType type, const uint8_t* bytes) {
  auto load = [bytes]<typename T>(T) {
    T value;
    std::memcpy(&value, bytes, sizeof(T));
    return value;
  };
  switch (type) {
    case GgufValueType::kUint8:
      return fmt::format("{}", load(uint8_t{}));
    case GgufValueType::kInt8:
      return fmt::format("{}", load(int8_t{}));
    case GgufValueType::kUint16:
      return fmt::format("{}", load(uint16_t{}));
    case GgufValueType::kInt16:
      return fmt::format("{}", load(int16_t{}));
    case GgufValueType::kUint32:
      return fmt::format("{}", load(uint32_t{}));
    case GgufValueType::kInt32:
      return fmt::format("{}", load(int32_t{}));
    case GgufValueType::kUint64:
      return fmt::format("{}", load(uint64_t{}));
    case GgufValueType::kInt64:
      return fmt::format("{}", load(int64_t{}));
    case GgufValueType::kFloat32:
      return fmt::format("{}", load(float{}));
    case GgufValueType::kFloat64:
      return fmt::format("{}", load(double{}));
    case GgufValueType::kBool:
      return bytes[0] != 0 ? "true" : "false";
    case GgufValueType::kString:
    case GgufValueType::kArray:
      break;
  }
  FOLIO_UNREACHABLE("render_numeric_element of a {}", gguf_value_type_name(type));
}

}  // namespace

std::string render_gguf_value(const GgufValue& value, size_t max_elements,
                              size_t max_string_bytes) {
  if (value.type() == GgufValueType::kString) return quote(*value.as_string(), max_string_bytes);
  if (!value.is_array()) return render_numeric_element(value.type(), value.numeric_bytes().data());

  const uint64_t count = value.array_size();
  const size_t shown = static_cast<size_t>(std::min<uint64_t>(count, max_elements));
  std::string out = fmt::format("[{} x {}] [", gguf_value_type_name(value.element_type()), count);
  for (size_t i = 0; i < shown; ++i) {
    if (i != 0) out += ", ";
    switch (value.element_type()) {
      case GgufValueType::kString:
        out += quote(value.string_elements()[i], max_string_bytes);
        break;
      case GgufValueType::kArray:
        out += render_gguf_value(value.array_elements()[i], max_elements, max_string_bytes);
        break;
      default: {
        const size_t size = gguf_value_type_size(value.element_type());
        out +=
            render_numeric_element(value.element_type(), value.numeric_bytes().data() + i * size);
      }
    }
  }
  if (shown < count) out += shown == 0 ? "..." : ", ...";
  out += ']';
  return out;
}

}  // namespace folio::gguf
