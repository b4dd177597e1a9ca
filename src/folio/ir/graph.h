// Graph: the semantic graph of one forward step (seed 002 §2): tensors (values with a name,
// dtype, shape and residency) and ops over them, plus the phase the step was emitted for. It is
// plain data: it executes nothing and owns no tensor memory.
//
// The op list is the program order: executing ops in list order is always valid for a graph
// that passes verify() (verify.h). The graph is in SSA form: every activation and output is
// produced by exactly one op; weights, inputs and KV caches are external and never produced;
// the only values written in place are KV caches, through an op's `updates`.
//
// Graph itself checks only what keeps it indexable (ids in range, names unique, shapes valid);
// op semantics are checked by GraphBuilder when ops are emitted and by verify() afterwards.
//
// Thread-safety: none; a finished graph is immutable by convention and may be read from any
// number of threads.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "folio/base/result.h"
#include "folio/ir/annotations.h"
#include "folio/ir/op.h"
#include "folio/ir/shape.h"
#include "folio/tensor/dtype.h"

namespace folio::ir {

struct TensorInfo {
  TensorId id;
  std::string name;  // unique in the graph; weights are bound to memory by this name
  DType dtype = DType::kF32;
  Shape shape;
  Residency residency = Residency::kActivation;

  int64_t bytes() const { return storage_bytes(dtype, shape); }
};

class Graph {
 public:
  explicit Graph(Phase phase = Phase::kPrefill) : phase_(phase) {}

  Phase phase() const { return phase_; }

  // Adds a tensor. Fails, changing nothing, on a duplicate name or a shape the dtype cannot
  // store.
  Result<TensorId> add_tensor(std::string name, DType dtype, Shape shape, Residency residency);

  // Appends `op` at the end of the program order and returns its id (written into op.id).
  // Fails, changing nothing, if a referenced tensor id does not exist.
  Result<OpId> add_op(Op op);

  // Changes the residency of a tensor (e.g. an activation that is the step's result becomes an
  // output). Fails, changing nothing, if `id` does not exist.
  Status set_residency(TensorId id, Residency residency);

  int32_t num_tensors() const { return static_cast<int32_t>(tensors_.size()); }
  int32_t num_ops() const { return static_cast<int32_t>(ops_.size()); }
  bool contains(TensorId id) const { return id.is_valid() && id.value() < num_tensors(); }
  bool contains(OpId id) const { return id.is_valid() && id.value() < num_ops(); }

  // Requires: contains(id).
  const TensorInfo& tensor(TensorId id) const;
  const Op& op(OpId id) const;
  std::span<const TensorInfo> tensors() const { return tensors_; }
  std::span<const Op> ops() const { return ops_; }

  std::optional<TensorId> find_tensor(std::string_view name) const;

 private:
  Phase phase_;
  std::vector<TensorInfo> tensors_;  // indexed by TensorId
  std::vector<Op> ops_;              // indexed by OpId; the program order
  std::unordered_map<std::string, TensorId> tensor_by_name_;
};

}  // namespace folio::ir
