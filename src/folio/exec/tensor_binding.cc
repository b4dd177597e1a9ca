#include "folio/exec/tensor_binding.h"

#include <fmt/format.h>

namespace folio::exec {
namespace {

Status check_cache_tensor(const ir::TensorInfo& tensor, const KvCacheBinding& binding) {
  const kernels::PagedKvLayout& layout = binding.layout;
  const ir::Shape expected{binding.num_blocks, layout.block_size, layout.num_kv_heads,
                           layout.head_dim};
  if (tensor.dtype != layout.dtype || !(tensor.shape == expected)) {
    return invalid_argument(
        "KV cache '{}' is {} {}; the bound paged cache is {} {} (blocks, block_size, kv_heads, "
        "head_dim)",
        tensor.name, dtype_name(tensor.dtype), tensor.shape.to_string(), dtype_name(layout.dtype),
        expected.to_string());
  }
  return Status();
}

Status assign(std::vector<KvCacheRef>& refs, const ir::Graph& graph, const ir::Op& op,
              ir::TensorId cache, bool is_value, const KvCacheBinding& binding) {
  const ir::TensorInfo& tensor = graph.tensor(cache);
  const int32_t layer = op.layer - binding.first_layer;
  if (op.layer < 0 || layer < 0 || layer >= binding.layout.num_layers) {
    return invalid_argument(
        "{} '{}' uses KV cache '{}' with layer index {}; expected a layer in [{}, {}) of the "
        "paged cache",
        ir::op_kind_name(op.kind), op.name, tensor.name, op.layer, binding.first_layer,
        binding.first_layer + binding.layout.num_layers);
  }
  FOLIO_RETURN_IF_ERROR(check_cache_tensor(tensor, binding));
  KvCacheRef& ref = refs[static_cast<size_t>(cache.value())];
  const KvCacheRef wanted{layer, is_value};
  if (ref.layer >= 0 && (ref.layer != wanted.layer || ref.is_value != wanted.is_value)) {
    return invalid_argument(
        "KV cache '{}' is used as the {} cache of layer {} and, by {} '{}', as the {} cache of "
        "layer {}",
        tensor.name, ref.is_value ? "value" : "key", ref.layer, ir::op_kind_name(op.kind), op.name,
        is_value ? "value" : "key", op.layer);
  }
  ref = wanted;
  return Status();
}

}  // namespace

Result<std::vector<KvCacheRef>> map_kv_caches(const ir::Graph& graph,
                                              const KvCacheBinding& binding) {
  FOLIO_RETURN_IF_ERROR(binding.layout.validate());
  std::vector<KvCacheRef> refs(static_cast<size_t>(graph.num_tensors()));
  for (const ir::Op& op : graph.ops()) {
    if (op.kind == ir::OpKind::kKvCacheWrite) {
      FOLIO_RETURN_IF_ERROR(assign(
          refs, graph, op, op.updates[ir::kv_cache_write_update::kKeyCache], false, binding));
      FOLIO_RETURN_IF_ERROR(assign(
          refs, graph, op, op.updates[ir::kv_cache_write_update::kValueCache], true, binding));
    } else if (op.kind == ir::OpKind::kPagedAttention) {
      FOLIO_RETURN_IF_ERROR(
          assign(refs, graph, op, op.inputs[ir::attention_input::kKeyCache], false, binding));
      FOLIO_RETURN_IF_ERROR(
          assign(refs, graph, op, op.inputs[ir::attention_input::kValueCache], true, binding));
    }
  }
  for (const ir::TensorInfo& tensor : graph.tensors()) {
    if (tensor.residency == ir::Residency::kKvCache &&
        refs[static_cast<size_t>(tensor.id.value())].layer < 0) {
      return invalid_argument("KV cache '{}' is used by no KV write or attention op", tensor.name);
    }
  }
  return refs;
}

}  // namespace folio::exec
