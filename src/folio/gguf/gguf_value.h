// GgufValue: one metadata value of a GGUF file, owned and typed exactly as the file stores it.
//
// GGUF metadata is a list of (key, value) pairs. A value is a scalar (8 to 64-bit integers,
// f32, f64, bool), a UTF-8 string, or an array whose elements all share one type; an array's
// element type may itself be `array`, so arrays nest (each inner array carries its own element
// type). The reader copies values out of the file, so a GgufValue never points into a mapping
// and outlives the file it came from; the writer serializes the same type, so a value read back
// compares equal to the value written.
//
// Numeric scalars and arrays are held as packed little-endian bytes (the GGUF encoding; Folio
// builds only for little-endian hosts), strings as std::string, nested arrays as GgufValues.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "folio/base/check.h"

namespace folio::gguf {

static_assert(std::endian::native == std::endian::little,
              "GGUF is read in place as little-endian; big-endian hosts are not supported");

// The on-disk value type codes (gguf_type in ggml).
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint32", "string", ...; "invalid" for codes outside the enum.
std::string_view gguf_value_type_name(GgufValueType type);
// Nullopt for a code the format does not define.
std::optional<GgufValueType> gguf_value_type_from_code(uint32_t code);
// Bytes of one value of a fixed-size type; 0 for string and array.
size_t gguf_value_type_size(GgufValueType type);

// The GGUF type of a C++ scalar type.
template <typename T>
struct GgufTypeOf;
template <>
struct GgufTypeOf<uint8_t> {
  static constexpr GgufValueType value = GgufValueType::kUint8;
};
template <>
struct GgufTypeOf<int8_t> {
  static constexpr GgufValueType value = GgufValueType::kInt8;
};
template <>
struct GgufTypeOf<uint16_t> {
  static constexpr GgufValueType value = GgufValueType::kUint16;
};
template <>
struct GgufTypeOf<int16_t> {
  static constexpr GgufValueType value = GgufValueType::kInt16;
};
template <>
struct GgufTypeOf<uint32_t> {
  static constexpr GgufValueType value = GgufValueType::kUint32;
};
template <>
struct GgufTypeOf<int32_t> {
  static constexpr GgufValueType value = GgufValueType::kInt32;
};
template <>
struct GgufTypeOf<float> {
  static constexpr GgufValueType value = GgufValueType::kFloat32;
};
template <>
struct GgufTypeOf<bool> {
  static constexpr GgufValueType value = GgufValueType::kBool;
};
template <>
struct GgufTypeOf<uint64_t> {
  static constexpr GgufValueType value = GgufValueType::kUint64;
};
template <>
struct GgufTypeOf<int64_t> {
  static constexpr GgufValueType value = GgufValueType::kInt64;
};
template <>
struct GgufTypeOf<double> {
  static constexpr GgufValueType value = GgufValueType::kFloat64;
};

template <typename T>
concept GgufScalar = requires {
  GgufTypeOf<T>::value;
};

// Invariants: a scalar holds exactly one element; an array of a fixed-size type holds
// array_size() * gguf_value_type_size(element_type()) packed bytes; a string array holds
// array_size() strings; a nested array holds array_size() GgufValues, each an array.
// Thread-safety: immutable after construction; safe to share.
class GgufValue {
 public:
  template <GgufScalar T>
  static GgufValue of(T value) {
    GgufValue result(GgufTypeOf<T>::value);
    result.count_ = 1;
    result.numeric_.resize(sizeof(T));
    std::memcpy(result.numeric_.data(), &value, sizeof(T));
    return result;
  }
  static GgufValue of_string(std::string value);

  template <GgufScalar T>
  static GgufValue array_of(std::span<const T> values) {
    GgufValue result(GgufValueType::kArray);
    result.element_type_ = GgufTypeOf<T>::value;
    result.count_ = values.size();
    result.numeric_.resize(values.size_bytes());
    if (!values.empty()) std::memcpy(result.numeric_.data(), values.data(), values.size_bytes());
    return result;
  }
  static GgufValue array_of_strings(std::vector<std::string> values);
  // Requires: every element is itself an array.
  static GgufValue array_of_arrays(std::vector<GgufValue> arrays);
  // An array of a fixed-size type from its packed little-endian bytes (the reader's path).
  // Requires: element_type has a fixed size and bytes.size() == count * that size.
  static GgufValue array_from_bytes(GgufValueType element_type, uint64_t count,
                                    std::span<const uint8_t> bytes);
  // A fixed-size scalar from its little-endian bytes. Requires: bytes.size() == type's size.
  static GgufValue scalar_from_bytes(GgufValueType type, std::span<const uint8_t> bytes);

  GgufValueType type() const { return type_; }
  bool is_array() const { return type_ == GgufValueType::kArray; }
  // Requires: is_array().
  GgufValueType element_type() const;
  // Requires: is_array().
  uint64_t array_size() const;

  // The scalar when this is a scalar of exactly type T; nullopt otherwise.
  template <GgufScalar T>
  std::optional<T> as() const {
    if (type_ != GgufTypeOf<T>::value) return std::nullopt;
    T value;
    std::memcpy(&value, numeric_.data(), sizeof(T));
    return value;
  }
  // The string when this is a string; nullopt otherwise.
  std::optional<std::string_view> as_string() const;

  // Any integer scalar as int64 (uint64 above INT64_MAX does not fit: nullopt). Nullopt for
  // non-integers. bool is not an integer.
  std::optional<int64_t> as_integer() const;
  // f32 or f64 scalar as double; nullopt otherwise.
  std::optional<double> as_floating() const;

  // Elements of an array of exactly type T, copied out; nullopt when this is not such an array.
  template <GgufScalar T>
  std::optional<std::vector<T>> elements() const {
    if (type_ != GgufValueType::kArray || element_type_ != GgufTypeOf<T>::value) {
      return std::nullopt;
    }
    std::vector<T> values(count_);
    if (count_ != 0) std::memcpy(values.data(), numeric_.data(), numeric_.size());
    return values;
  }
  // Element i of a fixed-size array, as T; nullopt when the element type is not T.
  // Requires: is_array() and i < array_size().
  template <GgufScalar T>
  std::optional<T> element(uint64_t i) const {
    FOLIO_DCHECK(type_ == GgufValueType::kArray && i < count_);
    if (element_type_ != GgufTypeOf<T>::value) return std::nullopt;
    T value;
    std::memcpy(&value, numeric_.data() + i * sizeof(T), sizeof(T));
    return value;
  }
  // Elements of a string array (empty for other types).
  std::span<const std::string> string_elements() const;
  // Elements of an array of arrays (empty for other types).
  std::span<const GgufValue> array_elements() const;
  // Packed little-endian bytes of a fixed-size scalar or array (empty for other types).
  std::span<const uint8_t> numeric_bytes() const { return numeric_; }

  friend bool operator==(const GgufValue& a, const GgufValue& b) = default;

 private:
  explicit GgufValue(GgufValueType type) : type_(type) {}

  GgufValueType type_;
  GgufValueType element_type_ = GgufValueType::kUint8;  // meaningful for arrays only
  uint64_t count_ = 0;                                  // 1 for scalars
  std::vector<uint8_t> numeric_;
  std::vector<std::string> strings_;  // a string scalar keeps its one string here
  std::vector<GgufValue> arrays_;
};

// A short human-readable rendering: scalars in full ("4096", "1e-05", "\"llama\""), arrays as
// "[string x 32000] [\"<unk>\", \"<s>\", ...]" with at most `max_elements` elements shown and
// strings longer than `max_string_bytes` cut with "...". Control bytes are escaped.
std::string render_gguf_value(const GgufValue& value, size_t max_elements = 8,
                              size_t max_string_bytes = 64);

}  // namespace folio::gguf
