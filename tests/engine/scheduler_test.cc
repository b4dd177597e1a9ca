// Scheduler policy, driven directly over a real block manager with hand-made sequences: step
// composition, budgets, chunking, whole-context admission, no head-of-line blocking, aging and
// starvation, victim choice, preemption modes and limits.
#include "folio/engine/scheduler.h"

#include <gtest/gtest.h>

#include <deque>

#include "folio/kv/block_copier.h"
#include "folio/kv/fixed_page_source.h"
#include "folio/kv/host_swap_space.h"
#include "scheduler_test_util.h"

namespace folio::engine {
namespace {

constexpr int32_t kBlockSize = 8;

class SchedulerTest : public ::testing::Test {
 protected:
  // num_blocks usable blocks (one more is the dummy), no watermark unless given.
  void build(int32_t num_blocks, SchedulerOptions options, int32_t swap_blocks = 0,
             double watermark = 0.0) {
    kv::BlockManagerOptions kv_options;
    kv_options.geometry = {kBlockSize, 1, 1, 4, DType::kF32};
    kv_options.max_context_tokens = 256;
    kv_options.watermark = watermark;
    const int64_t block_bytes = kv_options.geometry.block_bytes();
    source_ = std::make_unique<kv::FixedPageSource>(block_bytes, num_blocks + 1);
    if (swap_blocks > 0) swap_ = std::make_unique<kv::HostSwapSpace>(block_bytes, swap_blocks);
    manager_ =
        std::move(kv::BlockManager::create(kv_options, *source_, copier_, swap_.get()).value());
    scheduler_ = std::move(Scheduler::create(options, *manager_, swap_ != nullptr).value());
  }

  // Distinct sequences get distinct tokens (no prefix sharing) unless first_token says otherwise.
  Sequence* add(int32_t prompt_length, int32_t priority = 0, int32_t first_token = -1) {
    const int64_t id = static_cast<int64_t>(sequences_.size()) + 1;
    sequences_.push_back(testing::make_sequence(id, prompt_length, clock_.now(), first_token));
    sequences_.back()->priority = priority;
    scheduler_->add(sequences_.back().get());
    return sequences_.back().get();
  }

  // One step: schedule, "run" (complete), give every logits row the token 7.
  StepPlan step() { return testing::run_step(*scheduler_, *manager_, clock_.now()); }

  static std::vector<int64_t> ids(const StepPlan& plan) {
    std::vector<int64_t> result;
    for (const ScheduledSegment& segment : plan.segments) {
      result.push_back(segment.sequence->request.value());
    }
    return result;
  }

  ManualClock clock_;
  std::unique_ptr<kv::FixedPageSource> source_;
  kv::HostKvBlockCopier copier_;
  std::unique_ptr<kv::HostSwapSpace> swap_;
  std::unique_ptr<kv::BlockManager> manager_;
  std::unique_ptr<Scheduler> scheduler_;
  std::deque<std::unique_ptr<Sequence>> sequences_;
};

TEST_F(SchedulerTest, DecodesComeFirstThenPrefillChunksUnderTheBudget) {
  SchedulerOptions options;
  options.max_num_batched_tokens = 20;
  options.max_num_sequences = 8;
  options.prefill_chunk_size = 12;
  build(64, options);
  Sequence* short_prompt = add(5, /*priority=*/0);
  Sequence* long_prompt = add(30, /*priority=*/1);
  StepPlan first = step();
  // Priority order: the long one's first chunk (12), then 5 of... the budget left is 8: all 5.
  EXPECT_EQ(ids(first), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(first.segments[0].num_tokens, 12);
  EXPECT_FALSE(first.segments[0].wants_logits);
  EXPECT_EQ(first.segments[1].num_tokens, 5);
  EXPECT_TRUE(first.segments[1].wants_logits);
  StepPlan second = step();
  // The short one decodes first; the long one's next chunk takes 12 of the 19 left.
  ASSERT_EQ(ids(second), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(second.segments[0].is_decode);
  EXPECT_EQ(second.segments[0].first_position, 5);
  EXPECT_EQ(second.segments[1].first_position, 12);
  EXPECT_EQ(second.segments[1].num_tokens, 12);
  StepPlan third = step();
  EXPECT_EQ(third.segments[1].num_tokens, 6);
  EXPECT_TRUE(third.segments[1].wants_logits);
  for (const StepPlan* plan : {&first, &second, &third}) {
    EXPECT_LE(plan->num_tokens, options.max_num_batched_tokens);
  }
  EXPECT_EQ(long_prompt->num_computed, 30);
  EXPECT_EQ(short_prompt->num_generated(), 3);
}

TEST_F(SchedulerTest, WithoutChunkingAPrefillRunsWholeWhenItFitsOrAlone) {
  SchedulerOptions options;
  options.chunked_prefill = false;
  options.max_num_batched_tokens = 16;
  options.max_num_sequences = 4;
  build(64, options);
  add(10, 0, /*first_token=*/100);
  add(10, 0, /*first_token=*/200);
  add(40, 0, /*first_token=*/300);
  StepPlan first = step();
  EXPECT_EQ(ids(first), (std::vector<int64_t>{1}));  // the second does not fit the 6 left
  StepPlan second = step();
  EXPECT_EQ(ids(second), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(second.segments[1].num_tokens, 10);
  // 40 tokens never fit a budget of 16 next to decodes; it runs once it is alone.
  while (sequences_[2]->num_computed == 0) {
    StepPlan plan = step();
    for (int index : {0, 1}) {
      Sequence* sequence = sequences_[index].get();
      if (sequence->status == SequenceStatus::kRunning && sequence->num_generated() >= 3) {
        scheduler_->finish(sequence);
      }
    }
    if (!plan.segments.empty() && plan.segments.back().sequence == sequences_[2].get()) {
      EXPECT_EQ(plan.segments.size(), 1u);
      EXPECT_EQ(plan.segments[0].num_tokens, 40);
    }
  }
}

TEST_F(SchedulerTest, AChunkedPrefillIsAdmittedOnlyWhenItsWholeContextFits) {
  SchedulerOptions options;
  options.prefill_chunk_size = 8;
  build(6, options);
  Sequence* first = add(30);   // 4 blocks
  Sequence* second = add(20);  // 3 blocks: its first chunk would fit, its context does not
  step();
  EXPECT_EQ(first->status, SequenceStatus::kRunning);
  EXPECT_EQ(second->status, SequenceStatus::kWaiting);
  scheduler_->finish(first);
  step();
  EXPECT_EQ(second->status, SequenceStatus::kRunning);
}

TEST_F(SchedulerTest, ARequestThatDoesNotFitDoesNotBlockThoseBehindIt) {
  build(10, SchedulerOptions{});
  add(40);                                    // 5 of the 10 blocks, running
  Sequence* big = add(48);                    // 6 more blocks: does not fit beside the first
  Sequence* small = add(8, /*priority=*/-1);  // 1 block, and less important than `big`
  step();
  EXPECT_EQ(big->status, SequenceStatus::kWaiting);
  EXPECT_EQ(small->status, SequenceStatus::kRunning);
}

TEST_F(SchedulerTest, AStarvingRequestHoldsBackThoseBehindItUntilItFits) {
  SchedulerOptions options;
  options.starvation_threshold = std::chrono::seconds(5);
  options.aging_interval = std::chrono::hours(1);  // no aging in this test
  build(10, options);
  Sequence* running = add(40);
  Sequence* big = add(48);
  clock_.advance(std::chrono::seconds(6));  // `big` now starves
  Sequence* small = add(8, /*priority=*/-1);
  step();
  EXPECT_EQ(big->status, SequenceStatus::kWaiting);
  EXPECT_EQ(small->status, SequenceStatus::kWaiting) << "admitted past a starving request";
  scheduler_->finish(running);
  step();
  EXPECT_EQ(big->status, SequenceStatus::kRunning);
  EXPECT_EQ(small->status, SequenceStatus::kRunning);
}

TEST_F(SchedulerTest, WaitingRequestsAgeIntoHigherPriority) {
  SchedulerOptions options;
  options.max_num_sequences = 1;
  options.aging_interval = std::chrono::seconds(1);
  build(64, options);
  Sequence* holder = add(8, /*priority=*/10);
  step();
  Sequence* old_low = add(8, /*priority=*/0);
  clock_.advance(std::chrono::seconds(3));
  Sequence* new_high = add(8, /*priority=*/2);  // 2 < 0 + 3 levels of age
  scheduler_->finish(holder);
  step();
  EXPECT_EQ(old_low->status, SequenceStatus::kRunning);
  EXPECT_EQ(new_high->status, SequenceStatus::kWaiting);
}

TEST_F(SchedulerTest, PreemptsTheLowestPriorityThenPartialPrefillsThenTheLatest) {
  SchedulerOptions options;
  options.prefill_chunk_size = 8;
  options.max_num_batched_tokens = 64;
  build(12, options);
  Sequence* important = add(8, /*priority=*/1);
  Sequence* early = add(8);
  Sequence* late = add(8);
  Sequence* prefilling = add(64);  // 8 blocks, a chunk per step
  step();
  ASSERT_EQ(prefilling->status, SequenceStatus::kRunning);
  // 11 of 12 blocks are in use; the decodes' next tokens need 3 new blocks.
  StepPlan plan = step();
  EXPECT_EQ(plan.num_preempted_by_recompute, 1);
  EXPECT_EQ(prefilling->status, SequenceStatus::kWaiting) << "partial prefill goes first";
  EXPECT_EQ(prefilling->num_preemptions, 1);
  EXPECT_EQ(important->status, SequenceStatus::kRunning);
  EXPECT_EQ(early->status, SequenceStatus::kRunning);
  EXPECT_EQ(late->status, SequenceStatus::kRunning);
  // Without the prefill, decodes grow until three blocks each no longer fit: then the latest
  // arrival among the least important goes.
  scheduler_->finish(prefilling);
  while (step().num_preempted_by_recompute == 0) {
  }
  EXPECT_EQ(late->status, SequenceStatus::kWaiting);
  EXPECT_EQ(early->status, SequenceStatus::kRunning);
  EXPECT_EQ(important->status, SequenceStatus::kRunning);
}

TEST_F(SchedulerTest, PreemptionBySwapKeepsDecodesOnTheHost) {
  SchedulerOptions options;
  options.preemption_mode = PreemptionMode::kSwap;
  build(4, options, /*swap_blocks=*/16);
  Sequence* first = add(16);   // 2 blocks
  Sequence* second = add(16);  // 2 blocks
  step();
  StepPlan plan = step();  // both need a third block: the later one is swapped out
  EXPECT_EQ(plan.num_preempted_by_swap, 1);
  EXPECT_EQ(second->status, SequenceStatus::kSwapped);
  EXPECT_EQ(scheduler_->num_swapped(), 1);
  scheduler_->finish(first);
  step();  // swapped back in (decodes from the next step)
  EXPECT_EQ(second->status, SequenceStatus::kRunning);
  StepPlan resumed = step();
  ASSERT_EQ(ids(resumed), (std::vector<int64_t>{2}));
  EXPECT_EQ(resumed.segments[0].first_position, 16);
}

TEST_F(SchedulerTest, ASwappedSequenceThatOutgrewTheCacheFails) {
  SchedulerOptions options;
  options.preemption_mode = PreemptionMode::kSwap;
  // 5 usable blocks, watermark 1 block: admission and swap-in take at most 4, appends all 5.
  build(5, options, /*swap_blocks=*/16, /*watermark=*/0.2);
  Sequence* grower = add(16);
  StepPlan plan;
  for (int step_count = 0; step_count < 40 && plan.failed.empty(); ++step_count) plan = step();
  ASSERT_EQ(plan.failed.size(), 1u);
  EXPECT_EQ(plan.failed[0].first, grower);
  EXPECT_EQ(plan.failed[0].second.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(grower->num_preemptions, 1);
  EXPECT_FALSE(scheduler_->has_unfinished());
}

TEST_F(SchedulerTest, ASwappedSequenceComesBackOnlyWithRoomForItsNextToken) {
  SchedulerOptions options;
  options.preemption_mode = PreemptionMode::kSwap;
  build(5, options, /*swap_blocks=*/16);
  Sequence* first = add(16);   // 2 blocks
  Sequence* second = add(16);  // 2 blocks
  step();
  step();  // the first takes the last free block; the second's next token preempts it
  ASSERT_EQ(second->status, SequenceStatus::kSwapped);
  // Its 2 blocks are free again, but its pending token (position 16) needs a third: swapped in
  // now, it would be the next victim before it ran.
  for (int count = 0; count < 5; ++count) {
    step();
    EXPECT_EQ(second->status, SequenceStatus::kSwapped);
  }
  EXPECT_EQ(second->num_preemptions, 1);
  scheduler_->finish(first);
  step();
  ASSERT_EQ(second->status, SequenceStatus::kRunning);
  const StepPlan resumed = step();
  ASSERT_EQ(ids(resumed), (std::vector<int64_t>{2}));
  EXPECT_EQ(resumed.segments[0].first_position, 16);
  EXPECT_EQ(second->num_preemptions, 1);
}

// A sequence that grew past max_sequence_blocks - watermark while running (appends ignore the
// watermark) and was then preempted comes back, by swap and by recompute, once the more
// important one has finished; until then admission waits for it.
class PastWatermarkTest : public SchedulerTest,
                          public ::testing::WithParamInterface<PreemptionMode> {};

TEST_P(PastWatermarkTest, APreemptedSequencePastTheWatermarkComesBack) {
  SchedulerOptions options;
  options.preemption_mode = GetParam();
  // 10 usable blocks, watermark 3: admission leaves 3 obtainable, a new sequence takes <= 7.
  build(10, options, /*swap_blocks=*/GetParam() == PreemptionMode::kSwap ? 16 : 0,
        /*watermark=*/0.3);
  ASSERT_EQ(manager_->max_sequence_blocks() - manager_->watermark_blocks(), 7);
  Sequence* grower = add(48);                    // 6 blocks
  Sequence* important = add(4, /*priority=*/1);  // 1 block
  // Both grow; the grower takes the last free blocks, then the important one's next block
  // preempts it, holding 8 blocks.
  step();
  ASSERT_EQ(grower->status, SequenceStatus::kRunning);
  ASSERT_EQ(important->status, SequenceStatus::kRunning);
  int step_count = 0;
  while (grower->status == SequenceStatus::kRunning && step_count++ < 40) {
    const StepPlan plan = step();
    ASSERT_TRUE(plan.failed.empty()) << plan.failed[0].second.to_string();
  }
  ASSERT_NE(grower->status, SequenceStatus::kRunning);
  ASSERT_EQ(grower->num_preemptions, 1);
  ASSERT_GT((static_cast<int32_t>(grower->tokens.size()) - 1) / kBlockSize + 1, 7)
      << "the test wants a victim past the watermark";
  // While the important one runs, the grower cannot come back, and nothing is admitted behind
  // it.
  Sequence* later = add(4);
  for (int count = 0; count < 3; ++count) {
    const StepPlan plan = step();
    ASSERT_TRUE(plan.failed.empty()) << plan.failed[0].second.to_string();
    EXPECT_NE(grower->status, SequenceStatus::kRunning);
    EXPECT_EQ(later->status, SequenceStatus::kWaiting);
  }
  scheduler_->finish(important);
  const StepPlan back = step();
  ASSERT_TRUE(back.failed.empty()) << back.failed[0].second.to_string();
  EXPECT_EQ(grower->status, SequenceStatus::kRunning);
  EXPECT_EQ(scheduler_->past_watermark(), grower);
  // It goes on to its end; the later one runs beside it when there is room.
  for (int count = 0; count < 12; ++count) {
    const StepPlan plan = step();
    ASSERT_TRUE(plan.failed.empty()) << plan.failed[0].second.to_string();
    EXPECT_EQ(grower->status, SequenceStatus::kRunning) << "never the victim while another runs";
  }
  EXPECT_EQ(grower->num_preemptions, 1);
  scheduler_->finish(grower);
  EXPECT_EQ(scheduler_->past_watermark(), nullptr);
}

INSTANTIATE_TEST_SUITE_P(Modes, PastWatermarkTest,
                         ::testing::Values(PreemptionMode::kRecompute, PreemptionMode::kSwap),
                         [](const ::testing::TestParamInfo<PreemptionMode>& info) {
                           return std::string(preemption_mode_name(info.param));
                         });

// Rates that make either choice the cheaper: swapping a block of 32 bytes out and back costs
// 64 / copy rate; recomputing T tokens costs T * 1000 FLOPs / FLOP rate.
std::unique_ptr<PreemptionCostModel> cost_model(double copy_bytes_per_second,
                                                double flops_per_second) {
  RecomputeCostCurve curve =
      std::move(RecomputeCostCurve::create({RecomputeCostPoint{1, 1000.0, 1.0}}).value());
  PreemptionRates rates;
  rates.host_copy_bytes_per_second = copy_bytes_per_second;
  rates.memory_bytes_per_second = 1e12;
  rates.flops_per_second = flops_per_second;
  return std::move(PreemptionCostModel::create(std::move(curve), 32, rates).value());
}

struct CheaperCase {
  double copy_bytes_per_second;
  int32_t swap_blocks;
  bool expect_swapped;
};

TEST_F(SchedulerTest, TheCheaperModeSwapsOrRecomputesEachVictimByCost) {
  // Two sequences of 16 tokens (2 blocks) fill 4 blocks; the later one is the victim. Swap:
  // 2 blocks * 32 B * 2 / copy rate; recompute: 16 or 17 tokens * 1000 FLOPs / 1e6 FLOP/s, ~17
  // ms.
  const CheaperCase cases[] = {
      {1e9, 16, true},   // fast copy: ~0.1 us
      {1e3, 16, false},  // slow copy: 128 ms
      {1e9, 1, false},   // swap is cheaper but the swap space is full: recompute
  };
  for (const CheaperCase& test_case : cases) {
    SCOPED_TRACE(test_case.copy_bytes_per_second);
    SCOPED_TRACE(test_case.swap_blocks);
    sequences_.clear();
    SchedulerOptions options;
    options.preemption_mode = PreemptionMode::kCheaper;
    build(4, options, test_case.swap_blocks);
    const auto cost = cost_model(test_case.copy_bytes_per_second, 1e6);
    scheduler_->set_preemption_cost(cost.get());
    add(16);
    Sequence* second = add(16);
    step();
    const StepPlan plan = step();
    EXPECT_EQ(plan.num_cost_chose_swap + plan.num_cost_chose_recompute, 1);
    EXPECT_EQ(plan.num_cost_chose_swap, test_case.copy_bytes_per_second > 1e6 ? 1 : 0);
    EXPECT_EQ(plan.num_preempted_by_swap, test_case.expect_swapped ? 1 : 0);
    EXPECT_EQ(plan.num_preempted_by_recompute, test_case.expect_swapped ? 0 : 1);
    EXPECT_EQ(second->status,
              test_case.expect_swapped ? SequenceStatus::kSwapped : SequenceStatus::kWaiting);
    scheduler_.reset();
    manager_.reset();
  }
}

TEST_F(SchedulerTest, PreferringTheCheaperMakesTheRecomputeModeDecideByCost) {
  SchedulerOptions options;
  options.preemption_mode = PreemptionMode::kRecompute;
  build(4, options, /*swap_blocks=*/16);
  const auto cost = cost_model(1e9, 1e6);  // swap is far cheaper
  scheduler_->set_preemption_cost(cost.get());
  EXPECT_FALSE(scheduler_->prefers_cheaper_preemption());
  scheduler_->set_prefer_cheaper_preemption(true);
  add(16);
  Sequence* second = add(16);
  step();
  const StepPlan plan = step();
  EXPECT_EQ(plan.num_cost_chose_swap, 1);
  EXPECT_EQ(plan.num_preempted_by_swap, 1);
  EXPECT_EQ(second->status, SequenceStatus::kSwapped);
}

TEST_F(SchedulerTest, SwapModesWithoutSwapSpaceAreRejected) {
  kv::BlockManagerOptions kv_options;
  kv_options.geometry = {kBlockSize, 1, 1, 4, DType::kF32};
  kv_options.max_context_tokens = 64;
  kv::FixedPageSource source(kv_options.geometry.block_bytes(), 4);
  auto manager = std::move(kv::BlockManager::create(kv_options, source, copier_).value());
  SchedulerOptions options;
  for (PreemptionMode mode : {PreemptionMode::kSwap, PreemptionMode::kCheaper}) {
    options.preemption_mode = mode;
    EXPECT_EQ(Scheduler::create(options, *manager, false).status().code(),
              StatusCode::kInvalidArgument);
  }
}

TEST_F(SchedulerTest, ARequestPreemptedTooOftenFails) {
  SchedulerOptions options;
  options.max_preemptions = 0;
  build(4, options);
  add(16);
  Sequence* victim = add(16);
  step();
  StepPlan plan = step();
  ASSERT_EQ(plan.failed.size(), 1u);
  EXPECT_EQ(plan.failed[0].first, victim);
  EXPECT_EQ(plan.failed[0].second.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(victim->status, SequenceStatus::kFinished);
  EXPECT_FALSE(manager_->contains(victim->seq));
}

TEST_F(SchedulerTest, ARequestThatCanNeverFitFails) {
  build(4, SchedulerOptions{});
  Sequence* huge = add(40);  // 5 blocks > 4
  StepPlan plan = step();
  ASSERT_EQ(plan.failed.size(), 1u);
  EXPECT_EQ(plan.failed[0].first, huge);
  EXPECT_EQ(plan.failed[0].second.code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(scheduler_->has_unfinished());
}

TEST_F(SchedulerTest, NeverRunsMoreThanMaxNumSequences) {
  SchedulerOptions options;
  options.max_num_sequences = 3;
  options.max_num_batched_tokens = 3;
  build(64, options);
  for (int index = 0; index < 6; ++index) add(2);
  for (int index = 0; index < 5; ++index) {
    step();
    EXPECT_LE(scheduler_->num_running(), 3);
  }
  EXPECT_EQ(scheduler_->num_waiting(), 3);
}

TEST(SchedulerOptionsTest, RejectsInconsistentOptions) {
  auto invalid = [](auto mutate) {
    SchedulerOptions options;
    mutate(options);
    return options.validate().code() == StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(SchedulerOptions{}.validate().ok());
  EXPECT_TRUE(invalid([](SchedulerOptions& o) { o.max_num_sequences = 0; }));
  EXPECT_TRUE(invalid([](SchedulerOptions& o) { o.max_num_batched_tokens = 10; }));
  EXPECT_TRUE(invalid([](SchedulerOptions& o) { o.prefill_chunk_size = 0; }));
  EXPECT_TRUE(invalid([](SchedulerOptions& o) { o.max_preemptions = -1; }));
  EXPECT_TRUE(invalid([](SchedulerOptions& o) { o.aging_interval = Duration::zero(); }));
}

}  // namespace
}  // namespace folio::engine
