// Pipeline placement (issue 15, slice 3): which contiguous range of a model's layers each worker
// of a pipeline runs, balanced by the IR's cost annotations and bounded by each worker's
// declared memory.
//
// - Costs come from the model's own step graphs (model/llama_graph.h), op by op (ir/cost.h):
//   ops are charged to their layer (Op::layer); the ops before the first layer (the embedding)
//   to the first stage and those after the last (final norm, LM head) to the last.
//   Decode balance uses the weight bytes one decode token streams (ir::weight_bytes_read: a
//   batch-1 decode step is memory-bound), prefill balance the FLOPs of a prefill step.
// - A stage's memory is the weights its ops read, whole (the embedding table whole on the
//   first stage; a tied LM head counts it on the last stage too), plus its layers' KV for
//   PipelinePlanOptions::kv_tokens tokens. Activations and captured graphs are not counted:
//   they come out of the worker's pool like the KV, so leave room for them.
// - The plan minimizes the largest stage cost over every split into one non-empty range per
//   worker, in worker order, whose stages fit their workers; ties go to the earliest cut.
// - What crosses a cut is the residual stream (ir::kOutputHidden of the stage graph), the same
//   bytes per token at every cut.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "folio/base/result.h"
#include "folio/model/llama_model_file.h"
#include "folio/tensor/dtype.h"

namespace folio::dist {

// What one layer (or the ops before or after the layers) costs.
struct PipelineLayerCost {
  int64_t weight_bytes = 0;       // weights its ops read, whole: resident on its worker
  int64_t decode_bytes_read = 0;  // weight bytes one decode token reads (ir::weight_bytes_read)
  int64_t prefill_flops = 0;      // FLOPs of a prefill step of PipelineModelCost::prefill_tokens
  int64_t kv_bytes_per_token = 0;

  PipelineLayerCost& operator+=(const PipelineLayerCost& other);
};

struct PipelineModelCost {
  std::vector<PipelineLayerCost> layers;
  PipelineLayerCost entry;  // before the first layer (embedding): the first stage's
  PipelineLayerCost exit;   // after the last layer (final norm, LM head): the last stage's
  int64_t hidden_bytes_per_token = 0;  // the residual stream crossing each cut
  int32_t prefill_tokens = 0;
};

// The costs of `model`'s layers with a KV cache of `kv_dtype` (f32 or f16), from its decode
// (one token) and prefill (`prefill_tokens` tokens) step graphs. Errors: an invalid shape or a
// non-positive prefill_tokens (kInvalidArgument).
Result<PipelineModelCost> llama_pipeline_cost(const model::LlamaShape& model, DType kv_dtype,
                                              int32_t prefill_tokens);

enum class PipelineBalance : uint8_t {
  kDecode,   // equal weight bytes read per decode token
  kPrefill,  // equal prefill FLOPs
};

std::string_view pipeline_balance_name(PipelineBalance balance);

// A worker as the plan sees it: a name for messages and its declared memory budget.
struct PipelineWorker {
  std::string name;
  std::optional<int64_t> memory_bytes;  // nullopt: no limit declared
};

struct PipelinePlanOptions {
  PipelineBalance balance = PipelineBalance::kDecode;
  int64_t kv_tokens = 0;  // KV tokens every stage holds (its layers' share of each token)
};

struct PipelineStagePlan {
  std::string worker;
  int64_t first_layer = 0;
  int64_t end_layer = 0;
  PipelineLayerCost cost;    // of its layers, with the entry or exit ops of the first or last
  int64_t kv_bytes = 0;      // cost.kv_bytes_per_token * kv_tokens
  int64_t memory_bytes = 0;  // cost.weight_bytes + kv_bytes
};

struct PipelinePlan {
  std::vector<PipelineStagePlan> stages;
  PipelineBalance balance = PipelineBalance::kDecode;
  int64_t kv_tokens = 0;
  int64_t hidden_bytes_per_token = 0;  // sent across each of the stages.size() - 1 cuts

  // The balanced quantity of a stage (decode bytes read or prefill FLOPs).
  int64_t stage_cost(const PipelineStagePlan& stage) const;
  // A table, one row per stage: worker, layers, weight bytes, KV bytes, memory, decode bytes
  // read per token, prefill FLOPs; then the bytes crossing each cut per token.
  std::string to_string() const;
};

// The balanced split of `cost`'s layers over `workers` (stage i on workers[i]). Errors
// (kInvalidArgument): no workers, or more workers than layers; (kResourceExhausted): no split
// fits, naming what the model needs and what the workers declare.
Result<PipelinePlan> plan_pipeline(const PipelineModelCost& cost,
                                   std::span<const PipelineWorker> workers,
                                   const PipelinePlanOptions& options);

}  // namespace folio::dist
