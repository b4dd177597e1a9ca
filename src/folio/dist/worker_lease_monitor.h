// WorkerLeaseMonitor: the coordinator's leases on its pipeline's workers (issue 16,
// docs/design/dist.md "Recovery"). Each stage's worker streams a beat every `interval`
// (worker.proto Watch); one monitor thread takes the beats of every stream and declares a worker
// lost when `misses` intervals in a row pass without one, or at once when its stream ends (the
// connection broke: the process died). Declaring a stage lost sets its flag (a release store that
// the runner's acquire load pairs with, before and after each stage call) and abandons its
// client (WorkerClient::abandon), which cancels the stage call in flight: a stopped worker is
// given up on after about interval x misses, not after the step's 30 s deadline.
//
// Terms:
// - Lease: one stage's current worker and its Watch stream; watch() starts one, replacing the
//   stage's previous lease, which becomes superseded.
// - Stale beat: a beat of a lease declared lost or superseded (the worker was given up on, yet
//   it runs: it was stopped and continued, or the network healed). Counted and dropped; the
//   worker is then told to exit (Shutdown, once), unless it is the current worker of some stage
//   again (a worker reconnected to at the same address and found to be the same process).
// - Detection time: from the last beat (or the lease's start) to the declaration; recorded in
//   RecoveryStats.
//
// Thread-safety: watch() and lost() may be called from any thread (the runner's, in practice);
// the monitor's thread runs from construction to destruction. Lock order: the monitor's mutex,
// then (inside abandon) the client's; the Shutdown call runs with no lock held.
//
// Invariants: a lease's flag goes from clear to set once, and back only by a new lease for the
// stage (watch()); every stream the monitor opened is cancelled and drained before it is gone.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "folio/base/mutex.h"
#include "folio/base/result.h"
#include "folio/dist/recovery_stats.h"
#include "folio/dist/worker_client.h"

namespace folio::dist {

struct LeaseOptions {
  std::chrono::milliseconds interval{100};
  int32_t misses = 3;
};

class WorkerLeaseMonitor {
 public:
  // Requires: num_stages > 0, interval > 0, misses > 0. `stats` must outlive the monitor.
  WorkerLeaseMonitor(int32_t num_stages, LeaseOptions options, RecoveryStats& stats);
  ~WorkerLeaseMonitor();
  WorkerLeaseMonitor(const WorkerLeaseMonitor&) = delete;
  WorkerLeaseMonitor& operator=(const WorkerLeaseMonitor&) = delete;

  // Starts the lease of `worker` as stage `stage`'s worker in `epoch` and clears the stage's
  // flag; the stage's previous lease, if any, is superseded. The stream opens in the background:
  // a worker that is gone is declared lost at the monitor's next look.
  Status watch(int32_t stage, std::shared_ptr<WorkerClient> worker, uint64_t epoch);
  // Whether stage `stage`'s current worker was declared lost (acquire: pairs with the release in
  // declare_lost, which abandons the client first, so a true answer implies it is abandoned).
  bool lost(int32_t stage) const;
  // Beats of stage `stage`'s current lease taken so far (0 without one).
  int64_t beats_received(int32_t stage) const;

  const LeaseOptions& options() const { return options_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Lease {
    int32_t stage = 0;
    std::shared_ptr<WorkerClient> worker;
    std::unique_ptr<WorkerWatch> watch;
    uint64_t epoch = 0;
    Clock::time_point last_beat;
    int64_t beats = 0;  // of its own incarnation, before it was given up on
    bool declared_lost = false;
    bool superseded = false;
    bool shutdown_sent = false;
  };

  void run();
  // Takes the beats of every lease, declares the overdue ones lost; returns the workers to tell
  // to exit (called without the mutex).
  std::vector<std::shared_ptr<WorkerClient>> look(Clock::time_point now) FOLIO_REQUIRES(mutex_);
  void declare_lost(Lease& lease, Clock::time_point now, const std::string& reason)
      FOLIO_REQUIRES(mutex_);
  // Whether `worker`'s incarnation is a current, live lease's (then it must not be shut down).
  bool is_current(const WorkerClient& worker) const FOLIO_REQUIRES(mutex_);

  const LeaseOptions options_;
  const Clock::duration tick_;
  RecoveryStats& stats_;
  // One flag per stage: set (release) when its current lease is declared lost.
  std::unique_ptr<std::atomic<bool>[]> lost_;
  const int32_t num_stages_;

  mutable Mutex mutex_;
  std::condition_variable wakeup_;
  bool stopping_ FOLIO_GUARDED_BY(mutex_) = false;
  std::vector<std::unique_ptr<Lease>> current_ FOLIO_GUARDED_BY(mutex_);  // per stage
  // Leases given up on and replaced, kept while their stream lasts (their beats are stale).
  std::vector<std::unique_ptr<Lease>> superseded_ FOLIO_GUARDED_BY(mutex_);
  std::thread thread_;  // last: started once everything above is built
};

}  // namespace folio::dist
