// ModelEngine: a Llama-family model served by the engine, with everything it runs on: one page
// pool (the one memory budget, shared by the KV cache and the graph arena), the paged KV cache
// on it, the multi-shape graph arena on it, the graph executor, the real step runner and the
// engine. This is what `folio generate`, `folio bench` and `folio serve` start.
//
// Thread-safety: as Engine: submit/cancel/stats from any thread once started.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "folio/base/metrics.h"
#include "folio/base/thread_pool.h"
#include "folio/device/virtual_memory.h"
#include "folio/engine/engine.h"
#include "folio/engine/memory_pressure_handler.h"
#include "folio/engine/model_step_runner.h"
#include "folio/engine/preemption_cost.h"
#include "folio/exec/executor.h"
#include "folio/exec/multi_shape_arena.h"
#include "folio/kv/block_copier.h"
#include "folio/kv/block_manager.h"
#include "folio/kv/fixed_page_source.h"
#include "folio/kv/host_swap_space.h"
#include "folio/kv/kv_parallel_cache.h"
#include "folio/kv/pool_page_source.h"
#include "folio/lora/adapter_manager.h"
#include "folio/memory/page_pool.h"
#include "folio/model/llama_model.h"

namespace folio::engine {

// What a runner of the engine's steps elsewhere (a pipeline of workers: dist/'s
// PipelineStepRunner) must mirror so that the engine's block ids, slots and step limits mean
// the same there: the KV blocks the block manager hands out (padding blocks included), and the
// executor's buckets and limits.
struct RemoteStepSetup {
  int64_t num_kv_blocks = 0;
  int32_t block_size = 0;
  int32_t max_blocks_per_sequence = 0;
  DType kv_dtype = DType::kF16;
  int64_t first_dummy_block = 0;
  int32_t num_dummy_blocks = 0;
  std::vector<int32_t> bucket_ladder;
  int32_t max_num_tokens = 0;
  int32_t max_sequences = 0;
  int32_t max_logit_rows = 0;
  bool use_graphs = true;
  // A KV-parallel group (dist.md "KV-parallel groups"; ModelEngineOptions::kv_parallel): 1, or
  // the number of members, member g holding positions [g * kv_tokens_per_member, (g + 1) *
  // kv_tokens_per_member) of every sequence in a cache of its own. Every member's cache has the
  // block ids, padding blocks and block size above (num_kv_blocks: one member's blocks;
  // max_blocks_per_sequence: a member's width, kv_tokens_per_member / block_size); every step's
  // batch carries each member's slots and block tables (ir::StepBatch::kv_members), and the
  // runner returns member 0's logits.
  int32_t kv_parallel_members = 1;
  int32_t kv_tokens_per_member = 0;
  // The engine's registry, for the runner's own series (a pipeline's folio_dist_*); outlives
  // the runner.
  metrics::Registry* registry = nullptr;
};

using RemoteRunnerFactory =
    std::function<Result<std::unique_ptr<StepRunner>>(const RemoteStepSetup& setup)>;

struct ModelEngineOptions {
  int num_threads = ThreadPool::default_num_threads();
  int64_t memory_budget_bytes = int64_t{512} << 20;  // the page pool: KV cache + graph arena
  int64_t page_bytes = int64_t{2} << 20;
  // Most bytes of the pool the KV cache may hold (whole pages, at least one); 0: no cap, the KV
  // cache grows into whatever the graph arena and adapters leave.
  int64_t kv_cache_bytes = 0;
  int32_t block_size = 16;
  DType kv_dtype = DType::kF16;
  int32_t max_context_tokens = 0;  // 0: the model's context length
  bool use_graphs = true;          // false: every step eagerly (the reference)
  // Logits rows one step may ask for; 0: one per sequence (scheduler.max_num_sequences).
  // Perplexity asks for every token of a prefill chunk.
  int32_t max_logit_rows = 0;
  // Capture decode buckets at start-up, largest first, within this many seconds, so the graph
  // arena is sized before the KV cache fills the pool. 0: capture on first use only.
  double precapture_seconds = 2.0;
  // Fraction of the KV cache that admitting a sequence must leave obtainable
  // (kv::BlockManagerOptions::watermark).
  double kv_watermark = 0.01;
  PhaseBudgetTunerOptions phase_tuner;  // off by default (phase_budget_tuner.h)
  // Host swap space for preemption by swap (scheduler.preemption_mode kSwap or kCheaper); 0:
  // none. With one the engine measures the host copy bandwidth at start-up and prices
  // recomputes from the model's prefill step graphs (preemption_cost.h), for kCheaper and for
  // Scheduler::set_prefer_cheaper_preemption.
  int64_t swap_bytes = 0;
  SchedulerOptions scheduler;  // scheduler.phase_split: the initial phase split
  uint64_t seed = 0;
  // Serve LoRA adapters: the step graphs get lora ops and an adapter manager holds the tiers
  // (its max_sequences is the scheduler's). Off, the graphs are the base model's alone.
  bool adapters = false;
  lora::AdapterManagerOptions adapter_options;
  // Most of the budget one step's activations may take (an eager step's region, a capture's
  // arena): the per-step token budget and the prefill chunk are cut until a step of that many
  // tokens fits, so a step never fails for memory the KV cache and the arena leave it.
  double max_step_memory_fraction = 0.25;
  // Memory pressure levels and the actions they take (memory_pressure_handler.h).
  MemoryPressureOptions pressure;
  // Time every step per op kind (exec/op_profile.h; `folio bench --profile`); read it with
  // profile() once the engine has stopped. Off, nothing is timed.
  bool profile = false;
  // Run the steps elsewhere (issue 15: a pipeline of workers): called once the block manager
  // and the local executor exist; the engine's steps go through the runner it returns, while
  // the scheduler, block tables and sampler stay here. KV block copies (copy-on-write, swap)
  // are not relayed to the runner: they fail (kFailedPrecondition) instead of leaving the
  // remote caches stale, and swap space and adapters are refused with a remote runner. Null:
  // the local executor runs the steps.
  RemoteRunnerFactory remote_runner;
  // KV-parallel group (seed 003; dist.md "KV-parallel groups"): with members > 1 a sequence's KV
  // is spread by token range over that many caches of kv_cache_bytes each (kv::KvParallelCache),
  // member g holding positions [g * tokens_per_member, (g + 1) * tokens_per_member); admission
  // and appends are per member and all or nothing; preemption is by recompute. Needs a
  // remote_runner (the members run elsewhere: worker processes, or executors on threads),
  // which gets kv_parallel_members and kv_tokens_per_member in its RemoteStepSetup. 0 tokens
  // per member: max_context_tokens / members rounded up to whole blocks. Needs kv_cache_bytes
  // (each member's cache); refuses swap space, adapters and preemption modes other than
  // recompute; memory pressure reads the members' KV utilization (summed) beside the pool. The
  // engine's context limit is members x tokens per member. The coordinator's member block managers
  // sit on page sources whose pages it never touches (kv::FixedPageSource: untouched virtual
  // memory); the KV lives in the members.
  int32_t kv_parallel_members = 1;
  int32_t kv_tokens_per_member = 0;
  // Recovery of the step runner (engine.h "Recovery"; a remote runner that lost a worker): how
  // many recoveries a request may live through, and how often an unavailable runner is asked
  // to recover again (EngineOptions).
  int32_t max_recoveries_per_request = EngineOptions{}.max_recoveries_per_request;
  bool replay_lost_stages = EngineOptions{}.replay_lost_stages;
  Duration recovery_retry_interval = EngineOptions{}.recovery_retry_interval;
};

class ModelEngine {
 public:
  static Result<std::unique_ptr<ModelEngine>> create(std::unique_ptr<model::LlamaModel> model,
                                                     const ModelEngineOptions& options);
  ~ModelEngine();

  Engine& engine() { return *engine_; }
  const model::LlamaModel& model() const { return *model_; }
  memory::PagePool& pool() { return *pool_; }
  exec::Executor& executor() { return *executor_; }
  // The local executor's cache; with a KV-parallel group the engine's cache is
  // kv_parallel_cache() instead (this one then only sizes the local executor).
  kv::BlockManager& block_manager() { return *block_manager_; }
  // Null unless options.kv_parallel_members > 1.
  kv::KvParallelCache* kv_parallel_cache() { return kv_parallel_cache_.get(); }
  // Null unless started with adapters.
  lora::AdapterManager* adapters() { return adapters_.get(); }
  // Null when pressure handling is off.
  MemoryPressureHandler* pressure() { return pressure_.get(); }
  metrics::Registry& registry() { return registry_; }
  // Null unless the scheduler may decide preemptions by cost (with a swap space).
  const PreemptionCostModel* preemption_cost() const { return preemption_cost_.get(); }
  ThreadPool& thread_pool() { return *thread_pool_; }
  // Null unless created with options.profile. Written by the engine's driving thread.
  const exec::OpProfile* profile() const { return profile_.get(); }

 private:
  ModelEngine() = default;
  Status build_memory(const ModelEngineOptions& options);
  Status build_executor(const ModelEngineOptions& options);
  // The KV-parallel group's member block managers and cache; its numbers in remote_setup_.
  Status build_kv_parallel(const ModelEngineOptions& options);
  // The scheduler's options with the token budget and prefill chunk cut to what
  // max_step_memory_fraction of the budget holds.
  Result<SchedulerOptions> fit_steps_to_memory(const ModelEngineOptions& options);
  Status build_preemption_cost(const ModelEngineOptions& options);

  // Declared in construction order; destroyed in reverse.
  metrics::Registry registry_;
  std::unique_ptr<model::LlamaModel> model_;
  std::unique_ptr<ThreadPool> thread_pool_;
  std::unique_ptr<device::VirtualMemory> virtual_memory_;
  std::unique_ptr<memory::PagePool> pool_;
  std::unique_ptr<exec::MultiShapeArena> arena_;
  std::unique_ptr<lora::AdapterManager> adapters_;
  std::unique_ptr<kv::PoolPageSource> page_source_;
  std::unique_ptr<kv::KvBlockCopier> copier_;
  std::unique_ptr<kv::HostSwapSpace> swap_space_;
  std::unique_ptr<kv::BlockManager> block_manager_;
  // A KV-parallel group's members (empty otherwise).
  std::vector<std::unique_ptr<kv::FixedPageSource>> member_sources_;
  std::vector<std::unique_ptr<kv::BlockManager>> member_managers_;
  std::unique_ptr<kv::KvParallelCache> kv_parallel_cache_;
  std::unique_ptr<exec::OpProfile> profile_;
  std::unique_ptr<exec::Executor> executor_;
  std::unique_ptr<ModelStepRunner> runner_;
  RemoteStepSetup remote_setup_;               // filled by build_executor
  std::unique_ptr<StepRunner> remote_runner_;  // null unless options.remote_runner
  std::unique_ptr<MemoryPressureHandler> pressure_;
  std::unique_ptr<PreemptionCostModel> preemption_cost_;
  std::unique_ptr<CostCalibratingStepRunner> calibrating_runner_;
  std::unique_ptr<Engine> engine_;
};

}  // namespace folio::engine
