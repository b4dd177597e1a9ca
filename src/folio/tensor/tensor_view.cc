#include "folio/tensor/tensor_view.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "folio/base/check.h"

namespace folio {

Result<TensorView> TensorView::make(void* data, DType dtype, std::span<const int64_t> shape) {
  if (shape.empty() || shape.size() > kMaxRank) {
    return invalid_argument("tensor of rank {}: a view has 1 to {} dimensions", shape.size(),
                            kMaxRank);
  }
  for (size_t axis = 0; axis < shape.size(); ++axis) {
    if (shape[axis] < 0) {
      return invalid_argument("tensor dimension {} is {}: dimensions must not be negative", axis,
                              shape[axis]);
    }
  }
  const int64_t block_elements = dtype_info(dtype).block_elements;
  if (shape.back() % block_elements != 0) {
    return invalid_argument("{} rows of {} values: a row must hold whole {}-value blocks",
                            dtype_name(dtype), shape.back(), block_elements);
  }
  TensorView view;
  view.data_ = static_cast<std::byte*>(data);
  view.dtype_ = dtype;
  view.rank_ = static_cast<int>(shape.size());
  for (size_t axis = 0; axis < shape.size(); ++axis) view.shape_[axis] = shape[axis];
  return view;
}

int64_t TensorView::dim(int axis) const {
  FOLIO_DCHECK(axis >= 0 && axis < rank_, "axis {} of a rank-{} tensor", axis, rank_);
  return shape_[axis];
}

int64_t TensorView::num_rows() const {
  int64_t rows = 1;
  for (int axis = 0; axis + 1 < rank_; ++axis) rows *= shape_[axis];
  return rows;
}

int64_t TensorView::num_elements() const {
  return num_rows() * row_elements();
}

std::byte* TensorView::row(int64_t row) const {
  FOLIO_DCHECK(row >= 0 && row < num_rows(), "row {} of a tensor with {} rows", row, num_rows());
  return data_ + row * row_bytes();
}

std::string TensorView::to_string() const {
  return fmt::format("{} [{}]", dtype_name(dtype_), fmt::join(shape(), ", "));
}

}  // namespace folio
