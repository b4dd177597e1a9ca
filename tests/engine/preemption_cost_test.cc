// The recompute-or-swap cost model: the prefill cost curve against hand-computed points, the
// choice on either side of the break-even, calibration from timed steps, the start-up copy
// bandwidth measurement, and the curve built from a real model's step graphs.
#include "folio/engine/preemption_cost.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "folio/ir/cost.h"
#include "folio/kv/block_copier.h"
#include "folio/model/llama_graph.h"
#include "testing/llama_shapes.h"

namespace folio::engine {
namespace {

RecomputeCostCurve curve_of(std::vector<RecomputeCostPoint> points) {
  return std::move(RecomputeCostCurve::create(std::move(points)).value());
}

TEST(RecomputeCostCurveTest, InterpolatesBetweenPointsAndExtendsTheEnds) {
  const RecomputeCostCurve curve =
      curve_of({{16, 160.0, 32.0}, {32, 400.0, 64.0}, {64, 1200.0, 100.0}});
  EXPECT_DOUBLE_EQ(curve.at(16).flops, 160.0);
  EXPECT_DOUBLE_EQ(curve.at(24).flops, 280.0);  // halfway between 160 and 400
  EXPECT_DOUBLE_EQ(curve.at(24).bytes, 48.0);
  EXPECT_DOUBLE_EQ(curve.at(48).flops, 800.0);
  EXPECT_DOUBLE_EQ(curve.at(8).flops, 80.0);     // proportional below the first point
  EXPECT_DOUBLE_EQ(curve.at(96).flops, 2000.0);  // last segment's slope, 25 per token
  EXPECT_DOUBLE_EQ(curve.at(96).bytes, 136.0);   // 100 + 32 * 36 / 32
  const RecomputeCostCurve single = curve_of({{10, 50.0, 5.0}});
  EXPECT_DOUBLE_EQ(single.at(40).flops, 200.0);
}

TEST(RecomputeCostCurveTest, RejectsBadPoints) {
  EXPECT_FALSE(RecomputeCostCurve::create({}).ok());
  EXPECT_FALSE(RecomputeCostCurve::create({{0, 1.0, 1.0}}).ok());
  EXPECT_FALSE(RecomputeCostCurve::create({{8, 1.0, 1.0}, {8, 2.0, 2.0}}).ok());
  EXPECT_FALSE(RecomputeCostCurve::create({{8, -1.0, 1.0}}).ok());
}

std::unique_ptr<PreemptionCostModel> model_with(double copy_rate, double memory_rate,
                                                double flop_rate, int64_t block_bytes = 1024) {
  PreemptionRates rates;
  rates.host_copy_bytes_per_second = copy_rate;
  rates.memory_bytes_per_second = memory_rate;
  rates.flops_per_second = flop_rate;
  // 1e6 FLOPs and 1e3 bytes per token.
  return std::move(
      PreemptionCostModel::create(curve_of({{1, 1e6, 1e3}}), block_bytes, rates).value());
}

TEST(PreemptionCostModelTest, SwapIsChosenWhereItIsCheaper) {
  // Fast copy, long context: 64 blocks of 1 KiB out and back at 10 GB/s is ~13 us; 1024 tokens
  // of 1e6 FLOPs at 1e11 FLOP/s is ~10 ms.
  const auto model = model_with(1e10, 1e10, 1e11);
  EXPECT_NEAR(model->swap_seconds(64), 2.0 * 64 * 1024 / 1e10, 1e-15);
  EXPECT_NEAR(model->recompute_seconds(1024), 1024 * 1e6 / 1e11, 1e-12);
  EXPECT_EQ(model->choose(64, 1024), PreemptionChoice::kSwap);
}

TEST(PreemptionCostModelTest, RecomputeIsChosenWhereItIsCheaper) {
  // Slow copy, short prefix: 1 block at 1 MB/s is ~2 ms; 8 tokens at 1e11 FLOP/s is 80 us.
  const auto slow_copy = model_with(1e6, 1e10, 1e11);
  EXPECT_EQ(slow_copy->choose(1, 8), PreemptionChoice::kRecompute);
  // The break-even moves with the context: the same slow copy loses to recompute at 8 tokens
  // and still loses for longer contexts of the same block count ratio, since both grow
  // linearly; a faster FLOP rate makes recompute cheaper still.
  EXPECT_EQ(slow_copy->choose(128, 1024), PreemptionChoice::kRecompute);
  const auto equal = model_with(1e6, 1e10, 1e11, /*block_bytes=*/1);
  // Exactly equal costs recompute (no swap space used): 2 * 50 B / 1e6 = 1e-4 s = 10 tokens.
  EXPECT_EQ(equal->choose(50, 10), PreemptionChoice::kRecompute);
  EXPECT_EQ(equal->choose(50, 11), PreemptionChoice::kSwap);
}

TEST(PreemptionCostModelTest, WithoutAFlopRateRecomputeIsItsBytesAlone) {
  const auto model = model_with(1e9, 1e9, 0.0);
  EXPECT_DOUBLE_EQ(model->recompute_seconds(100), 100 * 1e3 / 1e9);
  // With a FLOP rate, the roofline takes the larger term.
  model->observe_prefill_step(100, 0.5);  // 1e8 FLOPs in 0.5 s: 2e8 FLOP/s
  EXPECT_DOUBLE_EQ(model->rates().flops_per_second, 2e8);
  EXPECT_DOUBLE_EQ(model->recompute_seconds(100), 0.5);
  // Calibration keeps the best rate: a slower step does not lower it, a faster one raises it.
  model->observe_prefill_step(100, 1.0);
  EXPECT_DOUBLE_EQ(model->rates().flops_per_second, 2e8);
  model->observe_prefill_step(100, 0.25);
  EXPECT_DOUBLE_EQ(model->rates().flops_per_second, 4e8);
  model->observe_prefill_step(100, 0.0);  // ignored
  EXPECT_DOUBLE_EQ(model->rates().flops_per_second, 4e8);
}

TEST(PreemptionCostModelTest, RejectsBadRates) {
  PreemptionRates rates;
  EXPECT_FALSE(rates.validate().ok());
  rates.host_copy_bytes_per_second = 1;
  rates.memory_bytes_per_second = 1;
  EXPECT_TRUE(rates.validate().ok());
  rates.flops_per_second = -1;
  EXPECT_FALSE(rates.validate().ok());
  EXPECT_FALSE(
      PreemptionCostModel::create(curve_of({{1, 1, 1}}), 0, PreemptionRates{1, 1, 0}).ok());
}

// Returns an empty output after the steady clock has moved on (so the step took some time).
class TickingRunner final : public StepRunner {
 public:
  Result<ir::StepOutput> run(const ir::StepBatch& step) override {
    ++num_runs;
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() == start) {
    }
    (void)step;
    return ir::StepOutput{};
  }
  int32_t vocab_size() const override { return 16; }
  int num_runs = 0;
};

TEST(PreemptionCostModelTest, TheCalibratingRunnerTimesOnlyStepsWithPrefillTokens) {
  auto model = model_with(1e9, 1e9, 0.0);
  TickingRunner inner;
  CostCalibratingStepRunner runner(inner, *model);
  EXPECT_EQ(runner.vocab_size(), 16);
  const int32_t tokens[] = {1, 2, 3, 4};
  const int32_t seq_lens_decode[] = {10, 11, 12, 13};
  const int32_t seq_lens_prefill[] = {4};
  ir::StepBatch decode;
  decode.token_ids = tokens;
  decode.seq_lens = seq_lens_decode;
  ASSERT_TRUE(runner.run(decode).ok());
  EXPECT_EQ(model->rates().flops_per_second, 0.0) << "four decodes are no prefill";
  ir::StepBatch prefill;
  prefill.token_ids = tokens;
  prefill.seq_lens = seq_lens_prefill;
  ASSERT_TRUE(runner.run(prefill).ok());
  EXPECT_GT(model->rates().flops_per_second, 0.0);
  EXPECT_EQ(inner.num_runs, 2);
}

TEST(HostCopyBandwidthTest, MeasuresAPositiveFiniteRate) {
  const double rate = kv::measure_host_copy_bytes_per_second(int64_t{1} << 20, 2);
  EXPECT_GT(rate, 0.0);
  EXPECT_TRUE(std::isfinite(rate));
}

TEST(RecomputeCostCurveTest, FromStepGraphsSumsTheIrCostAnnotations) {
  // A small Llama's prefill graphs: the curve's points are exactly ir::total_cost of each.
  const model::LlamaShape shape = folio::testing::tiny_llama_shape();
  const ir::KvCacheGeometry geometry = model::llama_kv_cache_geometry(shape, 16, DType::kF32);
  auto prefill_graph = [&](int32_t num_tokens) {
    const int32_t num_blocks = (num_tokens + 15) / 16;
    const ir::KvCacheShape kv_cache{geometry, num_blocks + 1, num_blocks};
    return model::build_llama_step_graph(
        shape, ir::StepShape{num_tokens, 1, 1, ir::StepPhase::kPrefill}, kv_cache);
  };
  const int32_t counts[] = {16, 64, 256};
  Result<RecomputeCostCurve> curve = RecomputeCostCurve::from_step_graphs(prefill_graph, counts);
  ASSERT_TRUE(curve.ok()) << curve.status().to_string();
  ASSERT_EQ(curve->points().size(), 3u);
  for (size_t index = 0; index < 3; ++index) {
    const ir::CostHints total = ir::total_cost(prefill_graph(counts[index]).value()).total;
    EXPECT_EQ(curve->points()[index].num_tokens, counts[index]);
    EXPECT_DOUBLE_EQ(curve->points()[index].flops, static_cast<double>(total.flops));
    EXPECT_DOUBLE_EQ(curve->points()[index].bytes,
                     static_cast<double>(total.bytes_read + total.bytes_written));
  }
  // More tokens cost more, and attention makes the cost per token grow with the length.
  EXPECT_GT(curve->points()[1].flops, curve->points()[0].flops);
  EXPECT_GT(curve->points()[2].flops / 256, curve->points()[0].flops / 16);
}

}  // namespace
}  // namespace folio::engine
