#include "folio/ir/builder.h"

#include <utility>

#include "folio/ir/cost.h"
#include "folio/ir/op_signature.h"
#include "folio/ir/verify.h"

namespace folio::ir {

Result<TensorId> GraphBuilder::external(std::string name, DType dtype, Shape shape,
                                        Residency residency) {
  return graph_.add_tensor(std::move(name), dtype, shape, residency);
}

Result<TensorId> GraphBuilder::input(std::string name, DType dtype, Shape shape) {
  return external(std::move(name), dtype, shape, Residency::kInput);
}
Result<TensorId> GraphBuilder::weight(std::string name, DType dtype, Shape shape) {
  return external(std::move(name), dtype, shape, Residency::kWeight);
}
Result<TensorId> GraphBuilder::kv_cache(std::string name, DType dtype, Shape shape) {
  return external(std::move(name), dtype, shape, Residency::kKvCache);
}

Result<std::vector<TensorId>> GraphBuilder::emit(OpKind kind, std::string name,
                                                 std::vector<TensorId> inputs,
                                                 std::vector<TensorId> updates,
                                                 OpAttributes attributes) {
  Op op;
  op.kind = kind;
  op.name = std::move(name);
  op.layer = layer_;
  op.inputs = std::move(inputs);
  op.updates = std::move(updates);
  op.attributes = std::move(attributes);
  op.annotations.phase = graph_.phase();
  op.annotations.modality = Modality::kText;
  for (const std::vector<TensorId>* list : {&op.inputs, &op.updates}) {
    for (TensorId id : *list) {
      if (!graph_.contains(id)) {
        return invalid_argument("{} '{}': operand {} is not a tensor of this graph ({} tensors)",
                                op_kind_name(kind), op.name, id.value(), graph_.num_tensors());
      }
    }
  }
  FOLIO_ASSIGN_OR_RETURN(std::vector<OutputSpec> specs, infer_outputs(graph_, op));
  // The first output is named after the op; a KV-parallel attention's log-sum-exp after it.
  std::vector<std::string> names;
  for (size_t index = 0; index < specs.size(); ++index) {
    if (index == 0) {
      names.push_back(op.name);
    } else if (kind == OpKind::kPagedAttention && index == attention_output::kLse) {
      names.push_back(fmt::format("{}.lse", op.name));
    } else {
      return internal_error("{} '{}' has {} outputs; the builder names {}", op_kind_name(kind),
                            op.name, specs.size(), index);
    }
  }
  // Check the names before adding anything, so a failure leaves the graph unchanged.
  for (const std::string& output_name : names) {
    if (graph_.find_tensor(output_name).has_value()) {
      return already_exists("{} '{}': the graph already has a tensor named '{}'",
                            op_kind_name(kind), op.name, output_name);
    }
  }
  for (size_t index = 0; index < specs.size(); ++index) {
    FOLIO_ASSIGN_OR_RETURN(TensorId output,
                           graph_.add_tensor(names[index], specs[index].dtype, specs[index].shape,
                                             Residency::kActivation));
    op.outputs.push_back(output);
  }
  op.annotations.cost = estimate_cost(graph_, op);
  std::vector<TensorId> outputs = op.outputs;
  FOLIO_RETURN_IF_ERROR(graph_.add_op(std::move(op)).status());
  return outputs;
}

Result<TensorId> GraphBuilder::emit_one(OpKind kind, std::string name, std::vector<TensorId> inputs,
                                        OpAttributes attributes) {
  FOLIO_ASSIGN_OR_RETURN(std::vector<TensorId> outputs,
                         emit(kind, std::move(name), std::move(inputs), {}, std::move(attributes)));
  return outputs.at(0);
}

Result<TensorId> GraphBuilder::embedding(TensorId token_ids, TensorId table, std::string name,
                                         DType output_dtype) {
  return emit_one(OpKind::kEmbedding, std::move(name), {token_ids, table},
                  EmbeddingAttributes{output_dtype});
}

Result<TensorId> GraphBuilder::rms_norm(TensorId x, TensorId weight, float epsilon,
                                        std::string name) {
  return emit_one(OpKind::kRmsNorm, std::move(name), {x, weight}, RmsNormAttributes{epsilon});
}

Result<TensorId> GraphBuilder::matmul(TensorId x, TensorId weight, std::string name) {
  return emit_one(OpKind::kMatMul, std::move(name), {x, weight});
}

Result<TensorId> GraphBuilder::matmul(TensorId x, TensorId weight, TensorId bias,
                                      std::string name) {
  return emit_one(OpKind::kMatMul, std::move(name), {x, weight, bias});
}

Result<TensorId> GraphBuilder::add(TensorId a, TensorId b, std::string name) {
  return emit_one(OpKind::kAdd, std::move(name), {a, b});
}

Result<TensorId> GraphBuilder::mul(TensorId a, TensorId b, std::string name) {
  return emit_one(OpKind::kMul, std::move(name), {a, b});
}

Result<TensorId> GraphBuilder::silu(TensorId x, std::string name) {
  return emit_one(OpKind::kSilu, std::move(name), {x});
}

Result<TensorId> GraphBuilder::swiglu(TensorId gate, TensorId up, std::string name) {
  return emit_one(OpKind::kSwiGlu, std::move(name), {gate, up});
}

Result<TensorId> GraphBuilder::geglu(TensorId gate, TensorId up, std::string name) {
  return emit_one(OpKind::kGeGlu, std::move(name), {gate, up});
}

Result<TensorId> GraphBuilder::scale(TensorId x, float factor, std::string name) {
  return emit_one(OpKind::kScale, std::move(name), {x}, ScaleAttributes{factor});
}

Result<TensorId> GraphBuilder::soft_cap(TensorId x, float cap, std::string name) {
  return emit_one(OpKind::kSoftCap, std::move(name), {x}, SoftCapAttributes{cap});
}

Result<TensorId> GraphBuilder::all_reduce_sum(TensorId x, std::string name) {
  return emit_one(OpKind::kAllReduceSum, std::move(name), {x});
}

Result<TensorId> GraphBuilder::rope(TensorId x, TensorId positions,
                                    const RopeAttributes& attributes, std::string name) {
  return emit_one(OpKind::kRope, std::move(name), {x, positions}, attributes);
}

Result<TensorId> GraphBuilder::rope(TensorId x, TensorId positions, TensorId frequency_factors,
                                    const RopeAttributes& attributes, std::string name) {
  return emit_one(OpKind::kRope, std::move(name), {x, positions, frequency_factors}, attributes);
}

Status GraphBuilder::kv_cache_write(TensorId key, TensorId value, TensorId slot_mapping,
                                    TensorId key_cache, TensorId value_cache, std::string name) {
  return emit(OpKind::kKvCacheWrite, std::move(name), {key, value, slot_mapping},
              {key_cache, value_cache}, NoAttributes{})
      .status();
}

Result<TensorId> GraphBuilder::paged_attention(TensorId query, TensorId key_cache,
                                               TensorId value_cache,
                                               const AttentionMetadata& metadata,
                                               const AttentionAttributes& attributes,
                                               std::string name) {
  if (attributes.is_kv_parallel()) {
    return invalid_argument(
        "paged_attention '{}': a KV-parallel partial has two outputs; emit it with "
        "paged_attention_partial",
        name);
  }
  return emit_one(OpKind::kPagedAttention, std::move(name),
                  {query, key_cache, value_cache, metadata.seq_lens, metadata.query_start,
                   metadata.block_tables},
                  attributes);
}

Result<PartialAttention> GraphBuilder::paged_attention_partial(
    TensorId query, TensorId key_cache, TensorId value_cache, const AttentionMetadata& metadata,
    const AttentionAttributes& attributes, std::string name) {
  if (!attributes.is_kv_parallel()) {
    return invalid_argument("paged_attention '{}': a partial attention needs a KV range", name);
  }
  FOLIO_ASSIGN_OR_RETURN(const std::vector<TensorId> outputs,
                         emit(OpKind::kPagedAttention, std::move(name),
                              {query, key_cache, value_cache, metadata.seq_lens,
                               metadata.query_start, metadata.block_tables},
                              {}, attributes));
  return PartialAttention{outputs.at(attention_output::kOutput),
                          outputs.at(attention_output::kLse)};
}

Result<TensorId> GraphBuilder::attention_merge(TensorId partial, TensorId lse, std::string name) {
  return emit_one(OpKind::kAttentionMerge, std::move(name), {partial, lse});
}

Result<TensorId> GraphBuilder::gather_rows(TensorId x, TensorId indices, std::string name) {
  return emit_one(OpKind::kGatherRows, std::move(name), {x, indices});
}

Result<TensorId> GraphBuilder::lora(TensorId x, TensorId base, TensorId token_adapter_slots,
                                    int32_t target, std::string name) {
  return emit_one(OpKind::kLora, std::move(name), {x, base, token_adapter_slots},
                  LoraAttributes{target});
}

Status GraphBuilder::mark_output(TensorId tensor) {
  if (!graph_.contains(tensor)) {
    return invalid_argument("mark_output: {} is not a tensor of this graph", tensor.value());
  }
  const TensorInfo& info = graph_.tensor(tensor);
  if (info.residency != Residency::kActivation) {
    return invalid_argument(
        "mark_output: '{}' is a {} tensor; only an activation an op produces "
        "can become a step output",
        info.name, residency_name(info.residency));
  }
  return graph_.set_residency(tensor, Residency::kOutput);
}

Result<Graph> GraphBuilder::finish() {
  FOLIO_RETURN_IF_ERROR(verify(graph_));
  Graph finished = std::move(graph_);
  graph_ = Graph(finished.phase());
  layer_ = -1;
  return finished;
}

}  // namespace folio::ir
