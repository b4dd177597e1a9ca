#include "folio/lora/adapter_manager.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "folio/base/check.h"
#include "folio/base/log.h"
#include "folio/lora/adapter_file.h"
#include "folio/model/llama_adapter_targets.h"

namespace folio::lora {

// One tier's copy of an adapter's weights.
struct AdapterManager::Resident {
  AdapterTier tier = AdapterTier::kCold;
  memory::PageAllocation pages;                   // hot
  exec::HostBuffer heap;                          // warm
  std::vector<kernels::LoraSlotWeights> weights;  // one per target of the base
  int64_t bytes = 0;
};

struct AdapterManager::Adapter {
  AdapterInfo info;
  std::unique_ptr<Resident> resident;  // null: cold
  // A finished promotion or demotion waiting for the holders to go (a held adapter never
  // changes tier).
  std::unique_ptr<Resident> pending;
  int32_t holders = 0;
  bool loading = false;
  bool unregistered = false;
  std::optional<Status> load_error;  // reported to the next acquire
  std::deque<int64_t> uses;          // steps that used it, within the window
  int64_t last_use = -1;
  // A demand load was counted as a cold miss; the acquire it was for is not also a hit.
  bool miss_counted = false;
};

struct AdapterManager::LoadJob {
  AdapterInfo info;
  AdapterTier target = AdapterTier::kWarm;
  bool demand = false;
};

struct AdapterManager::LoadResult {
  AdapterId id = 0;
  AdapterTier target = AdapterTier::kWarm;  // what was asked (the resident may differ)
  bool demand = false;
  Status status;
  std::unique_ptr<Resident> resident;
  double seconds = 0.0;
};

struct AdapterManager::Metrics {
  metrics::Counter* requests_hot = nullptr;
  metrics::Counter* requests_warm = nullptr;
  metrics::Counter* requests_cold = nullptr;
  metrics::Histogram* load_hot = nullptr;
  metrics::Histogram* load_warm = nullptr;
  metrics::Counter* promotions = nullptr;
  metrics::Counter* demotions = nullptr;
  metrics::Counter* evictions = nullptr;
  metrics::Counter* load_failures = nullptr;
};

std::string_view adapter_tier_name(AdapterTier tier) {
  switch (tier) {
    case AdapterTier::kCold:
      return "cold";
    case AdapterTier::kWarm:
      return "warm";
    case AdapterTier::kHot:
      return "hot";
  }
  return "invalid";
}

AdapterManager::AdapterManager(const model::LlamaShape& base, memory::PagePool& pool,
                               AdapterManagerOptions options)
    : base_(base),
      pool_(pool),
      options_(options),
      registry_(base),
      num_targets_(static_cast<int32_t>(model::llama_adapter_targets(base).size())),
      num_slots_(options.max_sequences + 1),
      table_(static_cast<size_t>(num_targets_) * static_cast<size_t>(num_slots_)),
      slot_owner_(static_cast<size_t>(num_slots_), 0) {}

Result<std::unique_ptr<AdapterManager>> AdapterManager::create(const model::LlamaShape& base,
                                                               memory::PagePool& pool,
                                                               AdapterManagerOptions options) {
  if (options.max_sequences < 1) {
    return invalid_argument("adapter table needs max_sequences >= 1, got {}",
                            options.max_sequences);
  }
  if (options.hot_budget_bytes < 0 || options.warm_budget_bytes < 0) {
    return invalid_argument("adapter budgets must not be negative (hot {} B, warm {} B)",
                            options.hot_budget_bytes, options.warm_budget_bytes);
  }
  if (options.window_steps < 1 || options.demote_frequency < 0 ||
      options.promote_frequency < options.demote_frequency) {
    return invalid_argument(
        "adapter residency needs window_steps >= 1 and 0 <= demote_frequency <= "
        "promote_frequency (got {}, {}, {})",
        options.window_steps, options.demote_frequency, options.promote_frequency);
  }
  if (options.prefetch_lookahead < 0) {
    return invalid_argument("prefetch lookahead {} must not be negative",
                            options.prefetch_lookahead);
  }
  std::unique_ptr<AdapterManager> manager(new AdapterManager(base, pool, options));
  FOLIO_RETURN_IF_ERROR(manager->register_metrics());
  manager->loader_ = std::thread([raw = manager.get()] { raw->loader_loop(); });
  return manager;
}

AdapterManager::~AdapterManager() {
  {
    MutexLock lock(queue_mutex_);
    stopping_ = true;
    demand_jobs_.clear();
    background_jobs_.clear();
  }
  queue_changed_.notify_all();
  if (loader_.joinable()) loader_.join();
  // The gauge functions read this manager; they go with it.
  if (metrics_ != nullptr) {
    for (const AdapterTier tier : {AdapterTier::kHot, AdapterTier::kWarm, AdapterTier::kCold}) {
      const metrics::Labels labels{{"tier", std::string(adapter_tier_name(tier))}};
      (void)options_.metrics->remove_gauge_function("folio_lora_adapters", labels);
      if (tier != AdapterTier::kCold) {
        (void)options_.metrics->remove_gauge_function("folio_lora_bytes", labels);
      }
    }
  }
  for (const auto& [id, adapter] : adapters_) {
    FOLIO_CHECK(adapter->holders == 0, "adapter {} is still held by {} sequences", id,
                adapter->holders);
  }
  // Resident copies free their pool pages and heap buffers as they go.
  MutexLock lock(queue_mutex_);
  results_.clear();
}

Status AdapterManager::register_metrics() {
  if (options_.metrics == nullptr) return Status();
  metrics::Registry& registry = *options_.metrics;
  auto metrics = std::make_unique<Metrics>();
  const std::string requests = "folio_lora_requests_total";
  const std::string requests_help =
      "Requests admitted with an adapter, by the tier it was in (cold: a miss that loaded it).";
  FOLIO_ASSIGN_OR_RETURN(metrics->requests_hot,
                         registry.counter(requests, requests_help, {{"tier", "hot"}}));
  FOLIO_ASSIGN_OR_RETURN(metrics->requests_warm,
                         registry.counter(requests, requests_help, {{"tier", "warm"}}));
  FOLIO_ASSIGN_OR_RETURN(metrics->requests_cold,
                         registry.counter(requests, requests_help, {{"tier", "cold"}}));
  const std::vector<double> bounds{1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0};
  const std::string load = "folio_lora_load_seconds";
  const std::string load_help = "Time to bring an adapter into a tier (read, convert, place).";
  FOLIO_ASSIGN_OR_RETURN(metrics->load_hot,
                         registry.histogram(load, load_help, bounds, {{"tier", "hot"}}));
  FOLIO_ASSIGN_OR_RETURN(metrics->load_warm,
                         registry.histogram(load, load_help, bounds, {{"tier", "warm"}}));
  FOLIO_ASSIGN_OR_RETURN(metrics->promotions, registry.counter("folio_lora_promotions_total",
                                                               "Adapters moved from warm to hot."));
  FOLIO_ASSIGN_OR_RETURN(metrics->demotions,
                         registry.counter("folio_lora_demotions_total",
                                          "Adapters moved from hot to warm, or warm to cold."));
  FOLIO_ASSIGN_OR_RETURN(
      metrics->evictions,
      registry.counter("folio_lora_evictions_total",
                       "Hot adapters whose pool pages were evicted under memory pressure."));
  FOLIO_ASSIGN_OR_RETURN(metrics->load_failures,
                         registry.counter("folio_lora_load_failures_total",
                                          "Adapter loads that failed (the request that asked "
                                          "failed with the error)."));
  // Set before the gauge functions, so the destructor removes whichever were registered.
  metrics_ = std::move(metrics);
  for (const AdapterTier tier : {AdapterTier::kHot, AdapterTier::kWarm, AdapterTier::kCold}) {
    const metrics::Labels labels{{"tier", std::string(adapter_tier_name(tier))}};
    FOLIO_RETURN_IF_ERROR(registry.gauge_function(
        "folio_lora_adapters", "Registered adapters by residency tier.", labels, [this, tier] {
          const AdapterManagerStats now = stats();
          if (tier == AdapterTier::kHot) return static_cast<double>(now.hot.adapters);
          if (tier == AdapterTier::kWarm) return static_cast<double>(now.warm.adapters);
          return static_cast<double>(now.registered - now.hot.adapters - now.warm.adapters);
        }));
    if (tier == AdapterTier::kCold) continue;
    FOLIO_RETURN_IF_ERROR(registry.gauge_function(
        "folio_lora_bytes", "Bytes of adapter weights by tier.", labels, [this, tier] {
          const AdapterManagerStats now = stats();
          return static_cast<double>(tier == AdapterTier::kHot ? now.hot.bytes : now.warm.bytes);
        }));
  }
  return Status();
}

// ---- Any thread -------------------------------------------------------------------------

Result<AdapterInfo> AdapterManager::register_adapter(const std::string& name,
                                                     const std::string& path, float user_scale) {
  return registry_.add(name, path, user_scale);
}

Status AdapterManager::unregister_adapter(const std::string& name) {
  FOLIO_ASSIGN_OR_RETURN(const AdapterInfo info, registry_.remove(name));
  MutexLock lock(notices_mutex_);
  unregistered_.push_back(info.id);
  return Status();
}

AdapterManagerStats AdapterManager::stats() const {
  AdapterManagerStats stats;
  stats.hot = {hot_adapters_.load(std::memory_order_relaxed),
               hot_bytes_seen_.load(std::memory_order_relaxed)};
  stats.warm = {warm_adapters_.load(std::memory_order_relaxed),
                warm_bytes_seen_.load(std::memory_order_relaxed)};
  stats.registered = registry_.size();
  stats.loading = loading_seen_.load(std::memory_order_relaxed);
  stats.held = held_seen_.load(std::memory_order_relaxed);
  return stats;
}

exec::AdapterTableBinding AdapterManager::table_binding() const {
  return exec::AdapterTableBinding{table_.data(), num_targets_, num_slots_,
                                   static_cast<int32_t>(base_.hidden_size)};
}

void AdapterManager::on_evict(const memory::EvictionNotice& notice) {
  MutexLock lock(notices_mutex_);
  evicted_.push_back(notice.owner);
}

// ---- Engine thread ----------------------------------------------------------------------

AdapterManager::Adapter* AdapterManager::adapter(AdapterId id) {
  auto found = adapters_.find(id);
  if (found != adapters_.end()) return found->second.get();
  std::optional<AdapterInfo> info = registry_.get(id);
  if (!info) return nullptr;
  auto entry = std::make_unique<Adapter>();
  entry->info = std::move(*info);
  Adapter* raw = entry.get();
  adapters_.emplace(id, std::move(entry));
  return raw;
}

AdapterTier AdapterManager::tier(AdapterId id) const {
  auto found = adapters_.find(id);
  if (found == adapters_.end() || found->second->resident == nullptr) return AdapterTier::kCold;
  return found->second->resident->tier;
}

Result<AdapterReadiness> AdapterManager::acquire(AdapterId id) {
  apply_unregistrations();
  apply_evictions();
  Adapter* entry = adapter(id);
  if (entry == nullptr || entry->unregistered) {
    return not_found("adapter {} is not registered (it may have been unloaded)", id);
  }
  if (entry->load_error) {
    Status error = std::move(*entry->load_error);
    entry->load_error.reset();
    return error;
  }
  if (entry->resident != nullptr) {
    if (entry->holders == 0 && entry->resident->tier == AdapterTier::kHot) {
      if (!entry->resident->pages.pin().ok()) {
        // Evicted since the last look: it is cold now.
        drop_tier(*entry);
        if (metrics_) metrics_->evictions->increment();
      }
    }
  }
  if (entry->resident != nullptr) {
    // A use is a request admitted with it: a long decode is one use, not one per step, so
    // frequency measures popularity rather than output lengths.
    note_access(*entry);
    ++entry->holders;
    if (entry->holders == 1) held_seen_.fetch_add(1, std::memory_order_relaxed);
    if (entry->miss_counted) {
      entry->miss_counted = false;
    } else if (metrics_) {
      (entry->resident->tier == AdapterTier::kHot ? metrics_->requests_hot
                                                  : metrics_->requests_warm)
          ->increment();
    }
    return AdapterReadiness::kReady;
  }
  if (!entry->loading) {
    start_load(*entry, AdapterTier::kCold, /*demand=*/true);
    if (entry->loading && !entry->miss_counted) {
      entry->miss_counted = true;
      if (metrics_) metrics_->requests_cold->increment();
    }
  }
  return AdapterReadiness::kLoading;
}

void AdapterManager::release(AdapterId id) {
  auto found = adapters_.find(id);
  FOLIO_CHECK(found != adapters_.end() && found->second->holders > 0,
              "release of adapter {} that is not held", id);
  Adapter& entry = *found->second;
  if (--entry.holders > 0) return;
  held_seen_.fetch_sub(1, std::memory_order_relaxed);
  if (entry.pending != nullptr) {
    install(entry, std::move(entry.pending));
  } else if (entry.resident != nullptr && entry.resident->tier == AdapterTier::kHot) {
    const Status unpinned = entry.resident->pages.unpin();
    FOLIO_CHECK(unpinned.ok(), "unpinning adapter {}: {}", id, unpinned.to_string());
  }
}

void AdapterManager::prefetch(AdapterId id) {
  Adapter* entry = adapter(id);
  if (entry == nullptr || entry->unregistered || entry->resident != nullptr || entry->loading ||
      entry->load_error) {
    return;
  }
  start_load(*entry, AdapterTier::kCold, /*demand=*/false);
}

std::span<const int32_t> AdapterManager::bind_step(std::span<const int64_t> adapter_ids) {
  // Clear the slots the last step used, then give each distinct adapter of this step a slot.
  for (int32_t slot = 1; slot < num_slots_; ++slot) {
    if (slot_owner_[static_cast<size_t>(slot)] == 0) continue;
    slot_owner_[static_cast<size_t>(slot)] = 0;
    for (int32_t target = 0; target < num_targets_; ++target) {
      table_[static_cast<size_t>(target) * num_slots_ + slot] = kernels::LoraSlotWeights{};
    }
  }
  step_slots_.assign(adapter_ids.size(), 0);
  int32_t next_slot = 1;
  for (size_t sequence = 0; sequence < adapter_ids.size(); ++sequence) {
    const AdapterId id = adapter_ids[sequence];
    if (id == 0) continue;
    int32_t slot = 0;
    for (int32_t used = 1; used < next_slot; ++used) {
      if (slot_owner_[static_cast<size_t>(used)] == id) slot = used;
    }
    if (slot == 0) {
      FOLIO_CHECK(next_slot < num_slots_, "a step with more adapters than the table's {} slots",
                  num_slots_ - 1);
      auto found = adapters_.find(id);
      FOLIO_CHECK(found != adapters_.end() && found->second->holders > 0 &&
                      found->second->resident != nullptr,
                  "adapter {} runs in a step without being held", id);
      Adapter& entry = *found->second;
      slot = next_slot++;
      slot_owner_[static_cast<size_t>(slot)] = id;
      for (int32_t target = 0; target < num_targets_; ++target) {
        table_[static_cast<size_t>(target) * num_slots_ + slot] =
            entry.resident->weights[static_cast<size_t>(target)];
      }
      if (entry.resident->tier == AdapterTier::kHot) (void)entry.resident->pages.touch();
    }
    step_slots_[sequence] = slot;
  }
  return step_slots_;
}

void AdapterManager::maintain() {
  ++step_;
  publish_loads();
  apply_unregistrations();
  apply_evictions();
  free_unloaded();
  if (step_ % 8 == 0) rebalance();
  update_gauges();
}

void AdapterManager::wait_for_loads() {
  for (;;) {
    {
      MutexLock lock(queue_mutex_);
      lock.wait(results_changed_, [&]() FOLIO_NO_THREAD_SAFETY_ANALYSIS {
        return static_cast<int64_t>(results_.size()) >= loads_in_flight_;
      });
    }
    publish_loads();
    if (loads_in_flight_ == 0) break;
  }
  update_gauges();
}

void AdapterManager::note_access(Adapter& adapter) {
  if (adapter.last_use == step_) return;
  adapter.last_use = step_;
  adapter.uses.push_back(step_);
}

int32_t AdapterManager::frequency(const Adapter& adapter) const {
  const int64_t oldest = step_ - options_.window_steps;
  const auto first = std::upper_bound(adapter.uses.begin(), adapter.uses.end(), oldest);
  return static_cast<int32_t>(adapter.uses.end() - first);
}

void AdapterManager::start_load(Adapter& adapter, AdapterTier target, bool demand) {
  const AdapterInfo& info = adapter.info;
  const int64_t hot_bytes = hot_footprint(info);
  if (target == AdapterTier::kCold) {
    // A demand load or prefetch: hot when it has room, else warm; when the warm tier cannot
    // take it either, the least recently used idle hot adapters go cold to make hot room.
    if (hot_has_room(hot_bytes)) {
      target = AdapterTier::kHot;
    } else if (make_warm_room(info.warm_bytes, info.id)) {
      target = AdapterTier::kWarm;
    } else if (evict_hot(hot_bytes, info.id)) {
      target = AdapterTier::kHot;
    } else {
      // Every byte of both budgets is held by running sequences: wait for one to end.
      return;
    }
  } else if (target == AdapterTier::kWarm && !make_warm_room(info.warm_bytes, info.id)) {
    return;
  }
  (target == AdapterTier::kHot ? hot_reserved_ : warm_reserved_) +=
      target == AdapterTier::kHot ? hot_bytes : info.warm_bytes;
  adapter.loading = true;
  ++loads_in_flight_;
  {
    MutexLock lock(queue_mutex_);
    (demand ? demand_jobs_ : background_jobs_).push_back(LoadJob{info, target, demand});
  }
  queue_changed_.notify_one();
}

void AdapterManager::publish_loads() {
  std::vector<std::unique_ptr<LoadResult>> results;
  {
    MutexLock lock(queue_mutex_);
    results.swap(results_);
  }
  for (std::unique_ptr<LoadResult>& result : results) {
    --loads_in_flight_;
    (result->target == AdapterTier::kHot ? hot_reserved_ : warm_reserved_) -=
        result->target == AdapterTier::kHot ? hot_footprint(adapters_.at(result->id)->info)
                                            : adapters_.at(result->id)->info.warm_bytes;
    Adapter& entry = *adapters_.at(result->id);
    entry.loading = false;
    if (entry.unregistered) continue;  // the result's memory goes with it
    if (!result->status.ok()) {
      if (metrics_) metrics_->load_failures->increment();
      log::warn("loading adapter '{}' failed: {}", entry.info.name, result->status.to_string());
      // Reported to the next acquire, also for a prefetch: the request it was for fails with
      // it (instead of prefetching again forever).
      entry.load_error = result->status;
      continue;
    }
    const AdapterTier tier = result->resident->tier;
    if (metrics_) {
      (tier == AdapterTier::kHot ? metrics_->load_hot : metrics_->load_warm)
          ->observe(result->seconds);
    }
    if (entry.resident != nullptr) {
      if (metrics_) {
        (tier == AdapterTier::kHot ? metrics_->promotions : metrics_->demotions)->increment();
      }
      if (entry.holders > 0) {
        entry.pending = std::move(result->resident);
        continue;
      }
    }
    install(entry, std::move(result->resident));
  }
}

void AdapterManager::install(Adapter& adapter, std::unique_ptr<Resident> resident) {
  FOLIO_DCHECK(adapter.holders == 0);
  drop_tier(adapter);
  if (resident->tier == AdapterTier::kHot) {
    // Loaded pinned so nothing could evict it half written; unused now, so evictable.
    const Status unpinned = resident->pages.unpin();
    FOLIO_CHECK(unpinned.ok(), "unpinning adapter {}: {}", adapter.info.id, unpinned.to_string());
    hot_bytes_ += resident->bytes;
    ++hot_count_;
  } else {
    warm_bytes_ += resident->bytes;
    ++warm_count_;
    // A hot load the pool could not hold came back warm: keep the warm budget.
    make_warm_room(0, adapter.info.id);
  }
  adapter.resident = std::move(resident);
}

void AdapterManager::drop_tier(Adapter& adapter) {
  if (adapter.resident == nullptr) return;
  (adapter.resident->tier == AdapterTier::kHot ? hot_bytes_ : warm_bytes_) -=
      adapter.resident->bytes;
  (adapter.resident->tier == AdapterTier::kHot ? hot_count_ : warm_count_) -= 1;
  adapter.resident.reset();
}

void AdapterManager::apply_evictions() {
  std::vector<uint64_t> evicted;
  {
    MutexLock lock(notices_mutex_);
    evicted.swap(evicted_);
  }
  for (const uint64_t owner : evicted) {
    auto found = adapters_.find(static_cast<AdapterId>(owner));
    if (found == adapters_.end()) continue;
    Adapter& entry = *found->second;
    // The notice may be for a copy already replaced; only a stale hot copy is dropped.
    if (entry.resident != nullptr && entry.resident->tier == AdapterTier::kHot &&
        !entry.resident->pages.touch().ok()) {
      FOLIO_CHECK(entry.holders == 0, "held adapter {} was evicted", owner);
      drop_tier(entry);
      if (metrics_) metrics_->evictions->increment();
    }
  }
}

void AdapterManager::apply_unregistrations() {
  std::vector<AdapterId> unregistered;
  {
    MutexLock lock(notices_mutex_);
    unregistered.swap(unregistered_);
  }
  for (const AdapterId id : unregistered) {
    auto found = adapters_.find(id);
    if (found != adapters_.end() && !found->second->unregistered) {
      found->second->unregistered = true;
      ++unregistered_waiting_;
    }
  }
}

void AdapterManager::free_unloaded() {
  // Most steps have nothing to free; walking every adapter each step would cost O(adapters).
  if (unregistered_waiting_ == 0) return;
  for (auto it = adapters_.begin(); it != adapters_.end();) {
    Adapter& entry = *it->second;
    if (entry.unregistered && entry.holders == 0 && !entry.loading) {
      drop_tier(entry);
      it = adapters_.erase(it);
      --unregistered_waiting_;
    } else {
      ++it;
    }
  }
}

AdapterManager::Adapter* AdapterManager::least_recently_used(AdapterTier tier, AdapterId keep) {
  Adapter* victim = nullptr;
  for (auto& [id, entry] : adapters_) {
    if (id == keep || entry->holders > 0 || entry->loading || entry->resident == nullptr ||
        entry->resident->tier != tier) {
      continue;
    }
    if (victim == nullptr || entry->last_use < victim->last_use) victim = entry.get();
  }
  return victim;
}

bool AdapterManager::make_warm_room(int64_t bytes, AdapterId keep) {
  while (warm_bytes_ + warm_reserved_ + bytes > options_.warm_budget_bytes) {
    // The least recently used warm adapter no sequence holds goes cold.
    Adapter* victim = least_recently_used(AdapterTier::kWarm, keep);
    if (victim == nullptr) return false;
    drop_tier(*victim);
    if (metrics_) metrics_->demotions->increment();
  }
  return true;
}

int64_t AdapterManager::hot_footprint(const AdapterInfo& info) const {
  const auto page = static_cast<int64_t>(pool_.page_size());
  return (info.hot_bytes + page - 1) / page * page;
}

bool AdapterManager::hot_has_room(int64_t bytes) const {
  return options_.hot_budget_bytes == 0 ||
         hot_bytes_ + hot_reserved_ + bytes <= options_.hot_budget_bytes;
}

bool AdapterManager::evict_hot(int64_t bytes, AdapterId keep) {
  while (!hot_has_room(bytes)) {
    Adapter* victim = least_recently_used(AdapterTier::kHot, keep);
    if (victim == nullptr) return false;
    drop_tier(*victim);
    if (metrics_) metrics_->demotions->increment();
  }
  return true;
}

bool AdapterManager::make_hot_room(int64_t bytes, AdapterId keep, int32_t frequency_needed) {
  if (options_.hot_budget_bytes == 0) return true;
  int64_t freeing = 0;  // hot bytes whose demotion is already on its way
  for (auto& [id, entry] : adapters_) {
    if (entry->loading && entry->resident != nullptr &&
        entry->resident->tier == AdapterTier::kHot) {
      freeing += entry->resident->bytes;
    }
  }
  const int64_t over = hot_bytes_ + hot_reserved_ + bytes - options_.hot_budget_bytes;
  if (over <= 0) return true;
  // Demote the least used hot adapters below the demotion frequency (and below the frequency
  // of the one that needs the room: hysteresis) until enough is on its way out.
  std::vector<Adapter*> candidates;
  for (auto& [id, entry] : adapters_) {
    if (id == keep || entry->holders > 0 || entry->loading || entry->resident == nullptr ||
        entry->resident->tier != AdapterTier::kHot) {
      continue;
    }
    const int32_t used = frequency(*entry);
    if (used < options_.demote_frequency && used < frequency_needed)
      candidates.push_back(entry.get());
  }
  std::sort(candidates.begin(), candidates.end(), [&](const Adapter* a, const Adapter* b) {
    const int32_t left = frequency(*a), right = frequency(*b);
    return left != right ? left < right : a->last_use < b->last_use;
  });
  for (Adapter* candidate : candidates) {
    if (freeing >= over) break;
    freeing += candidate->resident->bytes;
    start_load(*candidate, AdapterTier::kWarm, /*demand=*/false);
    if (!candidate->loading) {
      // No warm room for its compressed copy: it goes cold.
      freeing -= candidate->resident->bytes;
      drop_tier(*candidate);
      if (metrics_) metrics_->demotions->increment();
    }
  }
  return false;
}

void AdapterManager::rebalance() {
  const int64_t oldest = step_ - options_.window_steps;
  for (auto& [id, entry] : adapters_) {
    while (!entry->uses.empty() && entry->uses.front() <= oldest) entry->uses.pop_front();
  }
  for (auto& [id, entry] : adapters_) {
    if (entry->loading || entry->unregistered || entry->resident == nullptr ||
        entry->resident->tier != AdapterTier::kWarm) {
      continue;
    }
    const int32_t used = frequency(*entry);
    if (used < options_.promote_frequency) continue;
    if (make_hot_room(hot_footprint(entry->info), id, used)) {
      start_load(*entry, AdapterTier::kHot, /*demand=*/false);
    }
  }
}

void AdapterManager::update_gauges() {
  hot_adapters_.store(hot_count_, std::memory_order_relaxed);
  warm_adapters_.store(warm_count_, std::memory_order_relaxed);
  hot_bytes_seen_.store(hot_bytes_, std::memory_order_relaxed);
  warm_bytes_seen_.store(warm_bytes_, std::memory_order_relaxed);
  loading_seen_.store(loads_in_flight_, std::memory_order_relaxed);
}

void AdapterManager::check_invariants() const {
  int64_t hot = 0, warm = 0;
  for (const auto& [id, entry] : adapters_) {
    FOLIO_CHECK(entry->holders >= 0, "adapter {} has {} holders", id, entry->holders);
    if (entry->holders > 0) {
      FOLIO_CHECK(entry->resident != nullptr, "held adapter {} is not resident", id);
    }
    if (entry->resident == nullptr) continue;
    const Resident& resident = *entry->resident;
    FOLIO_CHECK(resident.weights.size() == static_cast<size_t>(num_targets_),
                "adapter {} has weights for {} targets of {}", id, resident.weights.size(),
                num_targets_);
    if (resident.tier == AdapterTier::kHot) {
      hot += resident.bytes;
      Result<memory::PageInfo> page = pool_.page_info(resident.pages.first_page());
      FOLIO_CHECK(page.ok() && page->content == memory::ContentType::kAdapterWeights,
                  "hot adapter {} does not own adapter pages", id);
      if (entry->holders > 0) {
        FOLIO_CHECK(page->pin_count > 0, "held hot adapter {} is not pinned", id);
      }
    } else {
      warm += resident.bytes;
    }
  }
  int64_t hot_adapters = 0, warm_adapters = 0;
  for (const auto& [id, entry] : adapters_) {
    if (entry->resident == nullptr) continue;
    (entry->resident->tier == AdapterTier::kHot ? hot_adapters : warm_adapters) += 1;
  }
  FOLIO_CHECK(hot_adapters == hot_count_ && warm_adapters == warm_count_,
              "tier counts disagree: hot {} counted {}, warm {} counted {}", hot_adapters,
              hot_count_, warm_adapters, warm_count_);
  FOLIO_CHECK(hot == hot_bytes_ && warm == warm_bytes_,
              "tier bytes disagree: hot {} counted {}, warm {} counted {}", hot, hot_bytes_, warm,
              warm_bytes_);
  for (int32_t slot = 1; slot < num_slots_; ++slot) {
    if (slot_owner_[static_cast<size_t>(slot)] != 0) continue;
    for (int32_t target = 0; target < num_targets_; ++target) {
      FOLIO_CHECK(table_[static_cast<size_t>(target) * num_slots_ + slot].rank == 0,
                  "free slot {} still names weights", slot);
    }
  }
}

// ---- Loader thread ----------------------------------------------------------------------

void AdapterManager::loader_loop() {
  for (;;) {
    LoadJob job;
    {
      MutexLock lock(queue_mutex_);
      lock.wait(queue_changed_, [&]() FOLIO_NO_THREAD_SAFETY_ANALYSIS {
        return stopping_ || !demand_jobs_.empty() || !background_jobs_.empty();
      });
      if (stopping_) return;
      // Requests waiting on an adapter go before prefetches, promotions and demotions.
      std::deque<LoadJob>& queue = demand_jobs_.empty() ? background_jobs_ : demand_jobs_;
      job = std::move(queue.front());
      queue.pop_front();
    }
    std::unique_ptr<LoadResult> result = load(job);
    {
      MutexLock lock(queue_mutex_);
      results_.push_back(std::move(result));
    }
    results_changed_.notify_all();
  }
}

std::unique_ptr<AdapterManager::LoadResult> AdapterManager::load(const LoadJob& job) {
  const auto start = std::chrono::steady_clock::now();
  auto result = std::make_unique<LoadResult>();
  result->id = job.info.id;
  result->target = job.target;
  result->demand = job.demand;
  auto fail = [&](Status status) {
    result->status = status.with_context(
        fmt::format("loading adapter '{}' from {}", job.info.name, job.info.path));
    return std::move(result);
  };
  Result<std::unique_ptr<AdapterFile>> file = AdapterFile::open(job.info.path, base_);
  if (!file.ok()) return fail(file.status());
  if (adapter_content_hash((*file)->content_hash(), job.info.user_scale) != job.info.content_hash) {
    // Its KV namespace was derived from the old bytes; serving new weights under it could reuse
    // KV computed by the old ones.
    return fail(failed_precondition(
        "the file changed since the adapter was registered; unload and load it again"));
  }
  auto resident = std::make_unique<Resident>();
  resident->tier = job.target;
  if (job.target == AdapterTier::kHot) {
    const auto page_bytes = static_cast<int64_t>(pool_.page_size());
    const int64_t bytes = adapter_weights_bytes(**file, kernels::LoraWeightFormat::kF16);
    memory::PageAllocationRequest request;
    request.num_pages = (bytes + page_bytes - 1) / page_bytes;
    request.content = memory::ContentType::kAdapterWeights;
    request.pinned = true;
    request.owner = static_cast<uint64_t>(job.info.id);
    request.listener = this;
    // A pool too full even after eviction: the adapter is served warm instead of failing the
    // request (the warm budget makes room at publication).
    Result<memory::PageAllocation> pages = pool_.allocate(request);
    if (pages.ok()) {
      resident->pages = std::move(*pages);
    } else {
      resident->tier = AdapterTier::kWarm;
    }
  }
  const kernels::LoraWeightFormat format = resident->tier == AdapterTier::kHot
                                               ? kernels::LoraWeightFormat::kF16
                                               : kernels::LoraWeightFormat::kInt8;
  const int64_t weight_bytes = adapter_weights_bytes(**file, format);
  resident->bytes = weight_bytes;
  std::span<std::byte> destination;
  if (resident->tier == AdapterTier::kHot) {
    // The hot tier is charged whole pages: what the adapter takes from the pool.
    resident->bytes = static_cast<int64_t>(resident->pages.size_bytes());
    destination = std::span(resident->pages.data(), static_cast<size_t>(weight_bytes));
  } else {
    resident->heap = exec::HostBuffer(static_cast<size_t>(resident->bytes));
    destination = std::span(resident->heap.data(), static_cast<size_t>(resident->bytes));
  }
  Result<std::vector<kernels::LoraSlotWeights>> weights =
      write_adapter_weights(**file, format, job.info.user_scale, destination);
  if (!weights.ok()) return fail(weights.status());
  resident->weights = std::move(*weights);
  result->resident = std::move(resident);
  result->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace folio::lora
