// MemoryPressureHandler: the engine's response to memory pressure (seed 002 §11.3). Once per
// step, before scheduling, it measures how full the one budget is, turns that into a pressure
// level (memory/memory_pressure.h: hysteresis between levels) and acts, each level adding to
// the actions of the levels below it:
//
//   warning        evicts cold content down to the warning level's exit threshold: the pool's
//                  unpinned allocations in its eviction order (seed 001 §7.2: content priority,
//                  recency and size, so unused adapters' pages go before KV pages that only
//                  hold CACHED prefix blocks); graph captures idle for idle_capture_steps give
//                  their pages back; the scheduler stops prefetching adapters.
//   critical       the scheduler admits no new request (preempted ones may still come back:
//                  they are not new), cuts the prefill chunk, and preempts the cheaper way
//                  (recompute or swap, by cost) when it must.
//   out of memory  a failed KV append preempts (as always); with preempt_ahead, when the pool
//                  itself is out of memory the scheduler also preempts one running sequence per
//                  step (its usual victim) before scheduling, and the warning eviction reclaims
//                  what the victim left CACHED.
//
// Two levels are tracked, with the same thresholds. The budget's level follows the larger of
// the pool's utilization (pinned and reserved pages, over its pages: evictable ones the pool
// reclaims on demand, and an uncapped KV cache grows into every free page) and the KV cache's
// (OWNED blocks over the blocks it may hold; CACHED ones the cache reuses by itself), and a step
// whose appends had to preempt counts as a failed allocation (out of memory at once); the
// scheduler's actions answer it. The pool's own level answers the actions that give pages back
// (eviction, idle captures, pool preemption): under a KV cap the pool may be nearly empty while the
// KV cache is full, and evicting adapters or captures would then free nothing the KV cache can use.
//
// Every level change and every action shows in /metrics (folio_memory_pressure_*).
//
// Thread-safety: the engine thread only (like the block manager it drives); the pool it reads
// is thread-safe, and its metrics may be rendered from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>

#include "folio/base/metrics.h"
#include "folio/base/result.h"
#include "folio/engine/scheduler.h"
#include "folio/kv/block_manager.h"
#include "folio/kv/kv_cache.h"
#include "folio/memory/memory_pressure.h"
#include "folio/memory/page_pool.h"

namespace folio::engine {

struct MemoryPressureOptions {
  bool enabled = true;  // off: no level is computed, nothing reacts (the scheduler as before)
  memory::PressureThresholds thresholds;
  // Critical: the prefill chunk is cut to this fraction of the scheduler's, at least
  // min_prefill_chunk tokens.
  double critical_chunk_fraction = 0.25;
  int32_t min_prefill_chunk = 16;
  // Warning: captures not replayed in this many steps give their pages back.
  int64_t idle_capture_steps = 64;
  // Out of memory in the pool: preempt one running sequence per step ahead of failed appends.
  // Off by default: measured on the demo model with a 24 MiB budget and 16 adapters, it
  // preempted about once per step at that level and raised TTFT, since a KV cache that grows
  // into every free page pins the whole pool under any full load; failed appends preempt anyway.
  bool preempt_ahead = false;

  Status validate() const;
};

// Which actions are in force at a level (a pure function, for the engine and for tests).
struct PressureActions {
  bool evict_cold_content = false;
  bool release_idle_captures = false;
  bool stop_prefetch = false;
  bool stop_admission = false;
  bool shrink_prefill_chunk = false;
  bool prefer_cheaper_preemption = false;
  bool preempt = false;
};
PressureActions pressure_actions(memory::PressureLevel level);

// What the handler reads and acts on; borrowed, must outlive it.
struct PressureSources {
  memory::PagePool* pool = nullptr;           // required
  kv::BlockManager* block_manager = nullptr;  // required unless kv_cache is set
  // The cache whose OWNED blocks count instead of block_manager's: a KV-parallel group
  // (kv/kv_cache.h), its utilization summed over the members. Null: block_manager.
  kv::KvCache* kv_cache = nullptr;
  // Gives back the pages of graph captures idle for at least the given steps; returns the bytes
  // given back. Empty: no graph executor to ask.
  std::function<int64_t(int64_t idle_steps)> release_idle_captures;
  metrics::Registry* registry = nullptr;  // required
};

// Totals since creation (also exported as metrics).
struct PressureCounts {
  int64_t steps_at_level[memory::kNumPressureLevels] = {};
  int64_t pages_evicted = 0;  // pool pages evicted by pressure (any content)
  int64_t adapter_pages_evicted = 0;
  int64_t kv_pages_evicted = 0;
  int64_t graph_bytes_released = 0;
  int64_t preemptions = 0;  // sequences preempted because pressure asked
};

class MemoryPressureHandler {
 public:
  // kInvalidArgument for bad options or missing sources; metric families that conflict.
  static Result<std::unique_ptr<MemoryPressureHandler>> create(const MemoryPressureOptions& options,
                                                               const PressureSources& sources);

  // Engine thread, before each schedule(): observes, acts, and sets the scheduler's pressure.
  // `allocation_failed`: the last step had to preempt for lack of KV blocks.
  memory::PressureLevel before_schedule(Scheduler& scheduler, bool allocation_failed);
  // Engine thread, after schedule(): counts the preemptions pressure asked for.
  void after_schedule(const StepPlan& plan);

  // The budget's utilization now, in [0, 1] (see the header comment).
  double utilization() const;
  memory::PressureLevel level() const { return tracker_.level(); }
  const PressureCounts& counts() const { return counts_; }
  const MemoryPressureOptions& options() const { return options_; }

 private:
  MemoryPressureHandler(const MemoryPressureOptions& options, const PressureSources& sources);
  Status register_metrics(metrics::Registry& registry);
  // The warning level's eviction: down to the warning exit threshold where evictable content
  // allows.
  void evict_cold_content();
  double pool_utilization() const;
  double kv_utilization() const;

  const MemoryPressureOptions options_;
  const PressureSources sources_;
  memory::PressureTracker tracker_;       // the budget's level: pool and KV cache
  memory::PressureTracker pool_tracker_;  // the pool's alone: what frees pages answers it
  PressureCounts counts_;

  metrics::Gauge* level_gauge_ = nullptr;
  metrics::Gauge* utilization_gauge_ = nullptr;
  std::array<metrics::Counter*, memory::kNumPressureLevels> entered_{};
  std::array<metrics::Counter*, memory::kNumPressureLevels> steps_{};
  metrics::Counter* evicted_adapter_pages_ = nullptr;
  metrics::Counter* evicted_kv_pages_ = nullptr;
  metrics::Counter* evicted_other_pages_ = nullptr;
  metrics::Counter* released_graph_bytes_ = nullptr;
  metrics::Counter* preemptions_ = nullptr;
};

}  // namespace folio::engine
