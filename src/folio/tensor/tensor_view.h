// TensorView: a non-owning, row-major view of a tensor: a data pointer, a dtype and a shape of
// up to four dimensions. The last dimension is the *row*: its values are contiguous, and for a
// block-quantized dtype it holds a whole number of blocks, so a row is the unit every kernel
// addresses (row_bytes bytes each, rows back to back). Views are what model/ hands to exec/
// and kernels/ for weights (GGUF tensors mmapped in place) and activations.
//
// A view is a value type: it never frees its data and cannot tell whether the data is alive.
// Invariants, established by make() and kept because the fields are private: 1 <= rank <= 4, every
// dimension >= 0, and the row length is a multiple of the dtype's block size.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "folio/base/result.h"
#include "folio/tensor/dtype.h"

namespace folio {

class TensorView {
 public:
  static constexpr int kMaxRank = 4;

  TensorView() = default;

  // Fails (kInvalidArgument) when the rank is not in [1, 4], a dimension is negative, or the
  // last dimension is not a whole number of the dtype's blocks.
  static Result<TensorView> make(void* data, DType dtype, std::span<const int64_t> shape);
  static Result<TensorView> make(void* data, DType dtype, std::initializer_list<int64_t> shape) {
    return make(data, dtype, std::span<const int64_t>(shape.begin(), shape.size()));
  }

  std::byte* data() const { return data_; }
  DType dtype() const { return dtype_; }
  int rank() const { return rank_; }
  // Requires: 0 <= axis < rank().
  int64_t dim(int axis) const;
  std::span<const int64_t> shape() const { return {shape_.data(), static_cast<size_t>(rank_)}; }

  int64_t num_elements() const;
  // Values per row (the last dimension) and rows (the product of the others).
  int64_t row_elements() const { return shape_[rank_ - 1]; }
  int64_t num_rows() const;
  int64_t row_bytes() const { return folio::row_bytes(dtype_, row_elements()); }
  int64_t size_bytes() const { return num_rows() * row_bytes(); }

  // Requires: 0 <= row < num_rows().
  std::byte* row(int64_t row) const;

  // "q8_0 [32000, 768]"
  std::string to_string() const;

 private:
  std::byte* data_ = nullptr;
  DType dtype_ = DType::kF32;
  int rank_ = 1;
  std::array<int64_t, kMaxRank> shape_ = {0, 0, 0, 0};
};

}  // namespace folio
