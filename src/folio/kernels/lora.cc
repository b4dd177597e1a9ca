#include "folio/kernels/lora.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "folio/tensor/half.h"

namespace folio::kernels {
namespace {

constexpr int64_t kInt8BlockValues = 32;

int64_t padded_columns(int64_t columns) {
  return (columns + kInt8BlockValues - 1) / kInt8BlockValues * kInt8BlockValues;
}

}  // namespace

std::string_view lora_weight_format_name(LoraWeightFormat format) {
  return format == LoraWeightFormat::kF16 ? "f16" : "int8";
}

void write_lora_matrix(LoraWeightFormat format, const float* values, int64_t rows, int64_t columns,
                       std::byte* destination) {
  if (format == LoraWeightFormat::kF16) {
    // memcpy: a matrix may start at any byte address (read_lora_value reads it the same way).
    for (int64_t i = 0; i < rows * columns; ++i) {
      const uint16_t bits = f32_to_f16(values[i]);
      std::memcpy(destination + i * 2, &bits, sizeof(bits));
    }
    return;
  }
  const int64_t padded = padded_columns(columns);
  const int64_t blocks = padded / kInt8BlockValues;
  auto* quantized = reinterpret_cast<int8_t*>(destination);
  auto* scales = reinterpret_cast<float*>(destination + rows * padded);
  for (int64_t row = 0; row < rows; ++row) {
    const float* input = values + row * columns;
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t begin = block * kInt8BlockValues;
      const int64_t end = std::min(columns, begin + kInt8BlockValues);
      float largest = 0.0f;
      for (int64_t column = begin; column < end; ++column) {
        largest = std::max(largest, std::fabs(input[column]));
      }
      const float scale = largest / 127.0f;
      const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
      int8_t* output = quantized + row * padded + begin;
      for (int64_t column = begin; column < begin + kInt8BlockValues; ++column) {
        const float value = column < end ? input[column] * inverse : 0.0f;
        output[column - begin] =
            static_cast<int8_t>(std::clamp(std::nearbyint(value), -127.0f, 127.0f));
      }
      std::memcpy(&scales[row * blocks + block], &scale, sizeof(float));
    }
  }
}

float read_lora_value(LoraWeightFormat format, const std::byte* matrix, int64_t rows,
                      int64_t columns, int64_t row, int64_t column) {
  if (format == LoraWeightFormat::kF16) {
    uint16_t bits = 0;
    std::memcpy(&bits, matrix + (row * columns + column) * 2, sizeof(bits));
    return f16_to_f32(bits);
  }
  const int64_t padded = padded_columns(columns);
  const auto* quantized = reinterpret_cast<const int8_t*>(matrix);
  float scale = 0.0f;
  std::memcpy(
      &scale,
      matrix + rows * padded + (row * (padded / kInt8BlockValues) + column / kInt8BlockValues) * 4,
      sizeof(float));
  return scale * static_cast<float>(quantized[row * padded + column]);
}

}  // namespace folio::kernels
