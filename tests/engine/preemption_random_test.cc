// A preempted request comes back: randomized over seeds, KV caps, block manager watermarks and
// the three preemption modes (recompute, swap, and the cheaper of the two by cost, with rates
// drawn so both choices happen), every request whose prompt plus max_tokens fits the KV cache
// (max_sequence_blocks) completes, with the same greedy tokens as the independent reference
// (an unconstrained run), however often it was preempted and however far past the watermark it
// grew. The engine's invariants are checked after every step, and a workload that does not drain
// within a step bound fails (livelock).
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "folio/base/random.h"
#include "folio/engine/preemption_cost.h"

namespace folio::engine {
namespace {

using testing::EngineHarness;
using testing::HarnessOptions;
using testing::randomize_batching;
using testing::Recorder;
using testing::reference_greedy;

struct Workload {
  int64_t num_requests = 0;
  int64_t preemptions = 0;
  int64_t cost_chose_swap = 0;
  int64_t cost_chose_recompute = 0;
};

Workload run_workload(uint64_t seed, PreemptionMode mode) {
  SCOPED_TRACE(fmt::format("seed {} mode {}", seed, preemption_mode_name(mode)));
  SplitMix64 random(seed);
  HarnessOptions options;
  options.block_size = 8;
  options.blocks_per_page = 4;
  options.num_pages = static_cast<int32_t>(2 + random.next() % 5);  // 8 to 24 blocks
  options.max_context_tokens = 256;
  const double watermarks[] = {0.01, 0.1, 0.2, 0.3, 0.4};
  options.watermark = watermarks[random.next() % 5];
  SchedulerOptions& scheduler = options.scheduler;
  scheduler.preemption_mode = mode;
  randomize_batching(scheduler, random, 7, 64);
  std::unique_ptr<PreemptionCostModel> cost;
  if (mode != PreemptionMode::kRecompute) {
    options.swap_blocks = static_cast<int32_t>(4 + random.next() % 60);
  }
  if (mode == PreemptionMode::kCheaper) {
    // 1e3 FLOPs per token at 1e6 FLOP/s is 8 ms a block of 8 tokens; copying a toy block
    // (256 B) out and back at 2.56e3 to 2.56e5 B/s takes 200 ms to 2 ms: both choices come up.
    PreemptionRates rates;
    rates.host_copy_bytes_per_second = 2.56e3 * static_cast<double>(1 + random.next() % 100);
    rates.memory_bytes_per_second = 1e12;
    rates.flops_per_second = 1e6;
    const ir::KvCacheGeometry geometry{options.block_size, 1, 1, 4, DType::kF32};  // the toy's
    cost = std::move(
        PreemptionCostModel::create(std::move(RecomputeCostCurve::create({{1, 1e3, 1.0}}).value()),
                                    geometry.block_bytes(), rates)
            .value());
    options.preemption_cost = cost.get();
  }
  Recorder recorder;  // outlives the engine, which ends unfinished requests when destroyed
  EngineHarness harness(options);
  // Every request fits the whole cache (not only above its watermark) with its prompt plus
  // max_tokens; its prompt fits above the watermark (a new prompt that does not never fits).
  const kv::BlockManager& manager = harness.block_manager();
  const auto cache_tokens =
      static_cast<int32_t>(manager.max_sequence_blocks()) * options.block_size;
  const int32_t max_total_tokens = std::min(options.max_context_tokens - 1, cache_tokens);
  const auto max_prompt_tokens = static_cast<int32_t>(
      (manager.max_sequence_blocks() - manager.watermark_blocks()) * options.block_size);
  std::vector<int32_t> shared_prefix;
  for (int token = 0; token < 12; ++token) {
    shared_prefix.push_back(static_cast<int32_t>(random.next() % 64));
  }
  struct Submitted {
    RequestId id;
    std::vector<int32_t> prompt;
    int32_t max_tokens = 0;
  };
  std::vector<Submitted> submitted;
  const int num_requests = static_cast<int>(8 + random.next() % 24);
  for (int step = 0; submitted.size() < static_cast<size_t>(num_requests) ||
                     harness.engine().has_unfinished_requests();
       ++step) {
    const int arrivals = static_cast<int>(random.next() % 4);
    for (int index = 0; index < arrivals && submitted.size() < static_cast<size_t>(num_requests);
         ++index) {
      Request request;
      if (random.next() % 2 == 0) request.prompt = shared_prefix;
      const auto extra = static_cast<int32_t>(1 + random.next() % 24);
      for (int32_t token = 0; token < extra; ++token) {
        request.prompt.push_back(static_cast<int32_t>(random.next() % 64));
      }
      auto prompt_length = static_cast<int32_t>(request.prompt.size());
      if (prompt_length > max_prompt_tokens || prompt_length >= max_total_tokens) {
        prompt_length = std::min(max_prompt_tokens, max_total_tokens / 2);
        request.prompt.resize(static_cast<size_t>(prompt_length));
      }
      // Long outputs: most requests grow far, many up to the whole cache.
      const int32_t room = max_total_tokens - prompt_length;
      request.max_tokens =
          random.next() % 2 == 0
              ? room
              : static_cast<int32_t>(1 + random.next() % static_cast<uint64_t>(room));
      request.priority = static_cast<int32_t>(random.next() % 3);
      request.sampling.temperature = 0.0f;
      Submitted entry{RequestId(), request.prompt, request.max_tokens};
      Result<RequestId> id = harness.engine().submit(recorder.attach(request));
      EXPECT_TRUE(id.ok()) << id.status().to_string();
      if (!id.ok()) return {};
      entry.id = *id;
      submitted.push_back(std::move(entry));
    }
    harness.clock().advance(std::chrono::milliseconds(random.next() % 5));
    harness.engine().step();
    harness.engine().check_invariants();
    if (step >= 40000) {
      const EngineStats stats = harness.engine().stats();
      const kv::BlockCounts& counts = harness.block_manager().counts();
      ADD_FAILURE() << "the workload does not drain (livelock?): " << stats.num_waiting
                    << " waiting, " << stats.num_running << " running, " << stats.num_swapped
                    << " swapped; KV blocks " << counts.free << " free, " << counts.owned
                    << " owned, " << counts.cached << " cached of " << counts.total
                    << "; watermark " << harness.block_manager().watermark_blocks();
      return {};
    }
  }
  std::vector<RequestId> ids;
  for (const Submitted& entry : submitted) ids.push_back(entry.id);
  recorder.expect_each_finished_once(ids);
  for (const Submitted& entry : submitted) {
    const Completion completion = recorder.completion(entry.id);
    EXPECT_EQ(completion.reason, FinishReason::kLength)
        << "request " << entry.id.value() << ": " << completion.error.to_string();
    EXPECT_EQ(recorder.stream(entry.id).tokens,
              reference_greedy(options, entry.prompt, entry.max_tokens))
        << "request " << entry.id.value();
  }
  harness.expect_all_blocks_free_or_cached();
  const EngineStats stats = harness.engine().stats();
  return Workload{static_cast<int64_t>(submitted.size()),
                  stats.preemptions_by_recompute + stats.preemptions_by_swap, stats.cost_chose_swap,
                  stats.cost_chose_recompute};
}

class PreemptedRequestsComeBackTest : public ::testing::TestWithParam<PreemptionMode> {};

TEST_P(PreemptedRequestsComeBackTest, EveryRequestThatFitsTheCacheCompletes) {
  Workload total;
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    const Workload workload = run_workload(seed, GetParam());
    if (::testing::Test::HasFailure()) return;
    total.num_requests += workload.num_requests;
    total.preemptions += workload.preemptions;
    total.cost_chose_swap += workload.cost_chose_swap;
    total.cost_chose_recompute += workload.cost_chose_recompute;
  }
  // The workloads are under pressure, and the cost model decided both ways.
  EXPECT_GT(total.preemptions, total.num_requests / 2);
  if (GetParam() == PreemptionMode::kCheaper) {
    EXPECT_GT(total.cost_chose_swap, 0);
    EXPECT_GT(total.cost_chose_recompute, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, PreemptedRequestsComeBackTest,
                         ::testing::Values(PreemptionMode::kRecompute, PreemptionMode::kSwap,
                                           PreemptionMode::kCheaper),
                         [](const ::testing::TestParamInfo<PreemptionMode>& info) {
                           return std::string(preemption_mode_name(info.param));
                         });

}  // namespace
}  // namespace folio::engine
