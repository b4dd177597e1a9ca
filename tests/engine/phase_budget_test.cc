// Phase-aware budgets: the scheduler's phase split (prefill token cap in decode steps, decode KV
// share held back from admission) over a real block manager, and the PhaseBudgetTuner under
// scripted observation sequences (steady prefill-heavy and decode-heavy signals converge to the
// bounds; alternating and noisy signals do not make it oscillate; off, it never moves).
#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <random>

#include "engine_test_util.h"
#include "folio/engine/phase_budget_tuner.h"
#include "folio/engine/scheduler.h"
#include "folio/kv/block_copier.h"
#include "folio/kv/fixed_page_source.h"
#include "scheduler_test_util.h"

namespace folio::engine {
namespace {

using std::chrono::milliseconds;

constexpr int32_t kBlockSize = 8;

class PhaseSplitTest : public ::testing::Test {
 protected:
  void build(int32_t num_blocks, SchedulerOptions options) {
    scheduler_.reset();  // a rebuild: users first
    manager_.reset();
    kv::BlockManagerOptions kv_options;
    kv_options.geometry = {kBlockSize, 1, 1, 4, DType::kF32};
    kv_options.max_context_tokens = 512;
    kv_options.watermark = 0.0;
    source_ =
        std::make_unique<kv::FixedPageSource>(kv_options.geometry.block_bytes(), num_blocks + 1);
    manager_ = std::move(kv::BlockManager::create(kv_options, *source_, copier_).value());
    scheduler_ = std::move(Scheduler::create(options, *manager_, false).value());
  }

  Sequence* add(int32_t prompt_length) {
    const int64_t id = static_cast<int64_t>(sequences_.size()) + 1;
    sequences_.push_back(testing::make_sequence(id, prompt_length, clock_.now()));
    scheduler_->add(sequences_.back().get());
    return sequences_.back().get();
  }

  StepPlan step() { return testing::run_step(*scheduler_, *manager_, clock_.now()); }

  static int32_t decode_tokens(const StepPlan& plan) {
    int32_t count = 0;
    for (const ScheduledSegment& segment : plan.segments) count += segment.is_decode ? 1 : 0;
    return count;
  }

  ManualClock clock_;
  std::unique_ptr<kv::FixedPageSource> source_;
  kv::HostKvBlockCopier copier_;
  std::unique_ptr<kv::BlockManager> manager_;
  std::unique_ptr<Scheduler> scheduler_;
  std::deque<std::unique_ptr<Sequence>> sequences_;
};

TEST_F(PhaseSplitTest, PrefillTakesAtMostItsShareInDecodeStepsAndAllOfAStepWithout) {
  SchedulerOptions options;
  options.max_num_batched_tokens = 32;
  options.max_num_sequences = 4;
  options.prefill_chunk_size = 32;
  options.phase_split.prefill_token_share = 0.25;  // 8 tokens next to decodes
  build(64, options);
  add(4);
  StepPlan first = step();  // no decodes yet: the short prompt whole
  EXPECT_EQ(first.num_prefill_tokens, 4);
  EXPECT_EQ(first.prefill_token_cap, 32);
  Sequence* long_prompt = add(100);
  // Without decodes in the step a prefill would take the whole budget; next to the decode of
  // the first sequence it gets 8 tokens a step, and the split says it was cut.
  for (int index = 0; index < 5; ++index) {
    StepPlan plan = step();
    ASSERT_EQ(decode_tokens(plan), 1);
    EXPECT_EQ(plan.num_prefill_tokens, 8);
    EXPECT_EQ(plan.prefill_token_cap, 8);
    EXPECT_TRUE(plan.prefill_limited_by_split);
  }
  EXPECT_EQ(long_prompt->num_computed, 40);
  scheduler_->finish(sequences_[0].get());
  StepPlan alone = step();
  EXPECT_EQ(alone.num_prefill_tokens, 32);
  EXPECT_FALSE(alone.prefill_limited_by_split);
  // Moving the split back takes effect from the next step.
  add(4);
  ASSERT_TRUE(scheduler_->set_phase_split(PhaseSplit{}).ok());
  StepPlan whole = step();  // long_prompt's last 28 tokens and the new prompt's 4
  EXPECT_EQ(whole.num_prefill_tokens, 32);
}

TEST_F(PhaseSplitTest, DecodeKvShareHoldsAdmissionsWhileSomethingRuns) {
  SchedulerOptions options;
  options.max_num_batched_tokens = 128;
  options.max_num_sequences = 4;
  options.prefill_chunk_size = 64;
  options.phase_split.decode_kv_share = 0.5;  // 10 of 20 blocks stay for running sequences
  build(20, options);
  Sequence* first = add(40);   // 5 blocks; nothing runs, so it is never held
  Sequence* second = add(40);  // 20 - 5 - 5 = 10 left: admitted
  Sequence* third = add(16);   // 10 - 2 = 8 < 10: held back
  StepPlan plan = step();
  EXPECT_EQ(first->status, SequenceStatus::kRunning);
  EXPECT_EQ(second->status, SequenceStatus::kRunning);
  EXPECT_EQ(third->status, SequenceStatus::kWaiting);
  EXPECT_EQ(plan.num_held_by_kv_share, 1);
  // Without the share it fits at once.
  ASSERT_TRUE(scheduler_->set_phase_split(PhaseSplit{}).ok());
  StepPlan next = step();
  EXPECT_EQ(third->status, SequenceStatus::kRunning);
  EXPECT_EQ(next.num_held_by_kv_share, 0);
}

TEST_F(PhaseSplitTest, InvalidSplitsAreRefusedAndChangeNothing) {
  SchedulerOptions options;
  options.phase_split.prefill_token_share = 0.0;
  EXPECT_FALSE(options.validate().ok());
  options.phase_split = PhaseSplit{};
  build(16, options);
  for (const PhaseSplit bad : {PhaseSplit{0.0, 0.0}, PhaseSplit{1.5, 0.0}, PhaseSplit{0.5, 1.0},
                               PhaseSplit{0.5, -0.1}, PhaseSplit{std::nan(""), 0.0}}) {
    EXPECT_FALSE(scheduler_->set_phase_split(bad).ok());
    EXPECT_EQ(scheduler_->phase_split(), PhaseSplit{});
  }
}

// Randomized: shares moved at random between steps of a random load; in every step with decodes
// prefill stays under the cap, every admitted sequence left the decode share obtainable when
// something else ran, and every sequence completes.
TEST_F(PhaseSplitTest, RandomSplitsKeepTheCapsAndEverySequenceCompletes) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    sequences_.clear();
    SchedulerOptions options;
    options.max_num_batched_tokens = 48;
    options.max_num_sequences = 6;
    options.prefill_chunk_size = 24;
    build(64, options);
    std::mt19937_64 random(seed);
    std::uniform_int_distribution<int32_t> prompt(1, 120);
    std::uniform_real_distribution<double> share(0.05, 1.0);
    std::uniform_real_distribution<double> kv_share(0.0, 0.6);
    for (int index = 0; index < 24; ++index) add(prompt(random));
    int32_t steps = 0;
    while (scheduler_->has_unfinished()) {
      ASSERT_LT(++steps, 5000) << "seed " << seed;
      if (steps % 3 == 0) {
        ASSERT_TRUE(scheduler_->set_phase_split(PhaseSplit{share(random), kv_share(random)}).ok());
      }
      const PhaseSplit split = scheduler_->phase_split();
      std::vector<Sequence*> waiting_before;
      for (const auto& sequence : sequences_) {
        if (sequence->status == SequenceStatus::kWaiting) waiting_before.push_back(sequence.get());
      }
      const bool ran_before = scheduler_->num_running() > 0;
      StepPlan plan = step();
      ASSERT_TRUE(plan.failed.empty());
      if (decode_tokens(plan) > 0) {
        const int32_t cap = static_cast<int32_t>(
            std::ceil(split.prefill_token_share * options.max_num_batched_tokens));
        EXPECT_LE(plan.num_prefill_tokens, std::max(cap, 1));
      }
      int32_t admitted = 0;
      for (Sequence* sequence : waiting_before) {
        admitted += sequence->status == SequenceStatus::kRunning ? 1 : 0;
      }
      if (ran_before && admitted > 0) {
        const auto reserved = static_cast<int64_t>(std::ceil(
            split.decode_kv_share * static_cast<double>(manager_->max_sequence_blocks())));
        EXPECT_GE(manager_->allocator().num_obtainable_blocks(), reserved) << "seed " << seed;
      }
      for (const auto& sequence : sequences_) {
        if (sequence->status == SequenceStatus::kRunning && sequence->num_generated() >= 4) {
          scheduler_->finish(sequence.get());
        }
      }
    }
  }
}

// --- The tuner.

PhaseBudgetTunerOptions tuner_options() {
  PhaseBudgetTunerOptions options;
  options.enabled = true;
  options.window_steps = 8;
  options.ttft_target = milliseconds(100);
  options.tpot_target = milliseconds(20);
  return options;
}

// Prefill starved: the cap binds, requests wait four times the TTFT target, decodes are fast.
PhaseObservation prefill_heavy() {
  PhaseObservation observation;
  observation.prefill_tokens = 256;
  observation.decode_tokens = 2;
  observation.prefill_limited_by_split = true;
  observation.num_waiting = 10;
  observation.oldest_wait = milliseconds(400);
  observation.kv_utilization = 0.4;
  observation.step_time = milliseconds(5);
  return observation;
}

// Decodes slowed by the prefill riding along: steps four times the TPOT target, nobody waits.
PhaseObservation decode_heavy() {
  PhaseObservation observation;
  observation.prefill_tokens = 64;
  observation.decode_tokens = 48;
  observation.kv_utilization = 0.6;
  observation.step_time = milliseconds(80);
  return observation;
}

struct Trace {
  std::vector<double> token_shares;  // after every step
  std::vector<double> kv_shares;
};

template <typename Next>
Trace drive(PhaseBudgetTuner& tuner, int32_t steps, Next next) {
  Trace trace;
  for (int32_t step = 0; step < steps; ++step) {
    tuner.observe(next(step));
    const PhaseSplit& split = tuner.split();
    EXPECT_TRUE(split.validate().ok());
    if (tuner.options().enabled) {
      EXPECT_GE(split.prefill_token_share, tuner.options().min_prefill_token_share);
      EXPECT_LE(split.prefill_token_share, tuner.options().max_prefill_token_share);
      EXPECT_GE(split.decode_kv_share, tuner.options().min_decode_kv_share);
      EXPECT_LE(split.decode_kv_share, tuner.options().max_decode_kv_share);
    }
    trace.token_shares.push_back(split.prefill_token_share);
    trace.kv_shares.push_back(split.decode_kv_share);
  }
  return trace;
}

int32_t direction_changes(const std::vector<double>& values) {
  int32_t changes = 0;
  int last = 0;
  for (size_t index = 1; index < values.size(); ++index) {
    const double delta = values[index] - values[index - 1];
    if (delta == 0.0) continue;
    const int direction = delta > 0.0 ? 1 : -1;
    if (last != 0 && direction != last) ++changes;
    last = direction;
  }
  return changes;
}

bool monotone(const std::vector<double>& values, int direction) {
  for (size_t index = 1; index < values.size(); ++index) {
    if ((values[index] - values[index - 1]) * direction < 0.0) return false;
  }
  return true;
}

TEST(PhaseBudgetTunerTest, SteadyPrefillHeavySignalWalksTheTokenShareUpToItsBound) {
  const PhaseBudgetTunerOptions options = tuner_options();
  PhaseBudgetTuner tuner = PhaseBudgetTuner::create(options, PhaseSplit{0.25, 0.1}).value();
  const Trace trace = drive(tuner, 8 * 40, [](int32_t) { return prefill_heavy(); });
  EXPECT_EQ(tuner.split().prefill_token_share, options.max_prefill_token_share);
  EXPECT_TRUE(monotone(trace.token_shares, 1));
  // Gradual: never more than the learning rate per window.
  for (size_t index = 1; index < trace.token_shares.size(); ++index) {
    EXPECT_LE(trace.token_shares[index] - trace.token_shares[index - 1],
              options.learning_rate + 1e-12);
  }
  // Nothing asked the KV share to move.
  EXPECT_EQ(tuner.split().decode_kv_share, 0.1);
  EXPECT_EQ(tuner.num_kv_share_moves(), 0);
}

TEST(PhaseBudgetTunerTest, SteadyDecodeHeavySignalWalksTheTokenShareDownToItsBound) {
  const PhaseBudgetTunerOptions options = tuner_options();
  PhaseBudgetTuner tuner = PhaseBudgetTuner::create(options, PhaseSplit{}).value();
  const Trace trace = drive(tuner, 8 * 40, [](int32_t) { return decode_heavy(); });
  EXPECT_EQ(tuner.split().prefill_token_share, options.min_prefill_token_share);
  EXPECT_TRUE(monotone(trace.token_shares, -1));
  EXPECT_GT(tuner.num_token_share_moves(), 10);
  EXPECT_LT(tuner.token_signal(), 0.0);
}

TEST(PhaseBudgetTunerTest, PreemptionsGrowTheDecodeKvShareAndHeldAdmissionsShrinkIt) {
  const PhaseBudgetTunerOptions options = tuner_options();
  PhaseBudgetTuner tuner = PhaseBudgetTuner::create(options, PhaseSplit{}).value();
  drive(tuner, 8 * 30, [](int32_t step) {
    PhaseObservation observation = decode_heavy();
    observation.step_time = milliseconds(1);
    observation.kv_utilization = 0.95;
    observation.preemptions = step % 4 == 0 ? 1 : 0;
    return observation;
  });
  EXPECT_EQ(tuner.split().decode_kv_share, options.max_decode_kv_share);
  const Trace trace = drive(tuner, 8 * 30, [](int32_t) {
    PhaseObservation observation = decode_heavy();
    observation.step_time = milliseconds(1);
    observation.held_by_kv_share = 3;
    return observation;
  });
  EXPECT_EQ(tuner.split().decode_kv_share, options.min_decode_kv_share);
  EXPECT_TRUE(monotone(trace.kv_shares, -1));
  // Preemptions while the cache is mostly empty are not the share's to fix.
  const Trace empty_cache = drive(tuner, 8 * 30, [](int32_t) {
    PhaseObservation observation = decode_heavy();
    observation.step_time = milliseconds(1);
    observation.kv_utilization = 0.1;
    observation.preemptions = 1;
    return observation;
  });
  EXPECT_EQ(tuner.split().decode_kv_share, options.min_decode_kv_share);
}

// The bands' worth: the same signals through a tuner without smoothing or bands flip the share
// back and forth, through the default one they do not.
PhaseBudgetTunerOptions bandless() {
  PhaseBudgetTunerOptions options = tuner_options();
  options.smoothing = 1.0;
  options.dead_band = 0.0;
  options.reversal_band = 0.0;
  return options;
}

TEST(PhaseBudgetTunerTest, AlternatingSignalDoesNotMakeItOscillate) {
  auto alternating = [](int32_t step) {
    return (step / 8) % 2 == 0 ? prefill_heavy() : decode_heavy();  // a window each
  };
  PhaseBudgetTuner tuner = PhaseBudgetTuner::create(tuner_options(), PhaseSplit{0.5, 0.0}).value();
  const Trace trace = drive(tuner, 8 * 200, alternating);
  EXPECT_EQ(direction_changes(trace.token_shares), 0);
  PhaseBudgetTuner naive = PhaseBudgetTuner::create(bandless(), PhaseSplit{0.5, 0.0}).value();
  const Trace naive_trace = drive(naive, 8 * 200, alternating);
  EXPECT_GT(direction_changes(naive_trace.token_shares), 100);
}

TEST(PhaseBudgetTunerTest, NoisySignalDoesNotMakeItOscillate) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    // Balanced per-step noise: the cap binds in half of the steps (prefill need 0.5 on average)
    // and the decode steps take 29 ms +-50% against a 20 ms TPOT target (decode need: the mean
    // of clamp(log2(t / 20 ms), 0, 1) over t uniform in [14.5, 43.5] ms, about 0.5).
    auto noisy = [random = std::mt19937_64(seed)](int32_t) mutable {
      std::uniform_int_distribution<int> jitter(50, 150);
      PhaseObservation observation = prefill_heavy();
      observation.prefill_limited_by_split = random() % 2 == 0;
      observation.oldest_wait = observation.oldest_wait * jitter(random) / 100;
      observation.step_time = milliseconds(29) * jitter(random) / 100;
      return observation;
    };
    PhaseBudgetTuner tuner =
        PhaseBudgetTuner::create(tuner_options(), PhaseSplit{0.5, 0.0}).value();
    const Trace trace = drive(tuner, 8 * 400, noisy);
    EXPECT_LE(direction_changes(trace.token_shares), 2) << "seed " << seed;
    PhaseBudgetTuner naive = PhaseBudgetTuner::create(bandless(), PhaseSplit{0.5, 0.0}).value();
    const Trace naive_trace = drive(naive, 8 * 400, noisy);
    EXPECT_GT(direction_changes(naive_trace.token_shares), 50) << "seed " << seed;
  }
}

TEST(PhaseBudgetTunerTest, OffItNeverMoves) {
  PhaseBudgetTunerOptions options = tuner_options();
  options.enabled = false;
  const PhaseSplit initial{0.25, 0.1};
  PhaseBudgetTuner tuner = PhaseBudgetTuner::create(options, initial).value();
  std::mt19937_64 random(3);
  const Trace trace = drive(tuner, 8 * 100, [&](int32_t) {
    return random() % 2 == 0 ? prefill_heavy() : decode_heavy();
  });
  EXPECT_EQ(tuner.split(), initial);
  EXPECT_EQ(tuner.num_token_share_moves() + tuner.num_kv_share_moves(), 0);
  EXPECT_EQ(direction_changes(trace.token_shares), 0);
}

TEST(PhaseBudgetTunerTest, RefusesBadOptionsAndAnInitialSplitOutsideItsBounds) {
  PhaseBudgetTunerOptions options = tuner_options();
  options.learning_rate = 0.0;
  EXPECT_FALSE(PhaseBudgetTuner::create(options, PhaseSplit{}).ok());
  options = tuner_options();
  options.min_prefill_token_share = 0.8;
  options.max_prefill_token_share = 0.5;
  EXPECT_FALSE(PhaseBudgetTuner::create(options, PhaseSplit{}).ok());
  options = tuner_options();
  options.reversal_band = options.dead_band / 2;
  EXPECT_FALSE(PhaseBudgetTuner::create(options, PhaseSplit{}).ok());
  options = tuner_options();
  options.max_prefill_token_share = 0.5;
  const Result<PhaseBudgetTuner> outside = PhaseBudgetTuner::create(options, PhaseSplit{});
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.status().message().find("outside the tuner's bounds"), std::string::npos);
  options.enabled = false;  // off, the split is the scheduler's alone
  EXPECT_TRUE(PhaseBudgetTuner::create(options, PhaseSplit{}).ok());
}

// The engine feeds the tuner every step, applies its split and exports it; outputs are the same
// as without it (greedy output never depends on how steps are composed).
TEST(PhaseBudgetEngineTest, TheTunerMovesTheEnginesSplitAndOutputsStayTheSame) {
  testing::HarnessOptions options;
  options.scheduler.max_num_batched_tokens = 32;
  options.scheduler.max_num_sequences = 8;
  options.scheduler.prefill_chunk_size = 32;
  options.scheduler.phase_split.prefill_token_share = 0.25;  // 8 tokens next to decodes
  options.phase_tuner = tuner_options();
  options.phase_tuner.window_steps = 2;
  options.phase_tuner.ttft_target = std::chrono::milliseconds(1);
  options.phase_tuner.tpot_target = std::chrono::seconds(10);
  testing::EngineHarness harness(options);
  testing::Recorder recorder;
  std::vector<RequestId> ids;
  for (int32_t index = 0; index < 12; ++index) {
    Request request = testing::greedy_request(testing::iota_prompt(40, index), 6);
    ids.push_back(*harness.engine().submit(recorder.attach(request)));
  }
  // Each step takes 5 ms of the manual clock: waits pass the 1 ms TTFT target at once.
  while (harness.engine().has_unfinished_requests()) {
    harness.clock().advance(std::chrono::milliseconds(5));
    harness.engine().step();
    harness.engine().check_invariants();
  }
  recorder.expect_each_finished_once(ids);
  for (int32_t index = 0; index < 12; ++index) {
    EXPECT_EQ(recorder.stream(ids[static_cast<size_t>(index)]).tokens,
              testing::reference_greedy(options, testing::iota_prompt(40, index), 6));
  }
  const EngineStats stats = harness.engine().stats();
  EXPECT_GT(stats.prefill_token_share, 0.25);
  EXPECT_GT(stats.phase_split_moves, 0);
  const std::string rendered = harness.engine().registry().render();
  EXPECT_NE(rendered.find("folio_engine_phase_split_share{budget=\"prefill_tokens\"}"),
            std::string::npos);
  EXPECT_NE(rendered.find("folio_engine_phase_split_moves_total{budget=\"prefill_tokens\"}"),
            std::string::npos);
}

}  // namespace
}  // namespace folio::engine
