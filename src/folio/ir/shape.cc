#include "folio/ir/shape.h"

#include <limits>

#include "folio/base/check.h"

namespace folio::ir {

Shape::Shape(std::initializer_list<int64_t> dims_list) {
  FOLIO_CHECK(dims_list.size() >= 1 && dims_list.size() <= static_cast<size_t>(kMaxRank),
              "shape of rank {} (Folio tensors have rank 1 to {})", dims_list.size(), kMaxRank);
  rank = static_cast<int>(dims_list.size());
  size_t index = 0;
  for (int64_t dim : dims_list) dims[index++] = dim;
}

int64_t Shape::num_elements() const {
  int64_t count = 1;
  for (int index = 0; index < rank; ++index) count *= (*this)[index];
  return count;
}

std::string Shape::to_string() const {
  std::string text = "[";
  for (int index = 0; index < rank; ++index) {
    if (index > 0) text += ", ";
    text += std::to_string((*this)[index]);
  }
  return text + "]";
}

bool operator==(const Shape& a, const Shape& b) {
  if (a.rank != b.rank) return false;
  for (int index = 0; index < a.rank; ++index) {
    if (a[index] != b[index]) return false;
  }
  return true;
}

Status validate_shape(const Shape& shape) {
  if (shape.rank < 1 || shape.rank > kMaxRank) {
    return invalid_argument("shape has rank {}; tensors have rank 1 to {}", shape.rank, kMaxRank);
  }
  // Bound the element count so byte sizes (elements * at most 4 bytes) never overflow int64.
  constexpr int64_t kMaxElements = int64_t{1} << 52;
  int64_t count = 1;
  for (int index = 0; index < shape.rank; ++index) {
    if (shape[index] <= 0) {
      return invalid_argument("shape {} has a non-positive dimension {}", shape.to_string(), index);
    }
    if (shape[index] > kMaxElements / count) {
      return invalid_argument("shape {} has more than 2^52 elements", shape.to_string());
    }
    count *= shape[index];
  }
  return Status();
}

Status validate_storage(DType dtype, const Shape& shape) {
  FOLIO_RETURN_IF_ERROR(validate_shape(shape));
  const DTypeInfo info = dtype_info(dtype);
  if (shape.last() % info.block_elements != 0) {
    return invalid_argument("a {} tensor needs its last dimension to be a multiple of {}, not {}",
                            info.name, info.block_elements, shape.last());
  }
  return Status();
}

int64_t storage_bytes(DType dtype, const Shape& shape) {
  FOLIO_DCHECK(validate_storage(dtype, shape).ok());
  const int64_t rows = shape.num_elements() / shape.last();
  return rows * row_bytes(dtype, shape.last());
}

}  // namespace folio::ir
