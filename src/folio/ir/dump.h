// Readable text of a graph and of the results of its passes, for debugging and for
// `folio inspect`. One line per tensor, op, arena slot or segment; tensors appear as
// `%<id> <name>`, ops as `#<id>`. The format is for people, not for parsing.
#pragma once

#include <string>

#include "folio/ir/buffer_plan.h"
#include "folio/ir/graph.h"
#include "folio/ir/split.h"

namespace folio::ir {

// Tensors, ops (operands, attributes, annotations) and the cost totals by op kind.
std::string dump_graph(const Graph& graph);

// The arena size with and without reuse, then each activation's slot and lifetime.
std::string dump_buffer_plan(const Graph& graph, const BufferPlan& plan);

// Each segment: kind, positions, op count and the activations crossing its boundaries.
std::string dump_split(const Graph& graph, const PiecewiseSplit& split);

}  // namespace folio::ir
