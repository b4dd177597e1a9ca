// GraphCache: the captured programs of an executor, one per bucket, and the statistics of how
// steps were served. Statistics are kept as relaxed atomics (each stands on its own; nothing is
// published through them), readable from any thread, and exported to a metrics registry when
// one is given:
//   folio_graph_hits_total, folio_graph_misses_total, folio_graph_captures_total,
//   folio_graph_capture_failures_total, folio_graph_capture_seconds_total,
//   folio_graph_eager_fallbacks_total (steps above the largest bucket),
//   folio_graph_real_tokens_total, folio_graph_padding_tokens_total, the gauge
//   folio_graph_padding_ratio (padding tokens / all tokens run), and for idle memory given back
//   (Executor::release_idle_memory): folio_exec_idle_releases_total (calls that gave
//   something back), folio_exec_programs_released_total and
//   folio_exec_idle_bytes_released_total (graph arena and eager-step bytes given back to the
//   pool), all labelled executor=<name>.
//
// Each cached program remembers the executor step it was last used at (captured or replayed),
// so the executor can drop the programs of buckets idle for a while (take_idle).
//
// Thread-safety: find/insert/programs are for the executor's own thread; stats() and the
// metrics may be read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "folio/base/metrics.h"
#include "folio/base/result.h"
#include "folio/exec/bucket_policy.h"
#include "folio/exec/program.h"

namespace folio::exec {

struct GraphCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t captures = 0;
  int64_t capture_failures = 0;  // captures that ran out of arena memory (step ran eagerly)
  double capture_seconds = 0;
  int64_t eager_fallbacks = 0;  // steps above the largest bucket
  int64_t real_tokens = 0;
  int64_t padding_tokens = 0;
  int64_t idle_releases = 0;      // release calls that gave something back
  int64_t programs_released = 0;  // programs dropped as idle (recaptured on demand)
  int64_t bytes_released = 0;     // pool bytes given back (arena and eager memory)

  // Padding tokens / all tokens run; 0 before any step.
  double padding_ratio() const {
    const int64_t total = real_tokens + padding_tokens;
    return total == 0 ? 0.0 : static_cast<double>(padding_tokens) / static_cast<double>(total);
  }
};

class GraphCache {
 public:
  // `registry` may be null (no export); it must outlive the cache. Errors: the registry's (a
  // metric registered before with another type or help).
  static Result<std::unique_ptr<GraphCache>> create(metrics::Registry* registry,
                                                    const std::string& executor_name);
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // The program of `key`, or null. Counts nothing.
  const Program* find(const BucketKey& key) const;
  // find(), and when found records `step` as its last use.
  const Program* use(const BucketKey& key, int64_t step);
  // Requires: no program cached under `key`. `step` is its first use.
  const Program* insert(const BucketKey& key, std::unique_ptr<Program> program, int64_t step = 0);
  // Removes and returns the programs last used at or before step `now - idle_steps`.
  std::vector<std::unique_ptr<Program>> take_idle(int64_t now, int64_t idle_steps);
  size_t size() const { return programs_.size(); }
  // Every cached program (order unspecified).
  std::vector<const Program*> programs() const;

  void record_hit();
  void record_miss();
  void record_capture(double seconds);
  void record_capture_failure();
  void record_eager_fallback();
  void record_tokens(int64_t real_tokens, int64_t padding_tokens);
  void record_release(int64_t programs, int64_t bytes);

  GraphCacheStats stats() const;

 private:
  GraphCache() = default;
  Status export_metrics(metrics::Registry& registry, const std::string& executor_name);
  static void add(std::atomic<int64_t>& counter, metrics::Counter* exported, int64_t by);

  struct Entry {
    std::unique_ptr<Program> program;
    int64_t last_used = 0;  // executor step
  };
  std::unordered_map<BucketKey, Entry> programs_;

  std::atomic<int64_t> hits_{0}, misses_{0}, captures_{0}, capture_failures_{0},
      eager_fallbacks_{0}, real_tokens_{0}, padding_tokens_{0}, idle_releases_{0},
      programs_released_{0}, bytes_released_{0};
  std::atomic<double> capture_seconds_{0};

  metrics::Registry* registry_ = nullptr;
  metrics::Labels labels_;
  metrics::Counter* hits_metric_ = nullptr;
  metrics::Counter* misses_metric_ = nullptr;
  metrics::Counter* captures_metric_ = nullptr;
  metrics::Counter* capture_failures_metric_ = nullptr;
  metrics::Counter* capture_seconds_metric_ = nullptr;
  metrics::Counter* eager_fallbacks_metric_ = nullptr;
  metrics::Counter* real_tokens_metric_ = nullptr;
  metrics::Counter* padding_tokens_metric_ = nullptr;
  metrics::Counter* idle_releases_metric_ = nullptr;
  metrics::Counter* programs_released_metric_ = nullptr;
  metrics::Counter* bytes_released_metric_ = nullptr;
};

}  // namespace folio::exec
