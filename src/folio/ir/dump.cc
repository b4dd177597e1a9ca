#include "folio/ir/dump.h"

#include <span>
#include <type_traits>
#include <variant>

#include <fmt/format.h>

#include "folio/ir/cost.h"

namespace folio::ir {
namespace {

std::string tensor_list(const Graph& graph, std::span<const TensorId> ids) {
  std::string text;
  for (TensorId id : ids) {
    if (!text.empty()) text += ", ";
    text += fmt::format("%{} {}", id.value(), graph.tensor(id).name);
  }
  return text;
}

std::string_view rope_style_name(kernels::RopeStyle style) {
  switch (style) {
    case kernels::RopeStyle::kNormal:
      return "normal";
    case kernels::RopeStyle::kNeox:
      return "neox";
  }
  return "invalid";
}

std::string_view rope_scaling_name(RopeScalingKind kind) {
  switch (kind) {
    case RopeScalingKind::kNone:
      return "none";
    case RopeScalingKind::kLinear:
      return "linear";
    case RopeScalingKind::kLlama3:
      return "llama3";
    case RopeScalingKind::kYarn:
      return "yarn";
  }
  return "invalid";
}

std::string attributes_text(const OpAttributes& attributes) {
  return std::visit(
      [](const auto& value) -> std::string {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, NoAttributes>) {
          return "";
        } else if constexpr (std::is_same_v<T, EmbeddingAttributes>) {
          return fmt::format(" {{output_dtype={}}}", dtype_name(value.output_dtype));
        } else if constexpr (std::is_same_v<T, RmsNormAttributes>) {
          return fmt::format(" {{epsilon={:g}}}", value.epsilon);
        } else if constexpr (std::is_same_v<T, RopeAttributes>) {
          return fmt::format(
              " {{heads={} head_dim={} rotary_dim={} theta={:g} style={} "
              "scaling={} factor={:g}}}",
              value.num_heads, value.head_dim, value.rotary_dim, value.theta,
              rope_style_name(value.style), rope_scaling_name(value.scaling.kind),
              value.scaling.factor);
        } else if constexpr (std::is_same_v<T, LoraAttributes>) {
          return fmt::format(" {{target={}}}", value.target);
        } else if constexpr (std::is_same_v<T, ScaleAttributes>) {
          return fmt::format(" {{factor={:g}}}", value.factor);
        } else if constexpr (std::is_same_v<T, SoftCapAttributes>) {
          return fmt::format(" {{cap={:g}}}", value.cap);
        } else {
          static_assert(std::is_same_v<T, AttentionAttributes>);
          const std::string window =
              value.sliding_window > 0 ? fmt::format(" window={}", value.sliding_window) : "";
          const std::string cap =
              value.logit_soft_cap > 0 ? fmt::format(" soft_cap={:g}", value.logit_soft_cap) : "";
          const std::string range =
              value.is_kv_parallel()
                  ? fmt::format(" kv_range=[{}, {})", value.kv_range_begin, value.kv_range_end)
                  : "";
          return fmt::format(" {{heads={} kv_heads={} head_dim={} scale={:g}{}{}{}}}",
                             value.num_heads, value.num_kv_heads, value.head_dim, value.scale,
                             window, cap, range);
        }
      },
      attributes);
}

std::string cost_text(const CostHints& cost) {
  return fmt::format("flops={} read={} written={}", cost.flops, cost.bytes_read,
                     cost.bytes_written);
}

}  // namespace

std::string dump_graph(const Graph& graph) {
  std::string text = fmt::format("graph phase={} tensors={} ops={}\ntensors:\n",
                                 phase_name(graph.phase()), graph.num_tensors(), graph.num_ops());
  for (const TensorInfo& tensor : graph.tensors()) {
    text += fmt::format("  %{} {} {} {} {} ({} bytes)\n", tensor.id.value(), tensor.name,
                        dtype_name(tensor.dtype), tensor.shape.to_string(),
                        residency_name(tensor.residency), tensor.bytes());
  }
  text += "ops:\n";
  for (const Op& op : graph.ops()) {
    text += fmt::format("  #{} {} '{}'", op.id.value(), op_kind_name(op.kind), op.name);
    if (op.layer >= 0) text += fmt::format(" layer={}", op.layer);
    text +=
        fmt::format(" ({}) -> ({})", tensor_list(graph, op.inputs), tensor_list(graph, op.outputs));
    if (!op.updates.empty()) text += fmt::format(" updates ({})", tensor_list(graph, op.updates));
    text += attributes_text(op.attributes);
    text += fmt::format(" [{} {}] {}\n", phase_name(op.annotations.phase),
                        modality_name(op.annotations.modality), cost_text(op.annotations.cost));
  }
  const CostTotals totals = total_cost(graph);
  text += fmt::format("total: {} intensity={:.2f} flops/byte\n", cost_text(totals.total),
                      totals.total.arithmetic_intensity());
  for (int kind = 0; kind < kNumOpKinds; ++kind) {
    const auto op_kind = static_cast<OpKind>(kind);
    if (totals.num_ops(op_kind) == 0) continue;
    text += fmt::format("  {} x{}: {}\n", op_kind_name(op_kind), totals.num_ops(op_kind),
                        cost_text(totals.of(op_kind)));
  }
  return text;
}

std::string dump_buffer_plan(const Graph& graph, const BufferPlan& plan) {
  std::string text = fmt::format(
      "arena: peak {} bytes, {} without reuse, alignment {}, {} activations\n", plan.peak_bytes,
      plan.total_bytes_without_reuse, plan.alignment, plan.assignments.size());
  for (const BufferAssignment& slot : plan.assignments) {
    text +=
        fmt::format("  %{} {} offset={} size={} live=[{}, {}]\n", slot.tensor.value(),
                    graph.tensor(slot.tensor).name, slot.offset, slot.size, slot.first, slot.last);
  }
  return text;
}

std::string dump_split(const Graph& graph, const PiecewiseSplit& split) {
  std::string text = fmt::format("split: {} pieces, {} eager\n", split.num_pieces, split.num_eager);
  for (size_t index = 0; index < split.segments.size(); ++index) {
    const Segment& segment = split.segments[index];
    text += fmt::format("  {} {} positions [{}, {}) ops={}", index, segment_kind_name(segment.kind),
                        segment.begin, segment.end, segment.ops.size());
    if (segment.kind == SegmentKind::kEager && !segment.ops.empty()) {
      text += fmt::format(" '{}'", graph.op(segment.ops.front()).name);
    }
    text +=
        fmt::format(" in=({}) out=({}) through=({})\n", tensor_list(graph, segment.live_in),
                    tensor_list(graph, segment.live_out), tensor_list(graph, segment.live_through));
  }
  return text;
}

}  // namespace folio::ir
