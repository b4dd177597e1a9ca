#include "folio/tensor/dtype.h"

#include <algorithm>
#include <cctype>

namespace folio {

std::optional<DType> dtype_from_name(std::string_view name) {
  auto same_letters = [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) ==
           std::tolower(static_cast<unsigned char>(b));
  };
  for (DType dtype : kAllDTypes) {
    const std::string_view candidate = dtype_info(dtype).name;
    if (std::ranges::equal(candidate, name, same_letters)) return dtype;
  }
  return std::nullopt;
}

}  // namespace folio
