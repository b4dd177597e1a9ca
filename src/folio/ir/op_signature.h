// Op signatures: the typing rules of every op kind (the table in op.h), written once and used
// twice: GraphBuilder infers the outputs of the op it is emitting from them, and verify()
// re-checks every op of a finished graph against them, so a graph assembled by hand or by a
// future pass is held to the same rules as one emitted through the builder.
#pragma once

#include <vector>

#include "folio/base/result.h"
#include "folio/ir/graph.h"
#include "folio/ir/op.h"
#include "folio/ir/shape.h"
#include "folio/tensor/dtype.h"

namespace folio::ir {

struct OutputSpec {
  DType dtype = DType::kF32;
  Shape shape;
  friend bool operator==(const OutputSpec&, const OutputSpec&) = default;
};

// True for the dtypes activations may have: f32, f16, bf16.
constexpr bool is_float(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

// Checks the operand counts, the residency, dtype and shape of every input and update, and the
// attributes of `op` (its `outputs` are ignored), and returns the dtype and shape of each output
// it must have. Requires: every id in op.inputs and op.updates exists in `graph`. The error
// message names the operand and what was expected, prefixed with the op's kind and name.
Result<std::vector<OutputSpec>> infer_outputs(const Graph& graph, const Op& op);

}  // namespace folio::ir
