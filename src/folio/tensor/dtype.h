// DType: the element types Folio stores tensors in. Quantized types are stored in ggml's block
// layouts, so GGUF weights are used in place (mmap) without conversion:
//   q8_0: blocks of 32 values: f16 scale d, then 32 int8 q;            value = d * q
//   q4_0: blocks of 32 values: f16 scale d, then 16 bytes of nibbles;  value = d * (nibble - 8),
//         element i < 16 in the low nibble of byte i, element i + 16 in its high nibble.
// and the other block types of ggml that model files use: q4_1, q5_0, q5_1 (32-value blocks),
// the k-quants q2_K..q6_K (256-value super-blocks of 16- or 32-value sub-blocks), iq4_nl and
// iq4_xs (4-bit indices into a fixed non-linear table). quant_blocks.h has every layout.
// A row of a quantized tensor holds a whole number of blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace folio {

// New dtypes are appended: a dtype's number is part of cache keys and hashes.
enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kI32,
  kI8,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kIQ4_NL,
  kIQ4_XS,
  // Not a file format: q8_0 weights repacked in memory for the AVX-512 matmul (16 rows
  // interleaved per panel, kernels/cpu/q8_0_panels.h). Never in a GGUF file (no ggml type), nor
  // in kAllDTypes; a graph's weight tensor takes it when its weight source holds packed data.
  kQ8_0Panels,
};

// Every dtype a file can hold, in enum order (all but the in-memory kQ8_0Panels).
inline constexpr DType kAllDTypes[] = {
    DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,   DType::kQ4_0,   DType::kI32,
    DType::kI8,   DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,   DType::kQ2_K,   DType::kQ3_K,
    DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kIQ4_NL, DType::kIQ4_XS,
};

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
    case DType::kQ4_1:
      return {"q4_1", 32, 20, 3, true};
    case DType::kQ5_0:
      return {"q5_0", 32, 22, 6, true};
    case DType::kQ5_1:
      return {"q5_1", 32, 24, 7, true};
    case DType::kQ2_K:
      return {"q2_K", 256, 84, 10, true};
    case DType::kQ3_K:
      return {"q3_K", 256, 110, 11, true};
    case DType::kQ4_K:
      return {"q4_K", 256, 144, 12, true};
    case DType::kQ5_K:
      return {"q5_K", 256, 176, 13, true};
    case DType::kQ6_K:
      return {"q6_K", 256, 210, 14, true};
    case DType::kIQ4_NL:
      return {"iq4_nl", 32, 18, 20, true};
    case DType::kIQ4_XS:
      return {"iq4_xs", 256, 136, 23, true};
    case DType::kQ8_0Panels:
      // A row's bytes as q8_0's: a panel of 16 rows holds exactly 16 q8_0 rows' bytes.
      return {"q8_0_panels", 32, 34, -1, true};
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
  for (DType dtype : kAllDTypes) {
    if (dtype_info(dtype).ggml_type == ggml_type) return dtype;
  }
  return std::nullopt;
}

// By name, ignoring case: "q4_K", "q4_k" and "Q4_K" all name q4_K.
std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace folio
