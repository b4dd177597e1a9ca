#include "folio/engine/preemption_cost.h"

#include <algorithm>
#include <cmath>

#include "folio/base/check.h"
#include "folio/ir/cost.h"

namespace folio::engine {

Result<RecomputeCostCurve> RecomputeCostCurve::create(std::vector<RecomputeCostPoint> points) {
  if (points.empty()) return invalid_argument("a recompute cost curve needs at least one point");
  for (size_t index = 0; index < points.size(); ++index) {
    const RecomputeCostPoint& point = points[index];
    if (point.num_tokens < 1 || (index > 0 && point.num_tokens <= points[index - 1].num_tokens)) {
      return invalid_argument(
          "recompute cost points must have positive, strictly increasing token counts (point {} "
          "has {})",
          index, point.num_tokens);
    }
    if (!(point.flops >= 0) || !(point.bytes >= 0)) {
      return invalid_argument("recompute cost point {} has a negative cost", index);
    }
  }
  return RecomputeCostCurve(std::move(points));
}

Result<RecomputeCostCurve> RecomputeCostCurve::from_step_graphs(
    const std::function<Result<ir::Graph>(int32_t num_tokens)>& prefill_graph,
    std::span<const int32_t> token_counts) {
  std::vector<RecomputeCostPoint> points;
  points.reserve(token_counts.size());
  for (int32_t num_tokens : token_counts) {
    if (num_tokens < 1) {
      return invalid_argument("a prefill graph needs at least one token, got {}", num_tokens);
    }
    FOLIO_ASSIGN_OR_RETURN(const ir::Graph graph, prefill_graph(num_tokens));
    const ir::CostHints total = ir::total_cost(graph).total;
    points.push_back(RecomputeCostPoint{
        num_tokens, static_cast<double>(total.flops),
        static_cast<double>(total.bytes_read) + static_cast<double>(total.bytes_written)});
  }
  return create(std::move(points));
}

RecomputeCostPoint RecomputeCostCurve::at(int32_t num_tokens) const {
  const RecomputeCostPoint& first = points_.front();
  auto scaled = [&](const RecomputeCostPoint& point, double factor) {
    return RecomputeCostPoint{num_tokens, point.flops * factor, point.bytes * factor};
  };
  if (points_.size() == 1 || num_tokens <= first.num_tokens) {
    return scaled(first, static_cast<double>(num_tokens) / first.num_tokens);
  }
  // The segment [left, right] holding num_tokens, or the last one extended.
  size_t right = 1;
  while (right + 1 < points_.size() && points_[right].num_tokens < num_tokens) ++right;
  const RecomputeCostPoint& low = points_[right - 1];
  const RecomputeCostPoint& high = points_[right];
  const double fraction = static_cast<double>(num_tokens - low.num_tokens) /
                          static_cast<double>(high.num_tokens - low.num_tokens);
  return RecomputeCostPoint{num_tokens, low.flops + fraction * (high.flops - low.flops),
                            low.bytes + fraction * (high.bytes - low.bytes)};
}

Status PreemptionRates::validate() const {
  if (!(host_copy_bytes_per_second > 0) || !std::isfinite(host_copy_bytes_per_second)) {
    return invalid_argument("host copy bandwidth must be positive, got {} B/s",
                            host_copy_bytes_per_second);
  }
  if (!(memory_bytes_per_second > 0) || !std::isfinite(memory_bytes_per_second)) {
    return invalid_argument("memory bandwidth must be positive, got {} B/s",
                            memory_bytes_per_second);
  }
  if (!(flops_per_second >= 0) || !std::isfinite(flops_per_second)) {
    return invalid_argument("FLOP rate must be 0 (unknown) or positive, got {}", flops_per_second);
  }
  return Status();
}

std::string_view preemption_choice_name(PreemptionChoice choice) {
  switch (choice) {
    case PreemptionChoice::kRecompute:
      return "recompute";
    case PreemptionChoice::kSwap:
      return "swap";
  }
  FOLIO_UNREACHABLE("bad PreemptionChoice");
}

Result<std::unique_ptr<PreemptionCostModel>> PreemptionCostModel::create(
    RecomputeCostCurve curve, int64_t block_bytes, const PreemptionRates& rates) {
  FOLIO_RETURN_IF_ERROR(rates.validate());
  if (block_bytes < 1) return invalid_argument("block bytes must be positive, got {}", block_bytes);
  return std::unique_ptr<PreemptionCostModel>(
      new PreemptionCostModel(std::move(curve), block_bytes, rates));
}

double PreemptionCostModel::swap_seconds(int64_t num_blocks) const {
  // Out now, back in later: each byte is copied twice.
  return 2.0 * static_cast<double>(num_blocks) * static_cast<double>(block_bytes_) /
         rates_.host_copy_bytes_per_second;
}

double PreemptionCostModel::recompute_seconds(int32_t num_tokens) const {
  const RecomputeCostPoint cost = curve_.at(num_tokens);
  const double memory_seconds = cost.bytes / rates_.memory_bytes_per_second;
  if (rates_.flops_per_second <= 0) return memory_seconds;
  return std::max(memory_seconds, cost.flops / rates_.flops_per_second);
}

PreemptionChoice PreemptionCostModel::choose(int64_t num_blocks, int32_t num_tokens) const {
  return swap_seconds(num_blocks) < recompute_seconds(num_tokens) ? PreemptionChoice::kSwap
                                                                  : PreemptionChoice::kRecompute;
}

void PreemptionCostModel::observe_prefill_step(int32_t num_tokens, double seconds) {
  if (!(seconds > 0) || num_tokens < 1) return;
  rates_.flops_per_second =
      std::max(rates_.flops_per_second, curve_.at(num_tokens).flops / seconds);
}

Result<ir::StepOutput> CostCalibratingStepRunner::run(const ir::StepBatch& step) {
  // Decode-only steps (one token per sequence) are not prefills: their cost is not the curve's.
  const bool has_prefill = step.num_tokens() > step.num_sequences();
  const auto start = std::chrono::steady_clock::now();
  Result<ir::StepOutput> output = runner_.run(step);
  if (has_prefill && output.ok()) {
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    cost_.observe_prefill_step(step.num_tokens(), elapsed.count());
  }
  return output;
}

}  // namespace folio::engine
