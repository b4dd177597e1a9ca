// DType: the element types Folio stores tensors in. Quantized types are stored in ggml's block
// layouts, so GGUF weights are used in place (mmap) without conversion:
//   q8_0: blocks of 32 values: f16 scale d, then 32 int8 q;            value = d * q
//   q4_0: blocks of 32 values: f16 scale d, then 16 bytes of nibbles;  value = d * (nibble - 8),
//         element i < 16 in the low nibble of byte i, element i + 16 in its high nibble.
// A row of a quantized tensor holds a whole number of blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace folio {

enum class DType : uint8_t { kF32, kF16, kBF16, kQ8_0, kQ4_0, kI32, kI8 };

struct DTypeInfo {
  std::string_view name;
  int64_t block_elements;  // elements per block (1 for plain types)
  int64_t block_bytes;     // bytes per block
  int ggml_type;           // the GGUF / ggml type id
  bool quantized;
};

constexpr DTypeInfo dtype_info(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return {"f32", 1, 4, 0, false};
    case DType::kF16:
      return {"f16", 1, 2, 1, false};
    case DType::kBF16:
      return {"bf16", 1, 2, 30, false};
    case DType::kQ8_0:
      return {"q8_0", 32, 34, 8, true};
    case DType::kQ4_0:
      return {"q4_0", 32, 18, 2, true};
    case DType::kI32:
      return {"i32", 1, 4, 26, false};
    case DType::kI8:
      return {"i8", 1, 1, 24, false};
  }
  return {"invalid", 1, 0, -1, false};
}

constexpr std::string_view dtype_name(DType dtype) {
  return dtype_info(dtype).name;
}

// Bytes of a row of `elements` values. Requires: elements is a multiple of the block size.
constexpr int64_t row_bytes(DType dtype, int64_t elements) {
  const DTypeInfo info = dtype_info(dtype);
  return elements / info.block_elements * info.block_bytes;
}

constexpr std::optional<DType> dtype_from_ggml_type(int ggml_type) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                      DType::kI32, DType::kI8}) {
    if (dtype_info(dtype).ggml_type == ggml_type) return dtype;
  }
  return std::nullopt;
}

std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace folio
