// Shape: the dimensions of an IR tensor, rank 1 to 4, each a positive int64, outermost first
// (row-major: the last dimension is contiguous). A shape with a non-positive dimension can be
// written down but is not valid; `validate_shape` says why, and every graph entry point
// (Graph::add_tensor, GraphBuilder) refuses it.
//
// Bytes of a tensor follow the dtype's block layout (tensor/dtype.h): for a quantized dtype the
// last dimension is a whole number of blocks, so a row is `row_bytes(dtype, last)` bytes.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "folio/base/status.h"
#include "folio/tensor/dtype.h"

namespace folio::ir {

inline constexpr int kMaxRank = 4;

struct Shape {
  Shape() = default;
  // Requires: 1 <= dims.size() <= kMaxRank (a programming error otherwise, not an input error).
  Shape(std::initializer_list<int64_t> dims);

  int rank = 0;
  std::array<int64_t, kMaxRank> dims{};

  int64_t operator[](int index) const { return dims[static_cast<size_t>(index)]; }
  // The last dimension (the contiguous one). Requires: rank >= 1.
  int64_t last() const { return dims[static_cast<size_t>(rank - 1)]; }
  int64_t num_elements() const;
  // "[16, 4096]"
  std::string to_string() const;

  friend bool operator==(const Shape& a, const Shape& b);
};

// OK when 1 <= rank <= 4 and every dimension is positive.
Status validate_shape(const Shape& shape);

// OK when `shape` is valid and can be stored as `dtype`: a quantized dtype needs the last
// dimension to be a multiple of its block size.
Status validate_storage(DType dtype, const Shape& shape);

// Bytes of a tensor of `dtype` and `shape`. Requires: validate_storage(dtype, shape).ok().
int64_t storage_bytes(DType dtype, const Shape& shape);

}  // namespace folio::ir
