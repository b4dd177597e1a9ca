// Graph checks and execution orders.
//
// verify() is the contract between whoever emits a graph and every pass and executor after it:
//   - SSA: every activation and output is produced by exactly one op; weights, inputs and KV
//     caches are never produced; only KV caches are updated in place, and only through `updates`;
//   - typing: every op satisfies its signature and its outputs have the inferred dtype and shape;
//   - order: in program order (the op list) every op's inputs are produced before it runs, which
//     also rules out cycles.
//
// An execution order may differ from the program order (a future pass may reorder ops); it is
// valid when it respects data dependencies (producer before consumer) and keeps every access to
// a piece of external state (a KV cache) in program order relative to the writes to it (a read
// sees the writes before it in program order and none after). topological_order() computes
// such an order for a graph whose list is not in dependency order, and reports cycles.
#pragma once

#include <span>
#include <vector>

#include "folio/base/result.h"
#include "folio/ir/graph.h"

namespace folio::ir {

// OK when `graph` satisfies every rule above; otherwise the first violation found, naming the op
// and tensor involved.
Status verify(const Graph& graph);

// OK when `order` lists every op of `graph` exactly once, every input an op reads is produced
// earlier in `order` (or is external), and KV-cache accesses keep their program order relative to
// writes. Requires: the graph's SSA rules hold (each tensor has at most one producer).
Status verify_order(const Graph& graph, std::span<const OpId> order);

// The ops in list order: 0, 1, ..., num_ops - 1.
std::vector<OpId> program_order(const Graph& graph);

// A dependency order of the ops (data and KV-cache state dependencies), the earliest-listed
// ready op first, so a graph whose list is already a valid order gets it back unchanged. Fails
// when the dependencies form a cycle (naming the ops on it or waiting on it) or a tensor has
// more than one producer.
Result<std::vector<OpId>> topological_order(const Graph& graph);

}  // namespace folio::ir
