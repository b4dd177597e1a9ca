// Buffer planning: assigns every activation an offset in one arena so that two activations
// whose lifetimes overlap never share a byte, while activations that are never live at the
// same time reuse memory. The arena then needs `peak_bytes`, instead of the
// `total_bytes_without_reuse` that giving every activation its own buffer would take.
//
// Algorithm: greedy by size with best fit (the TFLite arena planner's strategy). Activations
// are placed largest first (ties: earlier first use, then lower id); each goes into the
// smallest gap between the already-placed activations whose lifetimes overlap its own that can
// hold it, or above all of them when no gap can. Every offset and every size is a multiple of
// the alignment.
//
// Invariants of a plan (tests check them on randomized graphs):
//   - lifetimes overlap  =>  [offset, offset + size) ranges are disjoint;
//   - offset % alignment == 0, size == bytes rounded up to the alignment;
//   - peak_bytes == max(offset + size) <= total_bytes_without_reuse == sum(size).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "folio/base/result.h"
#include "folio/ir/graph.h"
#include "folio/ir/lifetime.h"

namespace folio::ir {

struct BufferPlanOptions {
  int64_t alignment = 64;  // a power of two; every offset and size is a multiple of it
};

struct BufferAssignment {
  TensorId tensor;
  int64_t offset = 0;
  int64_t size = 0;  // bytes reserved: the tensor's bytes rounded up to the alignment
  int32_t first = 0;
  int32_t last = 0;
};

struct BufferPlan {
  int64_t alignment = 0;
  int64_t peak_bytes = 0;                     // arena bytes needed
  int64_t total_bytes_without_reuse = 0;      // sum of every assignment's size
  std::vector<BufferAssignment> assignments;  // in the order of the lifetimes planned
  // Index into `assignments` by tensor id value, -1 for tensors not planned.
  std::vector<int32_t> assignment_index_by_tensor;

  // The assignment of `tensor`, or nullptr if it was not planned.
  const BufferAssignment* find(TensorId tensor) const;
};

// Plans `lifetimes` (usually analyze_lifetimes(), possibly widened by
// pin_across_segments(), split.h). Fails on a bad alignment, an inverted interval, a negative
// size or a tensor listed twice.
Result<BufferPlan> plan_buffers(std::span<const TensorLifetime> lifetimes,
                                const BufferPlanOptions& options = {});

}  // namespace folio::ir
