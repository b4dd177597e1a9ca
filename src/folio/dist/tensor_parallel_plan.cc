#include "folio/dist/tensor_parallel_plan.h"

#include <algorithm>

#include <fmt/format.h>

#include "folio/ir/cost.h"
#include "folio/ir/step_graph.h"
#include "folio/model/llama_graph.h"
#include "folio/model/llama_tensor_split.h"

namespace folio::dist {
namespace {

std::string mib(int64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / double(int64_t{1} << 20));
}

std::string range(int64_t first, int64_t end) {
  return fmt::format("{}-{}", first, end - 1);
}

// The rank's decode graph (one token), whose weights and costs the plan counts.
Result<ir::Graph> rank_decode_graph(const model::LlamaShape& model,
                                    const model::LlamaTensorSplit& split, DType kv_dtype) {
  model::LlamaGraphOptions options;
  options.tensor_split = split;
  const ir::KvCacheShape kv_cache{
      model::llama_stage_kv_cache_geometry(model, model.num_layers, 16, kv_dtype, split), 2, 1};
  return model::build_llama_step_graph(model, ir::StepShape{1, 1, 1, ir::StepPhase::kDecode},
                                       kv_cache, options);
}

std::string seconds_text(const std::optional<double>& seconds) {
  return seconds ? fmt::format("{:.3f} ms", *seconds * 1e3) : std::string("not possible");
}

}  // namespace

std::string TensorParallelPlan::to_string() const {
  std::string out = fmt::format(
      "tensor parallel over {} ranks: every rank runs all {} layers on its share of the heads "
      "and FFN features (KV for {} tokens per rank)\n"
      "{:<24} {:>5} {:>7} {:>8} {:>9} {:>12} {:>12} {:>12} {:>12} {:>16}\n",
      ranks.size(), num_layers, kv_tokens, "worker", "rank", "heads", "kv_heads", "ffn", "weights",
      "of_which_split", "kv", "memory", "decode_read/tok");
  for (const TensorParallelRankPlan& rank : ranks) {
    out += fmt::format("{:<24} {:>5} {:>7} {:>8} {:>9} {:>12} {:>12} {:>12} {:>12} {:>16}\n",
                       rank.worker, rank.rank, range(rank.first_head, rank.end_head),
                       range(rank.first_kv_head, rank.end_kv_head),
                       range(rank.first_ffn, rank.end_ffn), mib(rank.weight_bytes),
                       mib(rank.split_weight_bytes), mib(rank.kv_bytes), mib(rank.memory_bytes),
                       mib(rank.decode_bytes_read));
  }
  out += fmt::format(
      "replicated on every rank: embedding, norms, LM head ({}); rank 0 returns the logits\n"
      "one process would hold {} of weights\n"
      "communication per token: {} all-reduces (after attn_output and ffn_down of each layer) "
      "of {} bytes in all; each rank sends {} bytes per token in {} messages per all-reduce "
      "(ring)\n",
      ranks.empty() ? std::string("-")
                    : mib(ranks.front().weight_bytes - ranks.front().split_weight_bytes),
      mib(whole_model_weight_bytes), all_reduces_per_step, reduced_bytes_per_token,
      wire_bytes_per_token, messages_per_all_reduce);
  return out;
}

Result<TensorParallelPlan> plan_tensor_parallel(const model::LlamaShape& model,
                                                std::span<const PipelineWorker> workers,
                                                const TensorParallelPlanOptions& options) {
  FOLIO_RETURN_IF_ERROR(model::validate_llama_shape(model));
  const auto num_ranks = static_cast<int64_t>(workers.size());
  if (num_ranks == 0) return invalid_argument("tensor parallelism needs at least one worker");
  if (options.kv_tokens < 0) {
    return invalid_argument("kv_tokens must be 0 or more, got {}", options.kv_tokens);
  }
  FOLIO_RETURN_IF_ERROR(model::validate_llama_tensor_split(model, {0, num_ranks}));
  TensorParallelPlan plan;
  plan.num_layers = model.num_layers;
  plan.kv_tokens = options.kv_tokens;
  FOLIO_ASSIGN_OR_RETURN(const ir::Graph whole, rank_decode_graph(model, {}, options.kv_dtype));
  for (const ir::TensorInfo& tensor : whole.tensors()) {
    if (tensor.residency == ir::Residency::kWeight) plan.whole_model_weight_bytes += tensor.bytes();
  }
  for (int64_t r = 0; r < num_ranks; ++r) {
    const model::LlamaTensorSplit split{r, num_ranks};
    FOLIO_ASSIGN_OR_RETURN(const ir::Graph graph,
                           rank_decode_graph(model, split, options.kv_dtype));
    TensorParallelRankPlan rank;
    rank.worker = workers[static_cast<size_t>(r)].name;
    rank.rank = r;
    rank.first_head = split.first(model.num_heads);
    rank.end_head = rank.first_head + split.part(model.num_heads);
    rank.first_kv_head = split.first(model.num_kv_heads);
    rank.end_kv_head = rank.first_kv_head + split.part(model.num_kv_heads);
    rank.first_ffn = split.first(model.ffn_size);
    rank.end_ffn = rank.first_ffn + split.part(model.ffn_size);
    int64_t all_reduces = 0;
    for (const ir::TensorInfo& tensor : graph.tensors()) {
      if (tensor.residency != ir::Residency::kWeight) continue;
      rank.weight_bytes += tensor.bytes();
      if (model::llama_split_axis(tensor.name) != model::LlamaSplitAxis::kReplicated) {
        rank.split_weight_bytes += tensor.bytes();
      }
    }
    for (const ir::Op& op : graph.ops()) {
      if (op.kind == ir::OpKind::kAllReduceSum) ++all_reduces;
    }
    rank.decode_bytes_read = ir::weight_bytes_read(graph);
    const ir::KvCacheGeometry geometry =
        model::llama_stage_kv_cache_geometry(model, model.num_layers, 16, options.kv_dtype, split);
    rank.kv_bytes_per_token = int64_t{2} * geometry.num_layers * geometry.num_kv_heads *
                              geometry.head_dim * geometry.element_bytes();
    rank.kv_bytes = rank.kv_bytes_per_token * options.kv_tokens;
    rank.memory_bytes = rank.weight_bytes + rank.kv_bytes;
    const std::optional<int64_t>& budget = workers[static_cast<size_t>(r)].memory_bytes;
    if (budget && rank.memory_bytes > *budget) {
      return resource_exhausted(
          "tensor rank {} of {} needs {} bytes ({} of weights, {} replicated, and {} of KV for {} "
          "tokens) but worker {} declares {}: add workers (if the heads divide), give it more "
          "memory, or use fewer KV tokens",
          r, num_ranks, rank.memory_bytes, rank.weight_bytes,
          rank.weight_bytes - rank.split_weight_bytes, rank.kv_bytes, options.kv_tokens,
          rank.worker, *budget);
    }
    plan.all_reduces_per_step = all_reduces;
    plan.ranks.push_back(std::move(rank));
  }
  plan.reduced_bytes_per_token =
      plan.all_reduces_per_step * model.hidden_size * int64_t{sizeof(float)};
  plan.wire_bytes_per_token = plan.reduced_bytes_per_token * 2 * (num_ranks - 1) / num_ranks;
  plan.messages_per_all_reduce = 2 * (num_ranks - 1);
  return plan;
}

std::string_view placement_name(Placement placement) {
  switch (placement) {
    case Placement::kPipeline:
      return "pp";
    case Placement::kTensor:
      return "tp";
    case Placement::kAuto:
      return "auto";
  }
  return "unknown";
}

Result<Placement> parse_placement(std::string_view name) {
  for (Placement placement : {Placement::kPipeline, Placement::kTensor, Placement::kAuto}) {
    if (name == placement_name(placement)) return placement;
  }
  return invalid_argument("--placement must be pp, tp or auto, got '{}'", name);
}

Result<PlacementChoice> choose_placement(const Result<PipelinePlan>& pipeline,
                                         const Result<TensorParallelPlan>& tensor,
                                         const PlacementCostModel& cost) {
  if (!pipeline.ok() && !tensor.ok()) {
    return invalid_argument("neither placement is possible: pipeline: {}; tensor: {}",
                            pipeline.status().message(), tensor.status().message());
  }
  PlacementChoice choice;
  std::string pipeline_terms, tensor_terms;
  if (pipeline.ok()) {
    int64_t streamed = 0;
    for (const PipelineStagePlan& stage : pipeline->stages)
      streamed += stage.cost.decode_bytes_read;
    // The coordinator relays the step through the stages: a request and a reply per stage, one
    // after another, the residual stream crossing each cut.
    const auto stages = static_cast<double>(pipeline->stages.size());
    const double messages = 2 * stages;
    const double seconds = static_cast<double>(streamed) / cost.memory_bytes_per_second +
                           messages * cost.link_latency_seconds +
                           (stages - 1) * 2 *
                               static_cast<double>(pipeline->hidden_bytes_per_token) /
                               cost.link_bytes_per_second;
    choice.pipeline_seconds_per_token = seconds;
    pipeline_terms =
        fmt::format("{} streamed stage after stage + {:.0f} messages", mib(streamed), messages);
  }
  if (tensor.ok()) {
    int64_t slowest = 0;
    for (const TensorParallelRankPlan& rank : tensor->ranks) {
      slowest = std::max(slowest, rank.decode_bytes_read);
    }
    // A request and a reply to every rank at once, then each all-reduce's ring messages.
    const double messages =
        2 + static_cast<double>(tensor->all_reduces_per_step * tensor->messages_per_all_reduce);
    const double seconds =
        static_cast<double>(slowest) / cost.memory_bytes_per_second +
        messages * cost.link_latency_seconds +
        static_cast<double>(tensor->wire_bytes_per_token) / cost.link_bytes_per_second;
    choice.tensor_seconds_per_token = seconds;
    tensor_terms =
        fmt::format("{} streamed per rank at once + {:.0f} messages", mib(slowest), messages);
  }
  const std::string model_text = fmt::format(
      "memory {:.1f} GB/s, link {:.0f} us and {:.2f} GB/s", cost.memory_bytes_per_second * 1e-9,
      cost.link_latency_seconds * 1e6, cost.link_bytes_per_second * 1e-9);
  if (!tensor.ok()) {
    choice.placement = Placement::kPipeline;
    choice.reason =
        fmt::format("pipeline: tensor parallelism is not possible ({})", tensor.status().message());
  } else if (!pipeline.ok()) {
    choice.placement = Placement::kTensor;
    choice.reason =
        fmt::format("tensor: a pipeline is not possible ({})", pipeline.status().message());
  } else {
    const bool tensor_wins = *choice.tensor_seconds_per_token < *choice.pipeline_seconds_per_token;
    choice.placement = tensor_wins ? Placement::kTensor : Placement::kPipeline;
    choice.reason = fmt::format(
        "{}: a decode token would take {} with tensor parallelism ({}) against {} with a "
        "pipeline ({}), at {}",
        tensor_wins ? "tensor" : "pipeline", seconds_text(choice.tensor_seconds_per_token),
        tensor_terms, seconds_text(choice.pipeline_seconds_per_token), pipeline_terms, model_text);
  }
  return choice;
}

}  // namespace folio::dist
