#include "folio/tensor/dtype.h"

namespace folio {

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                      DType::kI32, DType::kI8}) {
    if (dtype_info(dtype).name == name) return dtype;
  }
  return std::nullopt;
}

}  // namespace folio
