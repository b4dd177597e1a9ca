#include "folio/ir/step_graph.h"

#include <fmt/format.h>

namespace folio::ir {

Phase StepShape::ir_phase() const {
  switch (phase) {
    case StepPhase::kDecode:
      return Phase::kDecode;
    case StepPhase::kPrefill:
      return Phase::kMixed;
  }
  return Phase::kMixed;
}

Result<std::byte*> bind_weight(const TensorInfo& tensor, const WeightSource& weights) {
  Result<TensorView> view = weights.find_weight(tensor.name);
  if (!view.ok())
    return view.status().with_context(fmt::format("binding weight '{}'", tensor.name));
  bool same_shape = view->rank() == tensor.shape.rank;
  for (int axis = 0; same_shape && axis < tensor.shape.rank; ++axis) {
    same_shape = view->dim(axis) == tensor.shape[axis];
  }
  if (view->dtype() != tensor.dtype || !same_shape) {
    return invalid_argument("weight '{}' is {} in the model but the graph expects {} {}",
                            tensor.name, view->to_string(), dtype_name(tensor.dtype),
                            tensor.shape.to_string());
  }
  if (view->data() == nullptr) return invalid_argument("weight '{}' has no data", tensor.name);
  return view->data();
}

}  // namespace folio::ir
