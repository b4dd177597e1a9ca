// Lifetime analysis: for every activation (the tensors planned into the step's arena), the
// interval of positions in an execution order during which its bytes must stay untouched:
// from the position of the op that produces it to the position of its last consumer, both
// inclusive. An activation nobody reads still lives at its producer's position (the op writes
// it). Because intervals are inclusive, an op's outputs never share memory with its inputs:
// kernels may assume no aliasing.
//
// Weights, inputs, KV caches and outputs live outside the arena and get no lifetime here.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "folio/ir/graph.h"

namespace folio::ir {

struct TensorLifetime {
  TensorId tensor;
  int32_t first = 0;  // position (in the execution order) of the producing op
  int32_t last = 0;   // position of the last consumer; >= first
  int64_t bytes = 0;

  bool overlaps(const TensorLifetime& other) const {
    return first <= other.last && other.first <= last;
  }
};

// Lifetimes of every activation of `graph`, in increasing tensor id.
// Requires: verify_order(graph, order).ok().
std::vector<TensorLifetime> analyze_lifetimes(const Graph& graph, std::span<const OpId> order);

}  // namespace folio::ir
