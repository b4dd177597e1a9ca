#include "folio/exec/prepared_graph.h"

#include <cmath>

#include "folio/kernels/cpu/lora.h"
#include "folio/kernels/cpu/matmul.h"
#include "folio/kernels/cpu/rope.h"
#include "folio/tensor/quantize.h"

namespace folio::exec {
namespace {

int64_t aligned_workspace(int64_t bytes) {
  return static_cast<int64_t>(round_up(static_cast<size_t>(bytes), kBufferAlignment));
}

Status unsupported(const ir::Op& op, std::string_view why) {
  return invalid_argument("{} '{}': {}", ir::op_kind_name(op.kind), op.name, why);
}

}  // namespace

std::vector<ir::OpId> program_order(const ir::Graph& graph) {
  std::vector<ir::OpId> order;
  order.reserve(static_cast<size_t>(graph.num_ops()));
  for (int32_t id = 0; id < graph.num_ops(); ++id) order.push_back(ir::OpId(id));
  return order;
}

PreparedGraph::PreparedGraph(ir::Graph graph, const PrepareContext& context)
    : graph_(std::move(graph)),
      kv_cache_(context.kv_cache),
      adapters_(context.adapters),
      inputs_(context.inputs),
      num_threads_(context.num_threads),
      collectives_(context.collectives),
      collective_failures_(context.collective_failures) {}

Result<std::unique_ptr<PreparedGraph>> PreparedGraph::prepare(ir::Graph graph,
                                                              const PrepareContext& context) {
  if (context.num_threads < 1) {
    return invalid_argument("num_threads {} must be at least 1", context.num_threads);
  }
  std::unique_ptr<PreparedGraph> prepared(new PreparedGraph(std::move(graph), context));
  FOLIO_ASSIGN_OR_RETURN(prepared->kv_refs_, map_kv_caches(prepared->graph_, context.kv_cache));
  FOLIO_RETURN_IF_ERROR(prepared->bind_externals(context));
  prepared->ops_.resize(static_cast<size_t>(prepared->graph_.num_ops()));
  for (size_t index = 0; index < prepared->ops_.size(); ++index) {
    FOLIO_RETURN_IF_ERROR(prepared->prepare_op(index));
  }
  return prepared;
}

Status PreparedGraph::bind_externals(const PrepareContext& context) {
  external_addresses_.assign(static_cast<size_t>(graph_.num_tensors()), nullptr);
  for (const ir::TensorInfo& tensor : graph_.tensors()) {
    std::byte*& address = external_addresses_[static_cast<size_t>(tensor.id.value())];
    switch (tensor.residency) {
      case ir::Residency::kWeight: {
        FOLIO_ASSIGN_OR_RETURN(address, ir::bind_weight(tensor, context.weights));
        break;
      }
      case ir::Residency::kInput: {
        FOLIO_ASSIGN_OR_RETURN(address, context.inputs.bind(tensor));
        break;
      }
      case ir::Residency::kActivation:
      case ir::Residency::kOutput:
        if (tensor.dtype != DType::kF32) {
          return invalid_argument("{} '{}' is {}; the CPU kernels compute in f32",
                                  ir::residency_name(tensor.residency), tensor.name,
                                  dtype_name(tensor.dtype));
        }
        break;
      case ir::Residency::kKvCache:
        break;  // mapped by map_kv_caches
    }
  }
  return Status();
}

Status PreparedGraph::prepare_op(size_t index) {
  const ir::Op& op = graph_.ops()[index];
  PreparedOp& prepared = ops_[index];
  prepared.op = &op;
  prepared.profile_row = profile_row_of(graph_, op);
  auto input = [&](int position) -> const ir::TensorInfo& {
    return graph_.tensor(op.inputs[static_cast<size_t>(position)]);
  };
  switch (op.kind) {
    case ir::OpKind::kEmbedding: {
      const ir::TensorInfo& table = input(ir::embedding_input::kTable);
      if (!is_weight_dtype(table.dtype) && table.dtype != DType::kQ8_0Panels) {
        return unsupported(
            op, fmt::format("table dtype {} has no CPU kernel", dtype_name(table.dtype)));
      }
      return Status();
    }
    case ir::OpKind::kRmsNorm:
      if (input(ir::rms_norm_input::kWeight).dtype != DType::kF32) {
        return unsupported(op, "the CPU kernel takes an f32 weight");
      }
      return Status();
    case ir::OpKind::kMatMul:
      return prepare_matmul(prepared);
    case ir::OpKind::kAdd:
    case ir::OpKind::kSwiGlu:
    case ir::OpKind::kGeGlu:
    case ir::OpKind::kScale:
    case ir::OpKind::kSoftCap:
      return Status();
    case ir::OpKind::kMul:
    case ir::OpKind::kSilu:
      return unsupported(op, "no CPU kernel implements this op kind yet");
    case ir::OpKind::kAllReduceSum:
      if (collectives_ == nullptr || collective_failures_ == nullptr) {
        return unsupported(op,
                           "a collective op needs the executor to be a member of a group "
                           "(ExecutorOptions::collectives)");
      }
      return Status();
    case ir::OpKind::kRope:
      return prepare_rope(prepared);
    case ir::OpKind::kKvCacheWrite:
      prepared.kv_layer = op.layer - kv_cache_.first_layer;  // checked by map_kv_caches
      return Status();
    case ir::OpKind::kPagedAttention:
      prepared.kv_layer = op.layer - kv_cache_.first_layer;
      prepared.workspace_bytes = aligned_workspace(
          kernels::cpu::paged_attention_workspace_bytes(kv_cache_.layout, num_threads_));
      return Status();
    case ir::OpKind::kGatherRows:
      return prepare_gather(prepared);
    case ir::OpKind::kLora:
      return prepare_lora(prepared);
    case ir::OpKind::kAttentionMerge:
      return prepare_attention_merge(prepared);
  }
  return unsupported(op, "unknown op kind");
}

Status PreparedGraph::prepare_attention_merge(PreparedOp& prepared) {
  const ir::Op& op = *prepared.op;
  if (collectives_ == nullptr || collective_failures_ == nullptr) {
    return unsupported(op,
                       "a KV-parallel merge gathers the members' partials through the step "
                       "collectives; this executor has none (ExecutorOptions::collectives)");
  }
  const ir::TensorInfo& partial =
      graph_.tensor(op.inputs[static_cast<size_t>(ir::attention_merge_input::kPartial)]);
  const ir::TensorInfo& lse =
      graph_.tensor(op.inputs[static_cast<size_t>(ir::attention_merge_input::kLse)]);
  // Workspace: this member's packed partial, then every member's (the all_gather's output).
  const int64_t part = partial.shape.num_elements() + lse.shape.num_elements();
  prepared.workspace_bytes = aligned_workspace((1 + int64_t{collectives_->size()}) * part *
                                               static_cast<int64_t>(sizeof(float)));
  return Status();
}

Status PreparedGraph::prepare_matmul(PreparedOp& prepared) {
  const ir::Op& op = *prepared.op;
  const ir::TensorInfo& x = graph_.tensor(op.inputs[static_cast<size_t>(ir::matmul_input::kX)]);
  const ir::TensorInfo& weight =
      graph_.tensor(op.inputs[static_cast<size_t>(ir::matmul_input::kWeight)]);
  if (!is_weight_dtype(weight.dtype) && weight.dtype != DType::kQ8_0Panels) {
    return unsupported(op,
                       fmt::format("weight dtype {} has no CPU kernel", dtype_name(weight.dtype)));
  }
  if (x.shape[1] % 32 != 0) {
    return unsupported(op, fmt::format("input features {} are not a multiple of 32, which the CPU "
                                       "matmul requires",
                                       x.shape[1]));
  }
  if (op.inputs.size() > 2 &&
      graph_.tensor(op.inputs[static_cast<size_t>(ir::matmul_input::kBias)]).dtype != DType::kF32) {
    return unsupported(op, "the CPU kernel takes an f32 bias");
  }
  prepared.workspace_bytes = aligned_workspace(
      kernels::cpu::matmul_workspace_bytes(weight.dtype, x.shape[0], x.shape[1], num_threads_));
  return Status();
}

Status PreparedGraph::prepare_rope(PreparedOp& prepared) {
  const ir::Op& op = *prepared.op;
  const auto& attributes = std::get<ir::RopeAttributes>(op.attributes);
  if (attributes.rotary_dim > kernels::cpu::kRopeMaxRotaryDim) {
    return unsupported(op, fmt::format("rotary_dim {} exceeds the CPU kernel's {}",
                                       attributes.rotary_dim, kernels::cpu::kRopeMaxRotaryDim));
  }
  switch (attributes.scaling.kind) {
    case ir::RopeScalingKind::kNone:
      return Status();
    case ir::RopeScalingKind::kLinear:
      prepared.rope_position_scale = 1.0f / attributes.scaling.factor;
      return Status();
    case ir::RopeScalingKind::kLlama3: {
      const auto pairs = static_cast<size_t>(attributes.rotary_dim / 2);
      HostBuffer& factors = constants_.emplace_back(pairs * sizeof(float));
      const kernels::cpu::Llama3RopeScaling scaling{
          attributes.scaling.factor, attributes.scaling.low_frequency_factor,
          attributes.scaling.high_frequency_factor,
          static_cast<int32_t>(attributes.scaling.original_context_length)};
      kernels::cpu::llama3_frequency_factors(scaling, attributes.theta,
                                             static_cast<int32_t>(attributes.rotary_dim),
                                             factors.as<float>());
      prepared.rope_frequency_factors = factors.as<float>();
      return Status();
    }
    case ir::RopeScalingKind::kYarn: {
      const auto pairs = static_cast<size_t>(attributes.rotary_dim / 2);
      HostBuffer& factors = constants_.emplace_back(pairs * sizeof(float));
      const ir::RopeScaling& scaling = attributes.scaling;
      const kernels::cpu::YarnRopeScaling yarn{
          scaling.factor,           scaling.extrapolation_factor,
          scaling.attention_factor, scaling.beta_fast,
          scaling.beta_slow,        static_cast<int32_t>(scaling.original_context_length)};
      kernels::cpu::yarn_frequency_factors(
          yarn, attributes.theta, static_cast<int32_t>(attributes.rotary_dim), factors.as<float>());
      prepared.rope_frequency_factors = factors.as<float>();
      prepared.rope_magnitude_scale = kernels::cpu::yarn_magnitude_scale(yarn);
      return Status();
    }
  }
  return unsupported(op, "unknown RoPE scaling");
}

Status PreparedGraph::prepare_gather(PreparedOp& prepared) {
  const ir::Op& op = *prepared.op;
  const ir::TensorInfo& indices =
      graph_.tensor(op.inputs[static_cast<size_t>(ir::gather_rows_input::kIndices)]);
  if (indices.residency == ir::Residency::kInput && indices.name == ir::kInputLogitIndices) {
    // The real rows change every step: the kernel reads their count at run time and zeroes the
    // padding rows.
    prepared.gather_row_count = inputs_.num_logit_rows();
    return Status();
  }
  // Any other index list is used whole.
  HostBuffer& count = constants_.emplace_back(sizeof(int32_t));
  *count.as<int32_t>() = static_cast<int32_t>(indices.shape[0]);
  prepared.gather_row_count = count.as<int32_t>();
  return Status();
}

Status PreparedGraph::prepare_lora(PreparedOp& prepared) {
  const ir::Op& op = *prepared.op;
  const int32_t target = std::get<ir::LoraAttributes>(op.attributes).target;
  if (adapters_.slots == nullptr) {
    return unsupported(op,
                       "the graph updates projections with adapters but the executor was "
                       "given no adapter table");
  }
  if (target >= adapters_.num_targets) {
    return unsupported(op, fmt::format("adapter target {} is outside the adapter table's {} rows",
                                       target, adapters_.num_targets));
  }
  if (adapters_.num_slots != inputs_.limits().num_adapter_slots) {
    return unsupported(op, fmt::format("the adapter table has {} slots; the step limits say {}",
                                       adapters_.num_slots, inputs_.limits().num_adapter_slots));
  }
  prepared.lora_slots = adapters_.slots + int64_t{target} * adapters_.num_slots;
  prepared.workspace_bytes =
      aligned_workspace(kernels::cpu::lora_workspace_bytes(adapters_.max_rank, num_threads_));
  return Status();
}

}  // namespace folio::exec
