#include "folio/dist/recovery_stats.h"

namespace folio::dist {

Status RecoveryStats::export_to(metrics::Registry& registry) {
  FOLIO_ASSIGN_OR_RETURN(
      stale_replies_metric_,
      registry.counter("folio_dist_stale_replies_total",
                       "Replies and lease beats of a superseded epoch or worker incarnation, "
                       "dropped by the coordinator."));
  FOLIO_ASSIGN_OR_RETURN(workers_lost_metric_,
                         registry.counter("folio_dist_workers_lost_total",
                                          "Pipeline workers found lost by a recovery (a failed "
                                          "call, a missed lease, a restart, a failed fence)."));
  // 5 ms to about 41 s: a lease of 3 x 100 ms lands near 0.3 s, a step deadline at 30 s.
  FOLIO_ASSIGN_OR_RETURN(
      detection_metric_,
      registry.histogram("folio_dist_detection_seconds",
                         "Seconds from a lost worker's last lease beat to its declaration.",
                         metrics::exponential_buckets(0.005, 2.0, 14)));
  FOLIO_ASSIGN_OR_RETURN(epoch_metric_,
                         registry.gauge("folio_dist_epoch",
                                        "The pipeline's epoch: 1 at start, one more per "
                                        "recovery."));
  const MutexLock lock(mutex_);
  epoch_metric_->set(static_cast<double>(counters_.epoch));
  stale_replies_metric_->increment(
      static_cast<double>(counters_.stale_replies + counters_.stale_beats));
  workers_lost_metric_->increment(static_cast<double>(counters_.workers_lost));
  for (double seconds : counters_.detection_seconds) detection_metric_->observe(seconds);
  return Status();
}

void RecoveryStats::set_epoch(uint64_t epoch) {
  const MutexLock lock(mutex_);
  counters_.epoch = epoch;
  if (epoch_metric_ != nullptr) epoch_metric_->set(static_cast<double>(epoch));
}

void RecoveryStats::add_recovery() {
  const MutexLock lock(mutex_);
  ++counters_.recoveries;
}

void RecoveryStats::add_workers_lost(int64_t count) {
  const MutexLock lock(mutex_);
  counters_.workers_lost += count;
  if (workers_lost_metric_ != nullptr) workers_lost_metric_->increment(static_cast<double>(count));
}

void RecoveryStats::add_stale_reply() {
  const MutexLock lock(mutex_);
  ++counters_.stale_replies;
  if (stale_replies_metric_ != nullptr) stale_replies_metric_->increment();
}

void RecoveryStats::add_stale_beats(int64_t count) {
  const MutexLock lock(mutex_);
  counters_.stale_beats += count;
  if (stale_replies_metric_ != nullptr) {
    stale_replies_metric_->increment(static_cast<double>(count));
  }
}

void RecoveryStats::add_shutdown_sent() {
  const MutexLock lock(mutex_);
  ++counters_.shutdowns_sent;
}

void RecoveryStats::add_detection(double seconds) {
  const MutexLock lock(mutex_);
  counters_.detection_seconds.push_back(seconds);
  if (detection_metric_ != nullptr) detection_metric_->observe(seconds);
}

RecoveryCounters RecoveryStats::snapshot() const {
  const MutexLock lock(mutex_);
  return counters_;
}

}  // namespace folio::dist
