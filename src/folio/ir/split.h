// Piecewise split: cuts an execution order at its attention ops, for the executor's piecewise
// mode (seed 000 §3, seed 004 "Piecewise CUDA Graphs"). Attention's launch shape depends on how
// the step's tokens divide into sequences (batch size, per-sequence lengths), not only on the
// padded token count the graph is bucketed by, so a captured attention launch cannot be replayed
// for another step of the same bucket. Everything else depends only on the token count. The
// executor therefore captures the ops between attention ops as graph pieces and runs each
// attention eagerly between them, writing its output in place into the arena slot the next
// piece reads:
//
//   piece 0, attention 0, piece 1, attention 1, ..., attention N-1, piece N
//
// A graph with N attention ops always has N + 1 pieces (possibly empty, e.g. two attention ops
// in a row), and the segments cover every op of the order exactly once, in order.
//
// For each segment the split lists the activations crossing its boundaries: `live_in` (produced
// in an earlier segment, read here), `live_out` (produced here, read in a later segment) and
// `live_through` (produced earlier, read later, untouched here). These are the only arena values
// a captured piece shares with the outside.
//
// Planning. A plan of the plain lifetimes (lifetime.h) already keeps a crossing activation's
// slot to itself from its producer to its last consumer, boundaries included, which is all a
// piecewise program that runs segments and the ops inside them in the execution order needs.
// pin_across_segments() is the stronger, opt-in isolation: it widens each crossing activation's
// lifetime to the whole segments it touches, so its slot is disjoint from every slot used
// anywhere in those segments. A piece's internal memory can then be managed on its own (re-
// planned, reordered, handed to a capture allocator) without ever aliasing the values it
// exchanges with eager attention. It costs arena bytes (1.43x the plain peak for a
// Llama-3-8B-shaped graph; see docs/design/ir.md).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "folio/base/function_ref.h"
#include "folio/ir/graph.h"
#include "folio/ir/lifetime.h"

namespace folio::ir {

enum class SegmentKind : uint8_t {
  kPiece,  // captured as a graph in piecewise mode
  kEager,  // one op run eagerly (attention)
};
std::string_view segment_kind_name(SegmentKind kind);

struct Segment {
  SegmentKind kind = SegmentKind::kPiece;
  int32_t begin = 0;  // positions [begin, end) of the execution order
  int32_t end = 0;
  std::vector<OpId> ops;
  // Activations crossing the segment's boundaries, each sorted by tensor id.
  std::vector<TensorId> live_in;
  std::vector<TensorId> live_out;
  std::vector<TensorId> live_through;

  bool empty() const { return begin == end; }
};

struct PiecewiseSplit {
  std::vector<Segment> segments;  // alternating: piece, eager, piece, ..., piece
  int32_t num_pieces = 0;
  int32_t num_eager = 0;

  // Segment index of each position of the execution order.
  std::vector<int32_t> segment_of_position;
};

// Splits `order` before and after every op for which `runs_eagerly` is true.
// Requires: verify_order(graph, order).ok().
PiecewiseSplit split_graph(const Graph& graph, std::span<const OpId> order,
                           FunctionRef<bool(const Op&)> runs_eagerly);

// split_graph with the attention ops (is_attention(kind)) run eagerly.
PiecewiseSplit split_at_attention(const Graph& graph, std::span<const OpId> order);

// Returns `lifetimes` with every activation that crosses a segment boundary widened to span all
// of the segments from the one producing it to the one holding its last consumer (opt-in; see
// "Planning" above). Lifetimes not
// crossing a boundary are unchanged. Requires: `split` was computed from the same graph and
// order as `lifetimes`.
std::vector<TensorLifetime> pin_across_segments(std::span<const TensorLifetime> lifetimes,
                                                const PiecewiseSplit& split);

}  // namespace folio::ir
