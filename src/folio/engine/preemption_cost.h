// PreemptionCost: what preempting a running sequence costs by recompute and by swap, so the
// scheduler can take the cheaper one per victim (PreemptionMode::kCheaper, scheduler.h). This
// is the first decision the IR's cost annotations (ir/cost.h) drive.
//
// Terms:
// - Swap cost: the victim's KV blocks moved out to the host swap space and back in,
//   2 * num_blocks * block_bytes / host_copy_bytes_per_second. The bandwidth is measured at
//   start-up (kv::measure_host_copy_bytes_per_second: the memcpy the host copier does).
// - Recompute cost: prefilling the victim's context again. Its IR cost (FLOPs, bytes read and
//   written) comes from RecomputeCostCurve: the model's prefill step graph of one sequence of T
//   tokens, summed by ir::total_cost, at a few T, linear between them. Seconds are the roofline
//   max(flops / flops_per_second, bytes / memory_bytes_per_second).
// - Rates (PreemptionRates): memory_bytes_per_second is the measured copy bandwidth times two
//   (a copy reads and writes each byte). flops_per_second is calibrated from the engine's own
//   executed prefill steps (CostCalibratingStepRunner): the best IR FLOPs per second any step
//   with prefill tokens reached (best, as the copy bandwidth is the best of its runs, so both
//   sides are compared at their best). Until such a step has run it is 0, unknown, and the
//   recompute cost is its bytes term alone: a lower bound, leaning to recompute, which needs no
//   swap space. Tests inject rates.
// - Left out: prefix-cache hits a recompute may find (its full blocks stay CACHED, but others
//   may reuse them first), other work sharing a prefill step's weight reads, and copies
//   overlapping compute.
//
// Thread-safety: not thread-safe; the engine's thread reads (the scheduler) and calibrates (the
// runner it drives).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "folio/base/result.h"
#include "folio/engine/step_runner.h"
#include "folio/ir/graph.h"

namespace folio::engine {

// The IR cost of prefilling one sequence of num_tokens tokens alone.
struct RecomputeCostPoint {
  int32_t num_tokens = 0;
  double flops = 0;
  double bytes = 0;  // read and written
};

// Piecewise-linear IR cost of a prefill by its token count. Immutable.
class RecomputeCostCurve {
 public:
  // Errors: no points, token counts not positive and strictly increasing, negative costs.
  static Result<RecomputeCostCurve> create(std::vector<RecomputeCostPoint> points);
  // One point per token count, each from the cost annotations of `prefill_graph(T)` (a step
  // graph of one sequence prefilling T tokens). Errors: the builder's, or bad token counts.
  static Result<RecomputeCostCurve> from_step_graphs(
      const std::function<Result<ir::Graph>(int32_t num_tokens)>& prefill_graph,
      std::span<const int32_t> token_counts);

  // Linear between points; below the first, proportional to it; above the last, the last
  // segment extended (the first point alone: proportional).
  RecomputeCostPoint at(int32_t num_tokens) const;
  std::span<const RecomputeCostPoint> points() const { return points_; }

 private:
  explicit RecomputeCostCurve(std::vector<RecomputeCostPoint> points)
      : points_(std::move(points)) {}
  std::vector<RecomputeCostPoint> points_;
};

struct PreemptionRates {
  double host_copy_bytes_per_second = 0;  // > 0: KV bytes moved to or from the swap space
  double memory_bytes_per_second = 0;     // > 0: IR bytes a step reads and writes
  double flops_per_second = 0;            // >= 0: IR FLOPs; 0 while unknown

  Status validate() const;
};

enum class PreemptionChoice : uint8_t { kRecompute, kSwap };
std::string_view preemption_choice_name(PreemptionChoice choice);

// Invariants: rates valid; flops_per_second only grows (calibration keeps the best).
class PreemptionCostModel {
 public:
  // Errors: invalid rates, block_bytes < 1.
  static Result<std::unique_ptr<PreemptionCostModel>> create(RecomputeCostCurve curve,
                                                             int64_t block_bytes,
                                                             const PreemptionRates& rates);

  // Seconds to move num_blocks out to the host and back in.
  double swap_seconds(int64_t num_blocks) const;
  // Seconds to prefill num_tokens again.
  double recompute_seconds(int32_t num_tokens) const;
  // The cheaper for a victim holding num_blocks for num_tokens; a tie recomputes (no swap
  // space used).
  PreemptionChoice choose(int64_t num_blocks, int32_t num_tokens) const;

  // Calibration: a step of num_tokens query tokens with prefill work took `seconds`; its IR
  // FLOPs are taken as a prefill of num_tokens (the curve's). Ignores seconds <= 0.
  void observe_prefill_step(int32_t num_tokens, double seconds);

  const PreemptionRates& rates() const { return rates_; }
  const RecomputeCostCurve& curve() const { return curve_; }
  int64_t block_bytes() const { return block_bytes_; }

 private:
  PreemptionCostModel(RecomputeCostCurve curve, int64_t block_bytes, const PreemptionRates& rates)
      : curve_(std::move(curve)), block_bytes_(block_bytes), rates_(rates) {}
  RecomputeCostCurve curve_;
  int64_t block_bytes_;
  PreemptionRates rates_;
};

// A StepRunner that forwards to another and times each step with prefill tokens (more query
// tokens than sequences) into a PreemptionCostModel's calibration. Both must outlive it.
// Thread-safety: as the runner it wraps (run() from the engine's thread).
class CostCalibratingStepRunner final : public StepRunner {
 public:
  CostCalibratingStepRunner(StepRunner& runner, PreemptionCostModel& cost)
      : runner_(runner), cost_(cost) {}

  Result<ir::StepOutput> run(const ir::StepBatch& step) override;
  Status copy_blocks(std::span<const kv::BlockCopy> copies) override {
    return runner_.copy_blocks(copies);
  }
  int32_t vocab_size() const override { return runner_.vocab_size(); }
  int32_t max_logit_rows() const override { return runner_.max_logit_rows(); }
  bool supports_adapter(int64_t adapter_id) const override {
    return runner_.supports_adapter(adapter_id);
  }

 private:
  StepRunner& runner_;
  PreemptionCostModel& cost_;
};

}  // namespace folio::engine
