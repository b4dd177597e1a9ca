#include "folio/dist/pipeline_plan.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "folio/ir/shape.h"
#include "folio/ir/step_graph.h"
#include "folio/model/llama_graph.h"

namespace folio::dist {
namespace {

constexpr int32_t kCostBlockSize = 16;

// Which part of the model an op belongs to: its layer, or the entry (-1) or exit (-2) ops.
constexpr int64_t kEntry = -1;
constexpr int64_t kExit = -2;

// The part of each op of `graph`, in program order: ops outside the layers before the first
// layered op are the entry, after it the exit.
std::vector<int64_t> op_parts(const ir::Graph& graph) {
  std::vector<int64_t> parts;
  bool seen_layer = false;
  for (const ir::Op& op : graph.ops()) {
    if (op.layer >= 0) {
      seen_layer = true;
      parts.push_back(op.layer);
    } else {
      parts.push_back(seen_layer ? kExit : kEntry);
    }
  }
  return parts;
}

PipelineLayerCost& part_of(PipelineModelCost& cost, int64_t part) {
  if (part == kEntry) return cost.entry;
  if (part == kExit) return cost.exit;
  return cost.layers[static_cast<size_t>(part)];
}

// Weights by (part, tensor): each counted once per part, at the most any op of the part reads.
using PartWeights = std::map<std::pair<int64_t, int32_t>, int64_t>;

void add_weights(const PartWeights& weights, PipelineModelCost& cost,
                 int64_t PipelineLayerCost::*field) {
  for (const auto& [key, bytes] : weights) part_of(cost, key.first).*field += bytes;
}

// The weights `graph`'s ops read per part: whole (`whole`) or as much as one run reads (an
// embedding table's gathered rows, as ir::weight_bytes_read counts them).
PartWeights weights_read(const ir::Graph& graph, bool whole) {
  const std::vector<int64_t> parts = op_parts(graph);
  PartWeights weights;
  for (const ir::Op& op : graph.ops()) {
    for (size_t position = 0; position < op.inputs.size(); ++position) {
      const ir::TensorInfo& tensor = graph.tensor(op.inputs[position]);
      if (tensor.residency != ir::Residency::kWeight) continue;
      int64_t bytes = tensor.bytes();
      if (!whole && op.kind == ir::OpKind::kEmbedding &&
          position == static_cast<size_t>(ir::embedding_input::kTable)) {
        const ir::TensorInfo& ids =
            graph.tensor(op.inputs[static_cast<size_t>(ir::embedding_input::kTokenIds)]);
        bytes = ir::storage_bytes(tensor.dtype, ir::Shape{ids.shape[0], tensor.shape[1]});
      }
      int64_t& most = weights[{parts[static_cast<size_t>(op.id.value())], tensor.id.value()}];
      most = std::max(most, bytes);
    }
  }
  return weights;
}

// GiB from 1 GiB up, MiB below.
std::string gib(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) {
    return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / double(int64_t{1} << 30));
  }
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / double(int64_t{1} << 20));
}

std::string mib(int64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / double(int64_t{1} << 20));
}

}  // namespace

PipelineLayerCost& PipelineLayerCost::operator+=(const PipelineLayerCost& other) {
  weight_bytes += other.weight_bytes;
  decode_bytes_read += other.decode_bytes_read;
  prefill_flops += other.prefill_flops;
  kv_bytes_per_token += other.kv_bytes_per_token;
  return *this;
}

Result<PipelineModelCost> llama_pipeline_cost(const model::LlamaShape& model, DType kv_dtype,
                                              int32_t prefill_tokens) {
  FOLIO_RETURN_IF_ERROR(model::validate_llama_shape(model));
  if (prefill_tokens <= 0) {
    return invalid_argument("the prefill step to cost must have tokens, got {}", prefill_tokens);
  }
  const int32_t blocks_per_sequence = (prefill_tokens + kCostBlockSize - 1) / kCostBlockSize;
  const ir::KvCacheShape kv_cache{model::llama_kv_cache_geometry(model, kCostBlockSize, kv_dtype),
                                  blocks_per_sequence + 1, blocks_per_sequence};
  FOLIO_ASSIGN_OR_RETURN(const ir::Graph decode,
                         model::build_llama_step_graph(
                             model, ir::StepShape{1, 1, 1, ir::StepPhase::kDecode}, kv_cache));
  FOLIO_ASSIGN_OR_RETURN(
      const ir::Graph prefill,
      model::build_llama_step_graph(
          model, ir::StepShape{prefill_tokens, 1, 1, ir::StepPhase::kPrefill}, kv_cache));
  PipelineModelCost cost;
  cost.layers.resize(static_cast<size_t>(model.num_layers));
  cost.prefill_tokens = prefill_tokens;
  add_weights(weights_read(decode, true), cost, &PipelineLayerCost::weight_bytes);
  add_weights(weights_read(decode, false), cost, &PipelineLayerCost::decode_bytes_read);
  const std::vector<int64_t> parts = op_parts(prefill);
  for (const ir::Op& op : prefill.ops()) {
    part_of(cost, parts[static_cast<size_t>(op.id.value())]).prefill_flops +=
        op.annotations.cost.flops;
  }
  const ir::KvCacheGeometry& geometry = kv_cache.geometry;
  for (PipelineLayerCost& layer : cost.layers) {
    layer.kv_bytes_per_token =
        int64_t{2} * geometry.num_kv_heads * geometry.head_dim * geometry.element_bytes();
  }
  // The step-graph contract: the residual stream between stages is f32 [T, hidden].
  cost.hidden_bytes_per_token = model.hidden_size * int64_t{sizeof(float)};
  return cost;
}

std::string_view pipeline_balance_name(PipelineBalance balance) {
  switch (balance) {
    case PipelineBalance::kDecode:
      return "decode";
    case PipelineBalance::kPrefill:
      return "prefill";
  }
  return "unknown";
}

int64_t PipelinePlan::stage_cost(const PipelineStagePlan& stage) const {
  switch (balance) {
    case PipelineBalance::kDecode:
      return stage.cost.decode_bytes_read;
    case PipelineBalance::kPrefill:
      return stage.cost.prefill_flops;
  }
  return 0;
}

std::string PipelinePlan::to_string() const {
  std::string out = fmt::format(
      "pipeline of {} stages, balanced by {} (KV for {} tokens per stage)\n"
      "{:<24} {:>9} {:>7} {:>12} {:>12} {:>12} {:>16} {:>16}\n",
      stages.size(), pipeline_balance_name(balance), kv_tokens, "worker", "layers", "count",
      "weights", "kv", "memory", "decode_read/tok", "prefill_gflop");
  for (const PipelineStagePlan& stage : stages) {
    out +=
        fmt::format("{:<24} {:>9} {:>7} {:>12} {:>12} {:>12} {:>16} {:>16.2f}\n", stage.worker,
                    fmt::format("{}-{}", stage.first_layer, stage.end_layer - 1),
                    stage.end_layer - stage.first_layer, mib(stage.cost.weight_bytes),
                    mib(stage.kv_bytes), mib(stage.memory_bytes), mib(stage.cost.decode_bytes_read),
                    static_cast<double>(stage.cost.prefill_flops) * 1e-9);
  }
  int64_t largest = 0, total = 0;
  for (const PipelineStagePlan& stage : stages) {
    largest = std::max(largest, stage_cost(stage));
    total += stage_cost(stage);
  }
  const double balance_ratio = total > 0 ? static_cast<double>(largest) *
                                               static_cast<double>(stages.size()) /
                                               static_cast<double>(total)
                                         : 1.0;
  out += fmt::format(
      "largest stage / mean stage ({}): {:.3f}\n"
      "activations crossing each of the {} cuts: {} bytes per token (f32 residual stream), "
      "{} bytes per token in all\n",
      pipeline_balance_name(balance), balance_ratio, stages.size() - 1, hidden_bytes_per_token,
      hidden_bytes_per_token * static_cast<int64_t>(stages.size() - 1));
  return out;
}

Result<PipelinePlan> plan_pipeline(const PipelineModelCost& cost,
                                   std::span<const PipelineWorker> workers,
                                   const PipelinePlanOptions& options) {
  const auto num_layers = static_cast<int64_t>(cost.layers.size());
  const auto num_workers = static_cast<int64_t>(workers.size());
  if (num_workers == 0) return invalid_argument("a pipeline needs at least one worker");
  if (num_workers > num_layers) {
    return invalid_argument(
        "{} workers but the model has {} layers: every stage needs at least one layer; use at "
        "most {} workers",
        num_workers, num_layers, num_layers);
  }
  if (options.kv_tokens < 0) {
    return invalid_argument("kv_tokens must be 0 or more, got {}", options.kv_tokens);
  }
  // prefix[j]: layers [0, j) summed.
  std::vector<PipelineLayerCost> prefix(static_cast<size_t>(num_layers) + 1);
  for (int64_t j = 0; j < num_layers; ++j) {
    prefix[static_cast<size_t>(j) + 1] = prefix[static_cast<size_t>(j)];
    prefix[static_cast<size_t>(j) + 1] += cost.layers[static_cast<size_t>(j)];
  }
  PipelinePlan plan;
  plan.balance = options.balance;
  plan.kv_tokens = options.kv_tokens;
  plan.hidden_bytes_per_token = cost.hidden_bytes_per_token;
  auto stage_of = [&](int64_t worker, int64_t first, int64_t end) {
    PipelineStagePlan stage;
    stage.worker = workers[static_cast<size_t>(worker)].name;
    stage.first_layer = first;
    stage.end_layer = end;
    const PipelineLayerCost& upper = prefix[static_cast<size_t>(end)];
    const PipelineLayerCost& lower = prefix[static_cast<size_t>(first)];
    stage.cost.weight_bytes = upper.weight_bytes - lower.weight_bytes;
    stage.cost.decode_bytes_read = upper.decode_bytes_read - lower.decode_bytes_read;
    stage.cost.prefill_flops = upper.prefill_flops - lower.prefill_flops;
    stage.cost.kv_bytes_per_token = upper.kv_bytes_per_token - lower.kv_bytes_per_token;
    if (first == 0) stage.cost += cost.entry;
    if (end == num_layers) stage.cost += cost.exit;
    stage.kv_bytes = stage.cost.kv_bytes_per_token * options.kv_tokens;
    stage.memory_bytes = stage.cost.weight_bytes + stage.kv_bytes;
    return stage;
  };
  auto fits = [&](const PipelineStagePlan& stage, int64_t worker) {
    const std::optional<int64_t>& memory = workers[static_cast<size_t>(worker)].memory_bytes;
    return !memory || stage.memory_bytes <= *memory;
  };

  // best[i][j]: the smallest largest stage cost of workers [0, i) running layers [0, j);
  // cut[i][j]: where worker i - 1's stage starts in that split.
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  const auto rows = static_cast<size_t>(num_workers) + 1;
  const auto columns = static_cast<size_t>(num_layers) + 1;
  std::vector<std::vector<int64_t>> best(rows, std::vector<int64_t>(columns, kNone));
  std::vector<std::vector<int64_t>> cut(rows, std::vector<int64_t>(columns, -1));
  best[0][0] = 0;
  for (int64_t i = 1; i <= num_workers; ++i) {
    for (int64_t j = i; j <= num_layers - (num_workers - i); ++j) {
      for (int64_t k = i - 1; k < j; ++k) {
        const int64_t before = best[static_cast<size_t>(i) - 1][static_cast<size_t>(k)];
        if (before == kNone) continue;
        const PipelineStagePlan stage = stage_of(i - 1, k, j);
        if (!fits(stage, i - 1)) continue;
        const int64_t largest = std::max(before, plan.stage_cost(stage));
        int64_t& current = best[static_cast<size_t>(i)][static_cast<size_t>(j)];
        if (largest < current) {
          current = largest;
          cut[static_cast<size_t>(i)][static_cast<size_t>(j)] = k;
        }
      }
    }
  }
  if (best[static_cast<size_t>(num_workers)][static_cast<size_t>(num_layers)] == kNone) {
    const PipelineStagePlan whole = stage_of(0, 0, num_layers);
    int64_t declared = 0;
    std::string budgets;
    for (const PipelineWorker& worker : workers) {
      declared += worker.memory_bytes.value_or(0);
      budgets += fmt::format("{}{} {}", budgets.empty() ? "" : ", ", worker.name,
                             worker.memory_bytes ? gib(*worker.memory_bytes) : "unlimited");
    }
    int64_t largest_layer = 0;
    for (const PipelineLayerCost& layer : cost.layers) {
      largest_layer = std::max(largest_layer,
                               layer.weight_bytes + layer.kv_bytes_per_token * options.kv_tokens);
    }
    return resource_exhausted(
        "the model does not fit {} workers in order: its weights ({}) and KV for {} tokens "
        "({}) need {} in all{}, and no split into contiguous layer ranges gives each worker a "
        "stage within its memory ({}); the first stage also holds the embedding ({}), the last "
        "the LM head ({}), the largest layer with its KV needs {}. Add workers or memory, or hold "
        "fewer KV tokens",
        num_workers, gib(whole.cost.weight_bytes), options.kv_tokens, gib(whole.kv_bytes),
        gib(whole.memory_bytes),
        declared > 0 ? fmt::format(" (the workers declare {})", gib(declared)) : std::string(),
        budgets, gib(cost.entry.weight_bytes), gib(cost.exit.weight_bytes), gib(largest_layer));
  }
  std::vector<PipelineStagePlan> reversed;
  int64_t end = num_layers;
  for (int64_t i = num_workers; i >= 1; --i) {
    const int64_t first = cut[static_cast<size_t>(i)][static_cast<size_t>(end)];
    reversed.push_back(stage_of(i - 1, first, end));
    end = first;
  }
  plan.stages.assign(reversed.rbegin(), reversed.rend());
  return plan;
}

}  // namespace folio::dist
