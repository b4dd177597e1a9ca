#include "folio/ir/cost.h"

#include <algorithm>
#include <vector>

namespace folio::ir {
namespace {

const TensorInfo& input(const Graph& graph, const Op& op, int index) {
  return graph.tensor(op.inputs[static_cast<size_t>(index)]);
}

int64_t element_bytes(DType dtype) {
  return row_bytes(dtype, 1);
}

int64_t sum_bytes(const Graph& graph, const std::vector<TensorId>& tensors) {
  int64_t bytes = 0;
  for (TensorId id : tensors) bytes += graph.tensor(id).bytes();
  return bytes;
}

CostHints embedding_cost(const Graph& graph, const Op& op) {
  const TensorInfo& ids = input(graph, op, embedding_input::kTokenIds);
  const TensorInfo& table = input(graph, op, embedding_input::kTable);
  const int64_t tokens = ids.shape[0];
  const int64_t hidden = table.shape[1];
  CostHints cost;
  cost.flops = dtype_info(table.dtype).quantized ? tokens * hidden : 0;
  cost.bytes_read = ids.bytes() + tokens * row_bytes(table.dtype, hidden);
  return cost;
}

CostHints matmul_cost(const Graph& graph, const Op& op) {
  const TensorInfo& x = input(graph, op, matmul_input::kX);
  const TensorInfo& weight = input(graph, op, matmul_input::kWeight);
  const int64_t rows = x.shape[0];
  const int64_t out_features = weight.shape[0];
  const int64_t in_features = weight.shape[1];
  const bool has_bias = op.inputs.size() > static_cast<size_t>(matmul_input::kBias);
  CostHints cost;
  cost.flops = 2 * rows * out_features * in_features + (has_bias ? rows * out_features : 0);
  cost.bytes_read = sum_bytes(graph, op.inputs);
  return cost;
}

CostHints rope_cost(const Graph& graph, const Op& op) {
  const auto& attributes = std::get<RopeAttributes>(op.attributes);
  const int64_t tokens = input(graph, op, rope_input::kX).shape[0];
  CostHints cost;
  cost.flops = 3 * tokens * attributes.num_heads * attributes.rotary_dim;
  cost.bytes_read = sum_bytes(graph, op.inputs);
  return cost;
}

CostHints kv_cache_write_cost(const Graph& graph, const Op& op) {
  const TensorInfo& key = input(graph, op, kv_cache_write_input::kKey);
  const TensorInfo& cache = graph.tensor(op.updates[kv_cache_write_update::kKeyCache]);
  CostHints cost;
  cost.bytes_read = sum_bytes(graph, op.inputs);
  cost.bytes_written = 2 * key.shape.num_elements() * element_bytes(cache.dtype);
  return cost;
}

CostHints attention_cost(const Graph& graph, const Op& op) {
  const auto& attributes = std::get<AttentionAttributes>(op.attributes);
  const TensorInfo& query = input(graph, op, attention_input::kQuery);
  const TensorInfo& key_cache = input(graph, op, attention_input::kKeyCache);
  const TensorInfo& tables = input(graph, op, attention_input::kBlockTables);
  const int64_t tokens = query.shape[0];
  const int64_t num_sequences = tables.shape[0];
  const int64_t capacity = tables.shape[1] * key_cache.shape[1];
  const int64_t kv_row_bytes =
      attributes.num_kv_heads * attributes.head_dim * element_bytes(key_cache.dtype);
  CostHints cost;
  cost.flops = 4 * tokens * attributes.num_heads * attributes.head_dim * capacity;
  cost.bytes_read = query.bytes() + input(graph, op, attention_input::kSeqLens).bytes() +
                    input(graph, op, attention_input::kQueryStartLoc).bytes() + tables.bytes() +
                    2 * num_sequences * capacity * kv_row_bytes;
  return cost;
}

CostHints gather_rows_cost(const Graph& graph, const Op& op) {
  const TensorInfo& x = input(graph, op, gather_rows_input::kX);
  const TensorInfo& indices = input(graph, op, gather_rows_input::kIndices);
  CostHints cost;
  cost.bytes_read = indices.bytes() + indices.shape[0] * row_bytes(x.dtype, x.shape[1]);
  return cost;
}

// Cost of ops that read every input once and do `flops_per_element` per output element.
CostHints elementwise_cost(const Graph& graph, const Op& op, int64_t flops_per_element) {
  CostHints cost;
  cost.flops = flops_per_element * graph.tensor(op.outputs.at(0)).shape.num_elements();
  cost.bytes_read = sum_bytes(graph, op.inputs);
  return cost;
}

}  // namespace

CostHints estimate_cost(const Graph& graph, const Op& op) {
  CostHints cost;
  switch (op.kind) {
    case OpKind::kEmbedding:
      cost = embedding_cost(graph, op);
      break;
    case OpKind::kRmsNorm:
      cost = elementwise_cost(graph, op, 4);
      break;
    case OpKind::kMatMul:
      cost = matmul_cost(graph, op);
      break;
    case OpKind::kAdd:
    case OpKind::kMul:
      cost = elementwise_cost(graph, op, 1);
      break;
    case OpKind::kSilu:
      cost = elementwise_cost(graph, op, 4);
      break;
    case OpKind::kSwiGlu:
      cost = elementwise_cost(graph, op, 5);
      break;
    case OpKind::kRope:
      cost = rope_cost(graph, op);
      break;
    case OpKind::kKvCacheWrite:
      return kv_cache_write_cost(graph, op);
    case OpKind::kPagedAttention:
      cost = attention_cost(graph, op);
      break;
    case OpKind::kGatherRows:
      cost = gather_rows_cost(graph, op);
      break;
    case OpKind::kLora:
      // The adapters' ranks are known only at run time; this counts the add of the update to
      // the base, which every token pays (the rank-r work is 2r(K + N) per adapted token).
      cost = elementwise_cost(graph, op, 1);
      break;
    case OpKind::kGeGlu:
      cost = elementwise_cost(graph, op, 10);
      break;
    case OpKind::kScale:
      cost = elementwise_cost(graph, op, 1);
      break;
    case OpKind::kSoftCap:
      cost = elementwise_cost(graph, op, 4);
      break;
    case OpKind::kAllReduceSum:
      cost = elementwise_cost(graph, op, 1);
      cost.bytes_communicated = cost.bytes_read;
      break;
    case OpKind::kAttentionMerge:
      // Per member: a weight and a multiply-add per element (the members' count is known at
      // run time; this counts two). Each member hands the group its partial and log-sum-exps.
      cost = elementwise_cost(graph, op, 4);
      cost.bytes_communicated = cost.bytes_read;
      break;
  }
  cost.bytes_written = sum_bytes(graph, op.outputs);
  return cost;
}

CostTotals total_cost(const Graph& graph) {
  CostTotals totals;
  for (const Op& op : graph.ops()) {
    const auto kind = static_cast<size_t>(op.kind);
    totals.total += op.annotations.cost;
    totals.by_kind[kind] += op.annotations.cost;
    ++totals.num_ops_by_kind[kind];
  }
  return totals;
}

int64_t weight_bytes_read(const Graph& graph) {
  std::vector<int64_t> read(static_cast<size_t>(graph.num_tensors()), 0);
  for (const Op& op : graph.ops()) {
    for (size_t position = 0; position < op.inputs.size(); ++position) {
      const TensorInfo& tensor = graph.tensor(op.inputs[position]);
      if (tensor.residency != Residency::kWeight) continue;
      int64_t bytes = tensor.bytes();
      if (op.kind == OpKind::kEmbedding &&
          position == static_cast<size_t>(embedding_input::kTable)) {
        const TensorInfo& ids = input(graph, op, embedding_input::kTokenIds);
        bytes = ids.shape[0] * row_bytes(tensor.dtype, tensor.shape[1]);
      }
      int64_t& most = read[static_cast<size_t>(tensor.id.value())];
      most = std::max(most, bytes);
    }
  }
  int64_t total = 0;
  for (int64_t bytes : read) total += bytes;
  return total;
}

}  // namespace folio::ir
