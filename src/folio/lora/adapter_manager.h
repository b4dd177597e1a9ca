// AdapterManager: multi-tenant LoRA serving (seed 001 §9): registered adapters move between
// three residency tiers, and each step's adapters are bound to the adapter table the step
// graphs' lora ops read (kernels/lora.h, exec/tensor_binding.h).
//
// Tiers (every registered adapter is in exactly one):
//   hot   f16 weights in pages of the page pool (content type adapter_weights), in the one
//         budget with the KV cache and the graph arena; each adapter takes the pages its own
//         rank needs, never a maximum rank's. While unused its pages are evictable, and the
//         pool's eviction order (seed 001 §7.2) takes them before KV.
//   warm  int8 weights (a scale per 32 values) in host memory outside the pool, which the lora
//         kernel computes on directly: no decompression on the request path.
//   cold  the file on disk: metadata only (adapter_registry.h).
// A load (cold -> hot or warm) and a promotion (warm -> hot) read the file on the loader
// thread; their results are published on the engine thread at the next maintain(), so the
// table and the tiers change only between steps. A demand load goes to hot when the hot budget
// has room and to warm otherwise.
//
// Residency by access frequency (seed 001 §9.2), with hysteresis: an adapter's frequency is the
// number of steps, in a sliding window of `window_steps` steps, in which a sequence was admitted
// with it (a long decode is one use, not one per step). A warm adapter at or
// above promote_frequency is promoted to hot when the hot budget has room (making room by
// demoting hot adapters whose frequency is below demote_frequency); a hot adapter below
// demote_frequency is demoted to warm when the room is needed. Warm adapters beyond the warm
// budget go cold, least recently used first. The pool evicting a hot adapter's pages (under
// memory pressure) sends it to cold.
//
// In use: a running sequence holds its adapter (acquire .. release). A held adapter is pinned:
// its pool pages are pinned, it never changes tier, and it is never unloaded, so a sequence's
// tokens never depend on when a promotion happened. Unloading an adapter in use stops new
// requests at once and frees it when its last sequence ends.
//
// Thread-safety: register_adapter, unregister_adapter, find, list, stats may be called from
// any thread; acquire, release, prefetch, bind_step, end_step only from the engine thread. The
// loader thread touches only its job and result queues (and the pool, which is thread-safe).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "folio/base/metrics.h"
#include "folio/base/mutex.h"
#include "folio/base/result.h"
#include "folio/exec/host_buffer.h"
#include "folio/exec/tensor_binding.h"
#include "folio/kernels/lora.h"
#include "folio/lora/adapter_registry.h"
#include "folio/memory/page_pool.h"
#include "folio/model/llama_model_file.h"

namespace folio::lora {

enum class AdapterTier : uint8_t { kCold, kWarm, kHot };
std::string_view adapter_tier_name(AdapterTier tier);  // "cold", "warm", "hot"

struct AdapterManagerOptions {
  // Most sequences of one step (the engine's max_num_sequences): the table has one slot per
  // sequence plus slot 0 (no adapter).
  int32_t max_sequences = 64;
  // Most pool bytes hot adapters may hold; 0: whatever the pool gives.
  int64_t hot_budget_bytes = 0;
  // Most host bytes warm adapters may hold.
  int64_t warm_budget_bytes = int64_t{256} << 20;
  int64_t window_steps = 256;
  int32_t promote_frequency = 8;  // >= demote_frequency
  int32_t demote_frequency = 2;
  // Waiting requests the scheduler looks ahead to prefetch adapters for.
  int32_t prefetch_lookahead = 8;
  metrics::Registry* metrics = nullptr;  // may be null; must outlive the manager
};

struct AdapterTierStats {
  int64_t adapters = 0;
  int64_t bytes = 0;
};

struct AdapterManagerStats {
  AdapterTierStats hot, warm;
  int64_t registered = 0;
  int64_t loading = 0;
  int64_t held = 0;  // adapters held by running sequences
};

enum class AdapterReadiness : uint8_t {
  kReady,    // resident; the caller now holds it (release() when the sequence stops running)
  kLoading,  // not resident; a load is in flight (the caller retries later)
};

class AdapterManager final : private memory::EvictionListener {
 public:
  // Starts the loader thread. `pool` holds the hot tier and must outlive the manager.
  static Result<std::unique_ptr<AdapterManager>> create(const model::LlamaShape& base,
                                                        memory::PagePool& pool,
                                                        AdapterManagerOptions options);
  // Stops the loader thread and frees every tier. Requires: nothing is held.
  ~AdapterManager();
  AdapterManager(const AdapterManager&) = delete;
  AdapterManager& operator=(const AdapterManager&) = delete;

  // ---- Any thread -------------------------------------------------------------------------
  Result<AdapterInfo> register_adapter(const std::string& name, const std::string& path,
                                       float user_scale = 1.0f);
  // New requests for `name` fail from now on; its weights go when no sequence holds it.
  Status unregister_adapter(const std::string& name);
  std::optional<AdapterInfo> find(const std::string& name) const { return registry_.find(name); }
  std::optional<AdapterInfo> get(AdapterId id) const { return registry_.get(id); }
  std::vector<AdapterInfo> list() const { return registry_.list(); }
  AdapterManagerStats stats() const;
  const AdapterRegistry& registry() const { return registry_; }

  // The table the step graphs' lora ops read; fixed for the manager's life.
  exec::AdapterTableBinding table_binding() const;

  // ---- Engine thread ----------------------------------------------------------------------
  // Holds `id` for a sequence about to run when it is resident; otherwise starts loading it.
  // Errors: kNotFound for an adapter not registered (or unregistered), or the error its load
  // failed with (reported once, to the request that asked; a later acquire tries again).
  Result<AdapterReadiness> acquire(AdapterId id);
  // Requires: held by a previous successful acquire.
  void release(AdapterId id);
  // Starts loading `id` if it is cold and not loading (a request that will want it soon).
  void prefetch(AdapterId id);
  // Binds the step's adapters to table slots and returns the slot of each sequence (valid until
  // the next call). Requires: every non-zero id is held.
  std::span<const int32_t> bind_step(std::span<const int64_t> adapter_ids);
  // Between steps: publishes finished loads, applies evictions and unloads, rebalances the
  // tiers.
  void maintain();
  // Waits until no load is in flight and publishes them (tests and benchmarks).
  void wait_for_loads();
  int32_t prefetch_lookahead() const { return options_.prefetch_lookahead; }
  // The tier `id` is in now (kCold for unknown ids).
  AdapterTier tier(AdapterId id) const;
  // Aborts unless every adapter is in exactly one tier, the tier byte counts add up, held
  // adapters are resident with pinned hot pages, and the table's slots are consistent.
  void check_invariants() const;

 private:
  struct Resident;
  struct Adapter;
  struct LoadJob;
  struct LoadResult;

  AdapterManager(const model::LlamaShape& base, memory::PagePool& pool,
                 AdapterManagerOptions options);
  Status register_metrics();
  void on_evict(const memory::EvictionNotice& notice) override;

  // Engine thread.
  Adapter* adapter(AdapterId id);
  void start_load(Adapter& adapter, AdapterTier target, bool demand);
  void publish_loads();
  void apply_evictions();
  void rebalance();
  void apply_unregistrations();
  void free_unloaded();
  bool make_warm_room(int64_t bytes, AdapterId keep);
  // The least recently used adapter of `tier` that is neither held, loading nor `keep`; null
  // when there is none.
  Adapter* least_recently_used(AdapterTier tier, AdapterId keep);
  bool make_hot_room(int64_t bytes, AdapterId keep, int32_t frequency);
  // Pool bytes `info`'s hot copy takes: its f16 weights rounded up to whole pages.
  int64_t hot_footprint(const AdapterInfo& info) const;
  bool hot_has_room(int64_t bytes) const;
  // Sends least recently used idle hot adapters cold until `bytes` fit the hot budget.
  bool evict_hot(int64_t bytes, AdapterId keep);
  void drop_tier(Adapter& adapter);
  void install(Adapter& adapter, std::unique_ptr<Resident> resident);
  int32_t frequency(const Adapter& adapter) const;
  void note_access(Adapter& adapter);
  void update_gauges();

  // Loader thread.
  void loader_loop();
  std::unique_ptr<LoadResult> load(const LoadJob& job);

  const model::LlamaShape base_;
  memory::PagePool& pool_;
  const AdapterManagerOptions options_;
  AdapterRegistry registry_;
  const int32_t num_targets_;
  const int32_t num_slots_;
  std::vector<kernels::LoraSlotWeights> table_;  // [num_targets, num_slots]

  // Engine thread state.
  std::unordered_map<AdapterId, std::unique_ptr<Adapter>> adapters_;
  int64_t step_ = 0;
  int64_t hot_bytes_ = 0;
  int64_t warm_bytes_ = 0;
  int64_t hot_count_ = 0;             // adapters in the hot tier
  int64_t warm_count_ = 0;            // adapters in the warm tier
  int64_t unregistered_waiting_ = 0;  // unregistered adapters not freed yet
  int64_t hot_reserved_ = 0;          // bytes of loads in flight to hot
  int64_t warm_reserved_ = 0;         // bytes of loads in flight to warm
  int64_t loads_in_flight_ = 0;
  std::vector<int32_t> step_slots_;
  std::vector<AdapterId> slot_owner_;

  // Pool evictions (reported by on_evict on whichever thread allocated) and unregistrations
  // (any thread), applied by the engine thread.
  Mutex notices_mutex_;
  std::vector<uint64_t> evicted_ FOLIO_GUARDED_BY(notices_mutex_);
  std::vector<AdapterId> unregistered_ FOLIO_GUARDED_BY(notices_mutex_);

  // Read by stats() from any thread; written by the engine thread. Relaxed: each is a
  // statistic standing on its own.
  std::atomic<int64_t> hot_adapters_{0}, warm_adapters_{0}, hot_bytes_seen_{0}, warm_bytes_seen_{0},
      loading_seen_{0}, held_seen_{0};

  // Loader queues.
  Mutex queue_mutex_;
  std::condition_variable queue_changed_;    // a job was queued, or stopping_ set
  std::condition_variable results_changed_;  // a result was queued
  std::deque<LoadJob> demand_jobs_ FOLIO_GUARDED_BY(queue_mutex_);
  std::deque<LoadJob> background_jobs_ FOLIO_GUARDED_BY(queue_mutex_);
  std::vector<std::unique_ptr<LoadResult>> results_ FOLIO_GUARDED_BY(queue_mutex_);
  bool stopping_ FOLIO_GUARDED_BY(queue_mutex_) = false;
  std::thread loader_;

  // Metrics (null without a registry).
  struct Metrics;
  std::unique_ptr<Metrics> metrics_;
};

}  // namespace folio::lora
