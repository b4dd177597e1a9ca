// Tensor-parallel placement (issue 15, slice 4): a model's matrices split over N workers, every
// worker running every layer on its share of the heads and FFN features (model/
// llama_tensor_split.h), and the plan as a user reads it: which heads and features go where, the
// bytes each worker holds, and what crosses the wire per token.
//
// - Costs come from each rank's own step graphs (ir/cost.h), as the pipeline plan's do: the
//   weights the rank's graph reads (its slices plus every replicated tensor: embedding, norms,
//   LM head), the weight bytes one decode token reads (ir::weight_bytes_read), and its KV bytes
//   per token (its KV heads only).
// - Communication: one all_reduce_sum of the f32 residual-stream width per row-split projection,
//   two per layer, per step token. A ring all-reduce over n members sends 2 (n - 1) / n of the
//   reduced bytes from each member (reduce-scatter, then all-gather) in 2 (n - 1) messages.
// - choose_placement compares it with the pipeline plan by a cost model of one decode token:
//   weight bytes streamed at the memory bandwidth, plus messages at the link's latency and bytes
//   at its bandwidth; the plan says which it chose and why.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "folio/base/result.h"
#include "folio/dist/pipeline_plan.h"
#include "folio/model/llama_model_file.h"
#include "folio/tensor/dtype.h"

namespace folio::dist {

struct TensorParallelPlanOptions {
  DType kv_dtype = DType::kF16;
  int64_t kv_tokens = 0;  // KV tokens every rank holds (its KV heads of each)
};

struct TensorParallelRankPlan {
  std::string worker;
  int64_t rank = 0;
  // The rank's heads [first_head, end_head), KV heads and FFN features.
  int64_t first_head = 0, end_head = 0;
  int64_t first_kv_head = 0, end_kv_head = 0;
  int64_t first_ffn = 0, end_ffn = 0;
  int64_t weight_bytes = 0;        // what its graphs read, each tensor whole
  int64_t split_weight_bytes = 0;  // of which its slices (the rest is replicated)
  int64_t decode_bytes_read = 0;   // weight bytes one decode token reads
  int64_t kv_bytes_per_token = 0;
  int64_t kv_bytes = 0;      // kv_bytes_per_token * kv_tokens
  int64_t memory_bytes = 0;  // weight_bytes + kv_bytes
};

struct TensorParallelPlan {
  std::vector<TensorParallelRankPlan> ranks;
  int64_t num_layers = 0;
  int64_t kv_tokens = 0;
  int64_t all_reduces_per_step = 0;      // 2 per layer
  int64_t reduced_bytes_per_token = 0;   // f32 hidden per all_reduce, summed over the step's
  int64_t wire_bytes_per_token = 0;      // each rank sends: 2 (n - 1) / n of reduced bytes
  int64_t messages_per_all_reduce = 0;   // 2 (n - 1) for a ring
  int64_t whole_model_weight_bytes = 0;  // one process's, for comparison

  // A table, one row per rank (worker, heads, KV heads, FFN features, weights, of which split,
  // KV, memory, decode bytes read per token), then the communication per token.
  std::string to_string() const;
};

// The tensor-parallel plan of `model` over `workers` (rank r on workers[r]). Errors
// (kInvalidArgument): no workers, or an illegal split (model::validate_llama_tensor_split's
// message, naming the worker counts that would split the model); (kResourceExhausted): a rank
// over its worker's declared memory, naming the rank's bytes and the budget.
Result<TensorParallelPlan> plan_tensor_parallel(const model::LlamaShape& model,
                                                std::span<const PipelineWorker> workers,
                                                const TensorParallelPlanOptions& options);

enum class Placement : uint8_t { kPipeline, kTensor, kAuto };
std::string_view placement_name(Placement placement);
// "pp", "tp" or "auto"; kInvalidArgument naming the valid ones otherwise.
Result<Placement> parse_placement(std::string_view name);

// What the cost model knows of the machines: the workers' memory read bandwidth (weights
// streamed per decode token) and one link between workers, as measured when they joined.
struct PlacementCostModel {
  double memory_bytes_per_second = 10e9;
  double link_latency_seconds = 100e-6;  // one message, one way
  double link_bytes_per_second = 1e9;
};

struct PlacementChoice {
  Placement placement = Placement::kPipeline;
  // The cost model's time of one decode token under each (nullopt: the placement is illegal or
  // does not fit), and the reason in words.
  std::optional<double> pipeline_seconds_per_token;
  std::optional<double> tensor_seconds_per_token;
  std::string reason;
};

// Chooses between a pipeline plan and a tensor plan (either may be an error: the other wins) by
// the decode-token time of the cost model: a pipeline runs its stages one after another (the sum
// of the stages' weight streaming, a request and a reply per stage, the residual stream over
// each cut), the tensor ranks at once (the slowest rank's streaming, one request and reply, and
// each all-reduce's ring messages and bytes). Messages cost the link's latency each; what is
// common to both (the step's arrays, the logits) is left out. kInvalidArgument when
// neither plan is usable, quoting both errors.
Result<PlacementChoice> choose_placement(const Result<PipelinePlan>& pipeline,
                                         const Result<TensorParallelPlan>& tensor,
                                         const PlacementCostModel& cost);

}  // namespace folio::dist
