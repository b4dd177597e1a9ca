#include "folio/ir/split.h"

#include <algorithm>

#include "folio/base/check.h"

namespace folio::ir {
namespace {

void start_segment(PiecewiseSplit& split, SegmentKind kind, int32_t position) {
  Segment segment;
  segment.kind = kind;
  segment.begin = position;
  segment.end = position;
  split.segments.push_back(std::move(segment));
  ++(kind == SegmentKind::kPiece ? split.num_pieces : split.num_eager);
}

void sort_unique(std::vector<TensorId>& ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
}

// Fills live_in / live_out / live_through of every segment from the activations' producing
// segment and the segments that read them.
void find_crossings(const Graph& graph, std::span<const OpId> order, PiecewiseSplit& split) {
  const auto num_tensors = static_cast<size_t>(graph.num_tensors());
  std::vector<int32_t> producer_segment(num_tensors, -1);
  std::vector<int32_t> last_segment(num_tensors, -1);
  for (size_t at = 0; at < order.size(); ++at) {
    const Op& op = graph.op(order[at]);
    const int32_t segment = split.segment_of_position[at];
    for (TensorId output : op.outputs)
      producer_segment[static_cast<size_t>(output.value())] = segment;
    for (TensorId input : op.inputs) {
      const auto index = static_cast<size_t>(input.value());
      if (!is_arena_planned(graph.tensor(input).residency)) continue;
      FOLIO_CHECK(producer_segment[index] >= 0, "'{}' read before it is produced",
                  graph.tensor(input).name);
      last_segment[index] = std::max(last_segment[index], segment);
      if (producer_segment[index] != segment) {
        split.segments[static_cast<size_t>(segment)].live_in.push_back(input);
        split.segments[static_cast<size_t>(producer_segment[index])].live_out.push_back(input);
      }
    }
  }
  for (size_t index = 0; index < num_tensors; ++index) {
    for (int32_t segment = producer_segment[index] + 1; segment < last_segment[index]; ++segment) {
      split.segments[static_cast<size_t>(segment)].live_through.emplace_back(
          static_cast<int32_t>(index));
    }
  }
  for (Segment& segment : split.segments) {
    sort_unique(segment.live_in);
    sort_unique(segment.live_out);
    // A tensor read here is live_in, not live_through.
    std::vector<TensorId> through;
    std::set_difference(segment.live_through.begin(), segment.live_through.end(),
                        segment.live_in.begin(), segment.live_in.end(),
                        std::back_inserter(through));
    segment.live_through = std::move(through);
  }
}

}  // namespace

std::string_view segment_kind_name(SegmentKind kind) {
  switch (kind) {
    case SegmentKind::kPiece:
      return "piece";
    case SegmentKind::kEager:
      return "eager";
  }
  return "invalid";
}

PiecewiseSplit split_graph(const Graph& graph, std::span<const OpId> order,
                           FunctionRef<bool(const Op&)> runs_eagerly) {
  FOLIO_CHECK(order.size() == static_cast<size_t>(graph.num_ops()),
              "order of {} ops for a graph of {}", order.size(), graph.num_ops());
  PiecewiseSplit split;
  split.segment_of_position.resize(order.size());
  start_segment(split, SegmentKind::kPiece, 0);
  for (size_t at = 0; at < order.size(); ++at) {
    const auto position = static_cast<int32_t>(at);
    const bool eager = runs_eagerly(graph.op(order[at]));
    if (eager) start_segment(split, SegmentKind::kEager, position);
    Segment& current = split.segments.back();
    current.ops.push_back(order[at]);
    current.end = position + 1;
    split.segment_of_position[at] = static_cast<int32_t>(split.segments.size() - 1);
    if (eager) start_segment(split, SegmentKind::kPiece, position + 1);
  }
  find_crossings(graph, order, split);
  return split;
}

PiecewiseSplit split_at_attention(const Graph& graph, std::span<const OpId> order) {
  return split_graph(graph, order, [](const Op& op) { return is_attention(op.kind); });
}

std::vector<TensorLifetime> pin_across_segments(std::span<const TensorLifetime> lifetimes,
                                                const PiecewiseSplit& split) {
  std::vector<TensorLifetime> pinned(lifetimes.begin(), lifetimes.end());
  const auto num_positions = static_cast<int32_t>(split.segment_of_position.size());
  for (TensorLifetime& lifetime : pinned) {
    FOLIO_CHECK(lifetime.first >= 0 && lifetime.last < num_positions,
                "lifetime [{}, {}] outside the {} positions of the split", lifetime.first,
                lifetime.last, num_positions);
    const int32_t producer = split.segment_of_position[static_cast<size_t>(lifetime.first)];
    const int32_t consumer = split.segment_of_position[static_cast<size_t>(lifetime.last)];
    if (producer == consumer) continue;
    lifetime.first = split.segments[static_cast<size_t>(producer)].begin;
    lifetime.last = split.segments[static_cast<size_t>(consumer)].end - 1;
  }
  return pinned;
}

}  // namespace folio::ir
