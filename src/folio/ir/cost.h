// Cost hints (seed 002 §2.3, §4.3): FLOPs and bytes each op reads and writes, computed from the
// shapes and dtypes of its operands, so a scheduler or `folio inspect` can compare steps and ops
// without running anything. They are estimates with one fixed formula per op kind:
//
//   embedding        FLOPs T*hidden if the table is quantized (dequantize), else 0;
//                    reads the ids and the T table rows gathered
//   rms_norm         4 FLOPs per element (square, sum, normalize, weight)
//   matmul           2*T*N*K, plus T*N with a bias; reads x, the whole weight and the bias
//   add, mul         1 FLOP per element;  silu 4;  swiglu 5;  geglu 10;
//                    scale 1;  soft_cap 4
//   rope             3 FLOPs per rotated element (two multiplies, one add)
//   kv_cache_write   0 FLOPs; writes T * kv_heads * head_dim elements of each cache
//   paged_attention  upper bound over the block-table capacity C = max_blocks * block_size:
//                    4*T*heads*head_dim*C FLOPs (QK^T and PV; softmax not counted); reads the
//                    query, the metadata and S*C tokens of each cache
//   gather_rows      0 FLOPs; reads the R rows gathered and the indices
//   all_reduce_sum   1 FLOP per element (the add); communicates the input's bytes
//
// Unless said otherwise an op reads each input once in full and writes each output once.
#pragma once

#include <array>
#include <cstdint>

#include "folio/ir/annotations.h"
#include "folio/ir/graph.h"
#include "folio/ir/op.h"

namespace folio::ir {

// Requires: `op`'s operands exist in `graph` and satisfy its signature (op_signature.h).
CostHints estimate_cost(const Graph& graph, const Op& op);

struct CostTotals {
  CostHints total;
  std::array<CostHints, kNumOpKinds> by_kind{};
  std::array<int32_t, kNumOpKinds> num_ops_by_kind{};

  const CostHints& of(OpKind kind) const { return by_kind[static_cast<size_t>(kind)]; }
  int32_t num_ops(OpKind kind) const { return num_ops_by_kind[static_cast<size_t>(kind)]; }
};

// Sums the cost annotations stored on the ops of `graph`.
CostTotals total_cost(const Graph& graph);

// Bytes of weights one run of `graph` reads, each weight counted once at the most any op reads
// of it: the whole tensor, except an embedding table, of which only the gathered rows (a table
// that is also a tied LM head counts whole). For a one-token decode graph, the bytes a decode
// step streams from memory at least: the numerator of the batch-1 decode roofline.
int64_t weight_bytes_read(const Graph& graph);

}  // namespace folio::ir
