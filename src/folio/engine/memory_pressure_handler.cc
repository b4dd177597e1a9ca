#include "folio/engine/memory_pressure_handler.h"

#include <algorithm>
#include <cmath>

namespace folio::engine {

using memory::PressureLevel;

Status MemoryPressureOptions::validate() const {
  FOLIO_RETURN_IF_ERROR(thresholds.validate());
  if (!(critical_chunk_fraction > 0.0 && critical_chunk_fraction <= 1.0)) {
    return invalid_argument("critical prefill chunk fraction {} must be in (0, 1]",
                            critical_chunk_fraction);
  }
  if (min_prefill_chunk < 1) {
    return invalid_argument("smallest prefill chunk under pressure {} must be at least 1",
                            min_prefill_chunk);
  }
  if (idle_capture_steps < 1) {
    return invalid_argument("idle steps before a capture gives its pages back {} must be >= 1",
                            idle_capture_steps);
  }
  return Status();
}

PressureActions pressure_actions(PressureLevel level) {
  PressureActions actions;
  switch (level) {
    case PressureLevel::kOutOfMemory:
      actions.preempt = true;
      [[fallthrough]];
    case PressureLevel::kCritical:
      actions.stop_admission = true;
      actions.shrink_prefill_chunk = true;
      actions.prefer_cheaper_preemption = true;
      [[fallthrough]];
    case PressureLevel::kWarning:
      actions.evict_cold_content = true;
      actions.release_idle_captures = true;
      actions.stop_prefetch = true;
      [[fallthrough]];
    case PressureLevel::kNormal:
      break;
  }
  return actions;
}

Result<std::unique_ptr<MemoryPressureHandler>> MemoryPressureHandler::create(
    const MemoryPressureOptions& options, const PressureSources& sources) {
  FOLIO_RETURN_IF_ERROR(options.validate());
  if (sources.pool == nullptr ||
      (sources.block_manager == nullptr && sources.kv_cache == nullptr) ||
      sources.registry == nullptr) {
    return invalid_argument("memory pressure handling needs the pool, the KV cache and a registry");
  }
  std::unique_ptr<MemoryPressureHandler> handler(new MemoryPressureHandler(options, sources));
  FOLIO_RETURN_IF_ERROR(handler->register_metrics(*sources.registry));
  return handler;
}

MemoryPressureHandler::MemoryPressureHandler(const MemoryPressureOptions& options,
                                             const PressureSources& sources)
    : options_(options),
      sources_(sources),
      tracker_(options.thresholds),
      pool_tracker_(options.thresholds) {}

Status MemoryPressureHandler::register_metrics(metrics::Registry& registry) {
  FOLIO_ASSIGN_OR_RETURN(
      level_gauge_,
      registry.gauge("folio_memory_pressure_level",
                     "Memory pressure level: 0 normal, 1 warning, 2 critical, 3 out of memory."));
  FOLIO_ASSIGN_OR_RETURN(
      utilization_gauge_,
      registry.gauge("folio_memory_pressure_utilization",
                     "Fraction of the memory budget held (the larger of the pool's and the KV "
                     "cache's), as last observed."));
  for (PressureLevel level : memory::kAllPressureLevels) {
    const metrics::Labels labels = {{"level", std::string(memory::pressure_level_name(level))}};
    const auto index = static_cast<size_t>(level);
    FOLIO_ASSIGN_OR_RETURN(entered_[index],
                           registry.counter("folio_memory_pressure_transitions_total",
                                            "Times each pressure level was entered.", labels));
    FOLIO_ASSIGN_OR_RETURN(
        steps_[index], registry.counter("folio_memory_pressure_steps_total",
                                        "Engine steps scheduled at each pressure level.", labels));
  }
  const std::string evicted = "folio_memory_pressure_evicted_pages_total";
  const std::string evicted_help = "Pool pages evicted by memory pressure, by content.";
  FOLIO_ASSIGN_OR_RETURN(evicted_adapter_pages_,
                         registry.counter(evicted, evicted_help, {{"content", "adapter_weights"}}));
  FOLIO_ASSIGN_OR_RETURN(evicted_kv_pages_,
                         registry.counter(evicted, evicted_help, {{"content", "kv_cache"}}));
  FOLIO_ASSIGN_OR_RETURN(evicted_other_pages_,
                         registry.counter(evicted, evicted_help, {{"content", "other"}}));
  FOLIO_ASSIGN_OR_RETURN(
      released_graph_bytes_,
      registry.counter("folio_memory_pressure_released_graph_bytes_total",
                       "Bytes idle graph captures gave back under memory pressure."));
  FOLIO_ASSIGN_OR_RETURN(preemptions_,
                         registry.counter("folio_memory_pressure_preemptions_total",
                                          "Sequences preempted because memory was out."));
  return Status();
}

double MemoryPressureHandler::pool_utilization() const {
  const memory::PoolStats stats = sources_.pool->stats();
  if (stats.num_pages == 0) return 0.0;
  // Evictable pages are not pressure: the pool reclaims them on demand. An uncapped KV cache
  // grows into every free page, so counting them would keep the pool "full" under any load.
  const int64_t pinned = stats.pages_pinned + stats.pages_reserved;
  return static_cast<double>(pinned) / static_cast<double>(stats.num_pages);
}

double MemoryPressureHandler::kv_utilization() const {
  if (sources_.kv_cache != nullptr) {
    const kv::KvCache& cache = *sources_.kv_cache;
    const int64_t capacity = cache.total_sequence_blocks() + cache.total_reserved_blocks();
    if (capacity <= 0) return 0.0;
    return static_cast<double>(cache.total_counts().owned) / static_cast<double>(capacity);
  }
  const kv::BlockManager& block_manager = *sources_.block_manager;
  const int64_t capacity = block_manager.allocator().max_held_blocks();
  if (capacity <= 0) return 0.0;
  // CACHED blocks are not counted: the KV cache reuses them by itself when it needs blocks.
  return static_cast<double>(block_manager.counts().owned) / static_cast<double>(capacity);
}

double MemoryPressureHandler::utilization() const {
  return std::max(pool_utilization(), kv_utilization());
}

void MemoryPressureHandler::evict_cold_content() {
  const double target = options_.thresholds.warning.exit;
  memory::PagePool& pool = *sources_.pool;
  // The pool's own eviction order already ranks content by the seed's priorities (unused
  // adapters before KV pages that hold only CACHED blocks); held pages go down to the target.
  const memory::PoolStats before = pool.stats();
  const auto target_pages =
      static_cast<int64_t>(std::floor(target * static_cast<double>(before.num_pages)));
  const int64_t held = before.num_pages - before.pages_free - before.pages_thread_held;
  if (held >= target_pages) {
    Result<int64_t> evicted = pool.evict(held - target_pages + 1);
    if (evicted.ok() && *evicted > 0) {
      const memory::PoolStats after = pool.stats();
      const auto evicted_of = [&](memory::ContentType content) {
        const auto index = static_cast<size_t>(memory::content_index(content));
        return after.per_content[index].pages_evicted - before.per_content[index].pages_evicted;
      };
      const int64_t adapter = evicted_of(memory::ContentType::kAdapterWeights);
      const int64_t kv = evicted_of(memory::ContentType::kKvCache);
      counts_.pages_evicted += *evicted;
      counts_.adapter_pages_evicted += adapter;
      counts_.kv_pages_evicted += kv;
      evicted_adapter_pages_->increment(static_cast<double>(adapter));
      evicted_kv_pages_->increment(static_cast<double>(kv));
      evicted_other_pages_->increment(static_cast<double>(*evicted - adapter - kv));
    }
  }
}

PressureLevel MemoryPressureHandler::before_schedule(Scheduler& scheduler, bool allocation_failed) {
  const double pool = pool_utilization();
  const double observed = std::max(pool, kv_utilization());
  const PressureLevel previous = tracker_.level();
  const PressureLevel level = tracker_.observe(observed, allocation_failed);
  const PressureLevel pool_level = pool_tracker_.observe(pool);
  if (level != previous) entered_[static_cast<size_t>(level)]->increment();
  ++counts_.steps_at_level[static_cast<size_t>(level)];
  steps_[static_cast<size_t>(level)]->increment();
  level_gauge_->set(static_cast<double>(level));
  utilization_gauge_->set(observed);

  // What gives pages back to the pool answers the pool's own level: under a KV cap the pool
  // may be nearly empty while the KV cache is full, and evicting adapters or graph captures
  // then frees nothing the KV cache can use.
  const PressureActions actions = pressure_actions(level);
  const PressureActions pool_actions = pressure_actions(pool_level);
  if (pool_actions.evict_cold_content) evict_cold_content();
  if (pool_actions.release_idle_captures && sources_.release_idle_captures) {
    const int64_t bytes = sources_.release_idle_captures(options_.idle_capture_steps);
    counts_.graph_bytes_released += bytes;
    released_graph_bytes_->increment(static_cast<double>(bytes));
  }
  SchedulerPressure pressure;
  pressure.prefetch_adapters = !actions.stop_prefetch;
  pressure.admit_new = !actions.stop_admission;
  if (actions.shrink_prefill_chunk) {
    const int32_t chunk = scheduler.options().prefill_chunk_size;
    pressure.prefill_chunk_limit = std::max(
        options_.min_prefill_chunk,
        static_cast<int32_t>(static_cast<double>(chunk) * options_.critical_chunk_fraction));
  }
  pressure.prefer_cheaper_preemption = actions.prefer_cheaper_preemption;
  // A failed append already preempted what it needed; more preemption helps only when the
  // pool itself is out of pages.
  if (pool_actions.preempt && options_.preempt_ahead) pressure.preemptions = 1;
  scheduler.set_pressure(pressure);
  return level;
}

void MemoryPressureHandler::after_schedule(const StepPlan& plan) {
  counts_.preemptions += plan.num_preempted_for_pressure;
  preemptions_->increment(static_cast<double>(plan.num_preempted_for_pressure));
}

}  // namespace folio::engine
