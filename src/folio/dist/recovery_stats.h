// RecoveryStats: what a pipeline's recovery has seen (issue 16), counted by the lease monitor's
// thread and the runner's (the engine's) thread, exported to a metrics registry when one is
// given, and read as one snapshot (RecoveryCounters) by tests and benchmarks.
//
// Series (when a registry is given): folio_dist_stale_replies_total (replies and beats of a
// superseded epoch or incarnation, dropped), folio_dist_workers_lost_total (workers a recovery
// found lost and replaced or tried to), folio_dist_detection_seconds (histogram: from a lost
// worker's last beat to the lease monitor declaring it lost), folio_dist_epoch (gauge).
//
// Thread-safety: every method may be called from any thread (one mutex; the metrics are atomic).
#pragma once

#include <cstdint>
#include <vector>

#include "folio/base/metrics.h"
#include "folio/base/mutex.h"
#include "folio/base/result.h"

namespace folio::dist {

// A snapshot of the counters, each as of the moment snapshot() ran.
struct RecoveryCounters {
  uint64_t epoch = 0;
  int64_t recoveries = 0;      // recover() calls that re-formed the pipeline (kNone included)
  int64_t workers_lost = 0;    // stages found lost (failed call, lease, probe, fence)
  int64_t stale_replies = 0;   // stage replies of another epoch or incarnation, dropped
  int64_t stale_beats = 0;     // beats of a worker given up on or superseded, dropped
  int64_t shutdowns_sent = 0;  // superseded workers told to exit (answered)
  // One entry per lease declared lost, in order: seconds from its last beat (or from the start
  // of the lease, if none came) to the declaration.
  std::vector<double> detection_seconds;
};

class RecoveryStats {
 public:
  RecoveryStats() = default;
  RecoveryStats(const RecoveryStats&) = delete;
  RecoveryStats& operator=(const RecoveryStats&) = delete;

  // Registers the folio_dist_* series above in `registry` (which must outlive this object).
  Status export_to(metrics::Registry& registry);

  void set_epoch(uint64_t epoch);
  void add_recovery();
  void add_workers_lost(int64_t count);
  void add_stale_reply();
  void add_stale_beats(int64_t count);
  void add_shutdown_sent();
  void add_detection(double seconds);

  RecoveryCounters snapshot() const;

 private:
  mutable Mutex mutex_;
  RecoveryCounters counters_ FOLIO_GUARDED_BY(mutex_);
  // Set once by export_to(), before any other thread counts; null: no registry.
  metrics::Counter* stale_replies_metric_ = nullptr;
  metrics::Counter* workers_lost_metric_ = nullptr;
  metrics::Histogram* detection_metric_ = nullptr;
  metrics::Gauge* epoch_metric_ = nullptr;
};

}  // namespace folio::dist
