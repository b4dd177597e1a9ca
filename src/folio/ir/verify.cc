#include "folio/ir/verify.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <string>

#include "folio/ir/op_signature.h"

namespace folio::ir {
namespace {

// Producer of each tensor (invalid for none). Fails on a tensor produced twice.
Result<std::vector<OpId>> find_producers(const Graph& graph) {
  std::vector<OpId> producers(static_cast<size_t>(graph.num_tensors()));
  for (const Op& op : graph.ops()) {
    for (TensorId output : op.outputs) {
      OpId& producer = producers[static_cast<size_t>(output.value())];
      if (producer.is_valid()) {
        return invalid_argument("tensor '{}' is produced twice: by op '{}' and by op '{}'",
                                graph.tensor(output).name, graph.op(producer).name, op.name);
      }
      producer = op.id;
    }
  }
  return producers;
}

Status check_residencies(const Graph& graph, const std::vector<OpId>& producers) {
  for (const Op& op : graph.ops()) {
    for (TensorId output : op.outputs) {
      const TensorInfo& tensor = graph.tensor(output);
      if (is_external(tensor.residency)) {
        return invalid_argument(
            "op '{}' produces '{}', a {} tensor; external tensors are bound, "
            "never produced",
            op.name, tensor.name, residency_name(tensor.residency));
      }
    }
    for (TensorId update : op.updates) {
      const TensorInfo& tensor = graph.tensor(update);
      if (tensor.residency != Residency::kKvCache) {
        return invalid_argument(
            "op '{}' updates '{}' in place, a {} tensor; only KV caches are "
            "updated in place",
            op.name, tensor.name, residency_name(tensor.residency));
      }
    }
  }
  for (const TensorInfo& tensor : graph.tensors()) {
    if (!is_external(tensor.residency) &&
        !producers[static_cast<size_t>(tensor.id.value())].is_valid()) {
      return invalid_argument("{} tensor '{}' is never produced by any op",
                              residency_name(tensor.residency), tensor.name);
    }
  }
  return Status();
}

Status check_signatures(const Graph& graph) {
  for (const Op& op : graph.ops()) {
    FOLIO_ASSIGN_OR_RETURN(std::vector<OutputSpec> specs, infer_outputs(graph, op));
    if (specs.size() != op.outputs.size()) {
      return invalid_argument("{} '{}' has {} outputs; expected {}", op_kind_name(op.kind), op.name,
                              op.outputs.size(), specs.size());
    }
    for (size_t index = 0; index < specs.size(); ++index) {
      const TensorInfo& output = graph.tensor(op.outputs[index]);
      if (output.dtype != specs[index].dtype || !(output.shape == specs[index].shape)) {
        return invalid_argument("{} '{}': output '{}' is {} {}; its inputs give {} {}",
                                op_kind_name(op.kind), op.name, output.name,
                                dtype_name(output.dtype), output.shape.to_string(),
                                dtype_name(specs[index].dtype), specs[index].shape.to_string());
      }
    }
  }
  return Status();
}

// Per KV-cache tensor, the ops touching it in program order, with whether each writes it.
struct StateAccess {
  OpId op;
  bool writes;
};
std::vector<std::vector<StateAccess>> state_accesses(const Graph& graph) {
  std::vector<std::vector<StateAccess>> accesses(static_cast<size_t>(graph.num_tensors()));
  for (const Op& op : graph.ops()) {
    // One access per op and tensor: an op that reads and updates a cache counts as a write.
    for (TensorId id : op.updates) {
      std::vector<StateAccess>& list = accesses[static_cast<size_t>(id.value())];
      if (list.empty() || list.back().op != op.id) list.push_back({op.id, true});
    }
    for (TensorId id : op.inputs) {
      std::vector<StateAccess>& list = accesses[static_cast<size_t>(id.value())];
      if (graph.tensor(id).residency == Residency::kKvCache &&
          (list.empty() || list.back().op != op.id)) {
        list.push_back({op.id, false});
      }
    }
  }
  return accesses;
}

Status check_state_order(const Graph& graph, const std::vector<int32_t>& position) {
  const std::vector<std::vector<StateAccess>> accesses = state_accesses(graph);
  for (size_t tensor = 0; tensor < accesses.size(); ++tensor) {
    int32_t last_write = -1;     // position of the latest write in program order so far
    int32_t latest_access = -1;  // latest position of any access since that write
    for (const StateAccess& access : accesses[tensor]) {
      const int32_t at = position[static_cast<size_t>(access.op.value())];
      const int32_t must_follow = access.writes ? latest_access : last_write;
      if (at <= must_follow) {
        return invalid_argument("op '{}' is ordered before an earlier {} of KV cache '{}'",
                                graph.op(access.op).name, access.writes ? "access" : "write",
                                graph.tensor(TensorId(static_cast<int32_t>(tensor))).name);
      }
      if (access.writes) {
        last_write = at;
        latest_access = at;
      } else {
        latest_access = std::max(latest_access, at);
      }
    }
  }
  return Status();
}

// Edges between ops: producer -> consumer, and the KV-cache state edges (a write waits for
// every access since the previous write; a read waits for the previous write).
struct DependencyGraph {
  std::vector<std::vector<int32_t>> successors;  // by op id
  std::vector<int32_t> num_waiting;              // unfinished predecessors, by op id

  void add_edge(OpId from, OpId to) {
    successors[static_cast<size_t>(from.value())].push_back(to.value());
    ++num_waiting[static_cast<size_t>(to.value())];
  }
};

DependencyGraph find_dependencies(const Graph& graph, const std::vector<OpId>& producers) {
  const auto num_ops = static_cast<size_t>(graph.num_ops());
  DependencyGraph dependencies{std::vector<std::vector<int32_t>>(num_ops),
                               std::vector<int32_t>(num_ops, 0)};
  for (const Op& op : graph.ops()) {
    for (TensorId input : op.inputs) {
      const OpId producer = producers[static_cast<size_t>(input.value())];
      if (producer.is_valid()) dependencies.add_edge(producer, op.id);
    }
  }
  for (const std::vector<StateAccess>& accesses : state_accesses(graph)) {
    OpId last_write;
    std::vector<OpId> since_write;
    for (const StateAccess& access : accesses) {
      if (access.writes) {
        for (OpId earlier : since_write) dependencies.add_edge(earlier, access.op);
        last_write = access.op;
        since_write = {access.op};
      } else {
        if (last_write.is_valid()) dependencies.add_edge(last_write, access.op);
        since_write.push_back(access.op);
      }
    }
  }
  return dependencies;
}

}  // namespace

std::vector<OpId> program_order(const Graph& graph) {
  std::vector<OpId> order;
  order.reserve(static_cast<size_t>(graph.num_ops()));
  for (int32_t index = 0; index < graph.num_ops(); ++index) order.emplace_back(index);
  return order;
}

Status verify_order(const Graph& graph, std::span<const OpId> order) {
  if (order.size() != static_cast<size_t>(graph.num_ops())) {
    return invalid_argument("the order lists {} ops; the graph has {}", order.size(),
                            graph.num_ops());
  }
  std::vector<int32_t> position(order.size(), -1);
  for (size_t at = 0; at < order.size(); ++at) {
    if (!graph.contains(order[at]) || position[static_cast<size_t>(order[at].value())] >= 0) {
      return invalid_argument("the order lists op {} twice or it does not exist",
                              order[at].value());
    }
    position[static_cast<size_t>(order[at].value())] = static_cast<int32_t>(at);
  }
  FOLIO_ASSIGN_OR_RETURN(std::vector<OpId> producers, find_producers(graph));
  for (size_t at = 0; at < order.size(); ++at) {
    const Op& op = graph.op(order[at]);
    for (TensorId input : op.inputs) {
      const TensorInfo& tensor = graph.tensor(input);
      if (is_external(tensor.residency)) continue;
      const OpId producer = producers[static_cast<size_t>(input.value())];
      if (!producer.is_valid() ||
          position[static_cast<size_t>(producer.value())] >= static_cast<int32_t>(at)) {
        return invalid_argument("op '{}' reads '{}' before it is produced", op.name, tensor.name);
      }
    }
  }
  return check_state_order(graph, position);
}

Status verify(const Graph& graph) {
  FOLIO_ASSIGN_OR_RETURN(std::vector<OpId> producers, find_producers(graph));
  FOLIO_RETURN_IF_ERROR(check_residencies(graph, producers));
  FOLIO_RETURN_IF_ERROR(check_signatures(graph));
  return verify_order(graph, program_order(graph));
}

Result<std::vector<OpId>> topological_order(const Graph& graph) {
  FOLIO_ASSIGN_OR_RETURN(std::vector<OpId> producers, find_producers(graph));
  const auto num_ops = static_cast<size_t>(graph.num_ops());
  DependencyGraph dependencies = find_dependencies(graph, producers);
  std::vector<int32_t>& num_waiting = dependencies.num_waiting;
  std::priority_queue<int32_t, std::vector<int32_t>, std::greater<>> ready;
  for (size_t index = 0; index < num_ops; ++index) {
    if (num_waiting[index] == 0) ready.push(static_cast<int32_t>(index));
  }
  std::vector<OpId> order;
  order.reserve(num_ops);
  while (!ready.empty()) {
    const int32_t next = ready.top();
    ready.pop();
    order.emplace_back(next);
    for (int32_t successor : dependencies.successors[static_cast<size_t>(next)]) {
      if (--num_waiting[static_cast<size_t>(successor)] == 0) ready.push(successor);
    }
  }
  if (order.size() == num_ops) return order;
  std::string blocked;
  for (size_t index = 0; index < num_ops && blocked.size() < 200; ++index) {
    if (num_waiting[index] > 0) {
      blocked += fmt::format(" '{}'", graph.op(OpId(static_cast<int32_t>(index))).name);
    }
  }
  return invalid_argument("the graph has a dependency cycle; {} ops never become ready:{}",
                          num_ops - order.size(), blocked);
}

}  // namespace folio::ir
