#include "folio/ir/graph.h"

#include <utility>

#include "folio/base/check.h"

namespace folio::ir {

Result<TensorId> Graph::add_tensor(std::string name, DType dtype, Shape shape,
                                   Residency residency) {
  if (name.empty()) return invalid_argument("tensor names must not be empty");
  if (tensor_by_name_.contains(name)) {
    return already_exists("the graph already has a tensor named '{}'", name);
  }
  if (Status status = validate_storage(dtype, shape); !status.ok()) {
    return status.with_context(fmt::format("tensor '{}'", name));
  }
  const TensorId id(num_tensors());
  tensor_by_name_.emplace(name, id);
  tensors_.push_back(TensorInfo{id, std::move(name), dtype, shape, residency});
  return id;
}

Result<OpId> Graph::add_op(Op op) {
  for (const std::vector<TensorId>* list : {&op.inputs, &op.outputs, &op.updates}) {
    for (TensorId tensor_id : *list) {
      if (!contains(tensor_id)) {
        return out_of_range("op '{}' refers to tensor {}, but the graph has {} tensors", op.name,
                            tensor_id.value(), num_tensors());
      }
    }
  }
  op.id = OpId(num_ops());
  ops_.push_back(std::move(op));
  return ops_.back().id;
}

Status Graph::set_residency(TensorId id, Residency residency) {
  if (!contains(id)) {
    return out_of_range("tensor {} does not exist; the graph has {}", id.value(), num_tensors());
  }
  tensors_[static_cast<size_t>(id.value())].residency = residency;
  return Status();
}

const TensorInfo& Graph::tensor(TensorId id) const {
  FOLIO_CHECK(contains(id), "tensor {} of {}", id.value(), num_tensors());
  return tensors_[static_cast<size_t>(id.value())];
}

const Op& Graph::op(OpId id) const {
  FOLIO_CHECK(contains(id), "op {} of {}", id.value(), num_ops());
  return ops_[static_cast<size_t>(id.value())];
}

std::optional<TensorId> Graph::find_tensor(std::string_view name) const {
  auto found = tensor_by_name_.find(std::string(name));
  if (found == tensor_by_name_.end()) return std::nullopt;
  return found->second;
}

}  // namespace folio::ir
