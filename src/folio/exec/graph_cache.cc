#include "folio/exec/graph_cache.h"

#include "folio/base/log.h"

namespace folio::exec {
namespace {

constexpr const char* kPaddingRatioName = "folio_graph_padding_ratio";

}  // namespace

Result<std::unique_ptr<GraphCache>> GraphCache::create(metrics::Registry* registry,
                                                       const std::string& executor_name) {
  std::unique_ptr<GraphCache> cache(new GraphCache());
  if (registry != nullptr) FOLIO_RETURN_IF_ERROR(cache->export_metrics(*registry, executor_name));
  return cache;
}

Status GraphCache::export_metrics(metrics::Registry& registry, const std::string& executor_name) {
  labels_ = {{"executor", executor_name}};
  struct Spec {
    metrics::Counter** target;
    const char* name;
    const char* help;
  };
  const Spec specs[] = {
      {&hits_metric_, "folio_graph_hits_total", "Steps replayed from a cached program."},
      {&misses_metric_, "folio_graph_misses_total", "Steps whose bucket had no program yet."},
      {&captures_metric_, "folio_graph_captures_total", "Programs captured."},
      {&capture_failures_metric_, "folio_graph_capture_failures_total",
       "Captures that found no arena memory; the step ran eagerly."},
      {&capture_seconds_metric_, "folio_graph_capture_seconds_total",
       "Seconds spent capturing programs."},
      {&eager_fallbacks_metric_, "folio_graph_eager_fallbacks_total",
       "Steps above the largest bucket, run eagerly."},
      {&real_tokens_metric_, "folio_graph_real_tokens_total", "Step tokens run."},
      {&padding_tokens_metric_, "folio_graph_padding_tokens_total",
       "Padding tokens run to fill buckets."},
      {&idle_releases_metric_, "folio_exec_idle_releases_total",
       "Releases of idle captures that dropped at least one program."},
      {&programs_released_metric_, "folio_exec_programs_released_total",
       "Captured programs dropped as idle (recaptured on demand)."},
      {&bytes_released_metric_, "folio_exec_bytes_released_total",
       "Bytes (graph arena and eager-step memory) given back to the page pool as idle."},
  };
  for (const Spec& spec : specs) {
    FOLIO_ASSIGN_OR_RETURN(*spec.target, registry.counter(spec.name, spec.help, labels_));
  }
  FOLIO_RETURN_IF_ERROR(registry.gauge_function(
      kPaddingRatioName, "Padding tokens / all tokens run (0 before any step).", labels_,
      [this] { return stats().padding_ratio(); }));
  registry_ = &registry;
  return Status();
}

GraphCache::~GraphCache() {
  if (registry_ == nullptr) return;
  const Status removed = registry_->remove_gauge_function(kPaddingRatioName, labels_);
  if (!removed.ok()) log::warn("graph cache: {}", removed.to_string());
}

const Program* GraphCache::find(const BucketKey& key) const {
  const auto found = programs_.find(key);
  return found == programs_.end() ? nullptr : found->second.program.get();
}

const Program* GraphCache::use(const BucketKey& key, int64_t step) {
  const auto found = programs_.find(key);
  if (found == programs_.end()) return nullptr;
  found->second.last_used = step;
  return found->second.program.get();
}

const Program* GraphCache::insert(const BucketKey& key, std::unique_ptr<Program> program,
                                  int64_t step) {
  auto [position, inserted] = programs_.emplace(key, Entry{std::move(program), step});
  FOLIO_CHECK(inserted, "a program for bucket ({} tokens, {}) is cached already", key.num_tokens,
              ir::step_phase_name(key.phase));
  return position->second.program.get();
}

std::vector<std::unique_ptr<Program>> GraphCache::take_idle(int64_t now, int64_t idle_steps) {
  std::vector<std::unique_ptr<Program>> taken;
  for (auto it = programs_.begin(); it != programs_.end();) {
    if (now - it->second.last_used >= idle_steps) {
      taken.push_back(std::move(it->second.program));
      it = programs_.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

std::vector<const Program*> GraphCache::programs() const {
  std::vector<const Program*> programs;
  for (const auto& [key, entry] : programs_) programs.push_back(entry.program.get());
  return programs;
}

void GraphCache::add(std::atomic<int64_t>& counter, metrics::Counter* exported, int64_t by) {
  counter.fetch_add(by, std::memory_order_relaxed);
  if (exported != nullptr) exported->increment(static_cast<double>(by));
}

void GraphCache::record_hit() {
  add(hits_, hits_metric_, 1);
}
void GraphCache::record_miss() {
  add(misses_, misses_metric_, 1);
}
void GraphCache::record_capture_failure() {
  add(capture_failures_, capture_failures_metric_, 1);
}
void GraphCache::record_eager_fallback() {
  add(eager_fallbacks_, eager_fallbacks_metric_, 1);
}

void GraphCache::record_capture(double seconds) {
  add(captures_, captures_metric_, 1);
  capture_seconds_.fetch_add(seconds, std::memory_order_relaxed);
  if (capture_seconds_metric_ != nullptr) capture_seconds_metric_->increment(seconds);
}

void GraphCache::record_release(int64_t programs, int64_t bytes) {
  if (programs > 0 || bytes > 0) add(idle_releases_, idle_releases_metric_, 1);
  add(programs_released_, programs_released_metric_, programs);
  add(bytes_released_, bytes_released_metric_, bytes);
}

void GraphCache::record_tokens(int64_t real_tokens, int64_t padding_tokens) {
  add(real_tokens_, real_tokens_metric_, real_tokens);
  add(padding_tokens_, padding_tokens_metric_, padding_tokens);
}

GraphCacheStats GraphCache::stats() const {
  GraphCacheStats stats;
  stats.hits = hits_.load(std::memory_order_relaxed);
  stats.misses = misses_.load(std::memory_order_relaxed);
  stats.captures = captures_.load(std::memory_order_relaxed);
  stats.capture_failures = capture_failures_.load(std::memory_order_relaxed);
  stats.capture_seconds = capture_seconds_.load(std::memory_order_relaxed);
  stats.eager_fallbacks = eager_fallbacks_.load(std::memory_order_relaxed);
  stats.real_tokens = real_tokens_.load(std::memory_order_relaxed);
  stats.padding_tokens = padding_tokens_.load(std::memory_order_relaxed);
  stats.idle_releases = idle_releases_.load(std::memory_order_relaxed);
  stats.programs_released = programs_released_.load(std::memory_order_relaxed);
  stats.bytes_released = bytes_released_.load(std::memory_order_relaxed);
  return stats;
}

}  // namespace folio::exec
