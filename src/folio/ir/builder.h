// GraphBuilder: emits a step graph op by op in program order, inferring each output's dtype and
// shape from the op signatures (op_signature.h) and annotating each op with the builder's phase,
// the text modality, the current layer index and its cost hints (cost.h).
//
// Every call checks its operands first and returns an error naming the op, the operand and what
// was expected ("matmul 'blk.0.attn_q': input 'blk.0.attn_norm' [16, 64] has 64 columns but
// weight ... expects 48"); a failed call leaves the graph unchanged, so a caller may report the
// error and keep nothing half-built. `name` names both the op and its output tensor and must be
// unique in the graph.
//
//   GraphBuilder builder(Phase::kPrefill);
//   FOLIO_ASSIGN_OR_RETURN(TensorId ids, builder.input("token_ids", DType::kI32, {tokens}));
//   FOLIO_ASSIGN_OR_RETURN(TensorId table, builder.weight("token_embd.weight", ...));
//   FOLIO_ASSIGN_OR_RETURN(TensorId hidden, builder.embedding(ids, table, "embed"));
//   ...
//   FOLIO_ASSIGN_OR_RETURN(Graph graph, builder.finish());
//
// Thread-safety: none; one thread builds a graph.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "folio/base/result.h"
#include "folio/ir/graph.h"
#include "folio/ir/op.h"
#include "folio/ir/shape.h"

namespace folio::ir {

// The metadata inputs a paged attention op reads (all persistent inputs, i32).
struct AttentionMetadata {
  TensorId seq_lens;      // [S]
  TensorId query_start;   // [S + 1]
  TensorId block_tables;  // [S, max_blocks]
};

// A KV-parallel member's partial attention: its output and log-sum-exp (op.h).
struct PartialAttention {
  TensorId output;  // float [T, heads * head_dim]
  TensorId lse;     // f32 [T, heads]
};

class GraphBuilder {
 public:
  explicit GraphBuilder(Phase phase) : graph_(phase) {}

  // Ops emitted from now on carry this layer index (-1: outside the transformer layers).
  void set_layer(int32_t layer) { layer_ = layer; }
  int32_t layer() const { return layer_; }

  // External tensors: persistent inputs, weights (bound by name) and KV caches.
  Result<TensorId> input(std::string name, DType dtype, Shape shape);
  Result<TensorId> weight(std::string name, DType dtype, Shape shape);
  Result<TensorId> kv_cache(std::string name, DType dtype, Shape shape);

  // float [T, hidden] <- rows `token_ids` (i32 [T]) of `table` ([vocab, hidden]).
  Result<TensorId> embedding(TensorId token_ids, TensorId table, std::string name,
                             DType output_dtype = DType::kF32);
  Result<TensorId> rms_norm(TensorId x, TensorId weight, float epsilon, std::string name);
  // [T, N] <- x [T, K] * weight[N, K]^T (+ bias [N]).
  Result<TensorId> matmul(TensorId x, TensorId weight, std::string name);
  Result<TensorId> matmul(TensorId x, TensorId weight, TensorId bias, std::string name);
  Result<TensorId> add(TensorId a, TensorId b, std::string name);
  Result<TensorId> mul(TensorId a, TensorId b, std::string name);
  Result<TensorId> silu(TensorId x, std::string name);
  // silu(gate) * up, both [T, F].
  Result<TensorId> swiglu(TensorId gate, TensorId up, std::string name);
  // gelu(gate) * up (tanh approximation), both [T, F].
  Result<TensorId> geglu(TensorId gate, TensorId up, std::string name);
  // factor * x.
  Result<TensorId> scale(TensorId x, float factor, std::string name);
  // cap * tanh(x / cap).
  Result<TensorId> soft_cap(TensorId x, float cap, std::string name);
  // The sum of x (f32) over the members of the group the graph runs in (tensor parallelism).
  Result<TensorId> all_reduce_sum(TensorId x, std::string name);
  // x [T, heads * head_dim] rotated by the positions (i32 [T]).
  Result<TensorId> rope(TensorId x, TensorId positions, const RopeAttributes& attributes,
                        std::string name);
  // The same with each pair's frequency divided by frequency_factors (f32 [rotary_dim / 2]).
  Result<TensorId> rope(TensorId x, TensorId positions, TensorId frequency_factors,
                        const RopeAttributes& attributes, std::string name);
  // Stores key and value ([T, kv_heads * head_dim]) of each token at its slot (i32 [T]).
  Status kv_cache_write(TensorId key, TensorId value, TensorId slot_mapping, TensorId key_cache,
                        TensorId value_cache, std::string name);
  Result<TensorId> paged_attention(TensorId query, TensorId key_cache, TensorId value_cache,
                                   const AttentionMetadata& metadata,
                                   const AttentionAttributes& attributes, std::string name);
  // A KV-parallel member's partial attention over the range attributes.kv_range_begin/end
  // (which must be set); its second output is named "<name>.lse".
  Result<PartialAttention> paged_attention_partial(TensorId query, TensorId key_cache,
                                                   TensorId value_cache,
                                                   const AttentionMetadata& metadata,
                                                   const AttentionAttributes& attributes,
                                                   std::string name);
  // [T, heads * head_dim] <- every member's partial and lse merged (op.h "attention_merge").
  Result<TensorId> attention_merge(TensorId partial, TensorId lse, std::string name);
  // [R, H] <- rows `indices` (i32 [R]) of x [T, H].
  Result<TensorId> gather_rows(TensorId x, TensorId indices, std::string name);
  // [T, N] <- base [T, N] plus the adapter update of each token (slots i32 [T]) for the
  // projection `target` of x [T, K] (op.h "lora").
  Result<TensorId> lora(TensorId x, TensorId base, TensorId token_adapter_slots, int32_t target,
                        std::string name);

  // Makes an activation the step's result: it moves from the arena to a persistent output
  // buffer the caller reads after the step. Fails unless `tensor` is an activation.
  Status mark_output(TensorId tensor);

  const Graph& graph() const { return graph_; }

  // Verifies the graph (verify.h) and hands it over; the builder starts a new empty graph of the
  // same phase.
  Result<Graph> finish();

 private:
  Result<TensorId> external(std::string name, DType dtype, Shape shape, Residency residency);
  // Emits one op; returns its outputs. Changes nothing on failure.
  Result<std::vector<TensorId>> emit(OpKind kind, std::string name, std::vector<TensorId> inputs,
                                     std::vector<TensorId> updates, OpAttributes attributes);
  Result<TensorId> emit_one(OpKind kind, std::string name, std::vector<TensorId> inputs,
                            OpAttributes attributes = NoAttributes{});

  Graph graph_;
  int32_t layer_ = -1;
};

}  // namespace folio::ir
