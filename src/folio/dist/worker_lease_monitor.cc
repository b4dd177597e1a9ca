#include "folio/dist/worker_lease_monitor.h"

#include <algorithm>
#include <mutex>

#include "folio/base/check.h"
#include "folio/base/log.h"
#include "folio/dist/sigpipe.h"

namespace folio::dist {

WorkerLeaseMonitor::WorkerLeaseMonitor(int32_t num_stages, LeaseOptions options,
                                       RecoveryStats& stats)
    : options_(options),
      // A few looks per interval: a declaration comes at most a tick after the lease expired.
      tick_(std::clamp<Clock::duration>(options.interval / 4, std::chrono::milliseconds(1),
                                        std::chrono::milliseconds(25))),
      stats_(stats),
      lost_(new std::atomic<bool>[static_cast<size_t>(num_stages)]),
      num_stages_(num_stages) {
  FOLIO_CHECK(num_stages > 0 && options.interval.count() > 0 && options.misses > 0,
              "a lease monitor needs stages ({}), an interval ({} ms) and misses ({})", num_stages,
              options.interval.count(), options.misses);
  ignore_sigpipe_once();
  for (int32_t s = 0; s < num_stages; ++s) lost_[static_cast<size_t>(s)].store(false);
  {
    const MutexLock lock(mutex_);
    current_.resize(static_cast<size_t>(num_stages));
  }
  thread_ = std::thread([this] { run(); });
}

WorkerLeaseMonitor::~WorkerLeaseMonitor() {
  {
    const MutexLock lock(mutex_);
    stopping_ = true;
  }
  wakeup_.notify_all();
  thread_.join();
  // The leases' streams are cancelled and drained by their WorkerWatch destructors.
}

Status WorkerLeaseMonitor::watch(int32_t stage, std::shared_ptr<WorkerClient> worker,
                                 uint64_t epoch) {
  FOLIO_CHECK(stage >= 0 && stage < num_stages_, "stage {} of {}", stage, num_stages_);
  FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<WorkerWatch> stream,
                         worker->watch(epoch, options_.interval));
  auto lease = std::make_unique<Lease>();
  lease->stage = stage;
  lease->worker = std::move(worker);
  lease->watch = std::move(stream);
  lease->epoch = epoch;
  lease->last_beat = Clock::now();
  const MutexLock lock(mutex_);
  std::unique_ptr<Lease>& slot = current_[static_cast<size_t>(stage)];
  if (slot != nullptr) {
    // What arrived before now was sent before the worker was replaced: not stale. From now on
    // every beat of it is.
    std::vector<WorkerBeat> earlier;
    if (!slot->declared_lost) (void)slot->watch->poll(earlier);
    slot->superseded = true;
    superseded_.push_back(std::move(slot));
  }
  slot = std::move(lease);
  lost_[static_cast<size_t>(stage)].store(false, std::memory_order_release);
  return Status();
}

bool WorkerLeaseMonitor::lost(int32_t stage) const {
  return lost_[static_cast<size_t>(stage)].load(std::memory_order_acquire);
}

int64_t WorkerLeaseMonitor::beats_received(int32_t stage) const {
  FOLIO_CHECK(stage >= 0 && stage < num_stages_, "stage {} of {}", stage, num_stages_);
  const MutexLock lock(mutex_);
  const std::unique_ptr<Lease>& lease = current_[static_cast<size_t>(stage)];
  return lease == nullptr ? 0 : lease->beats;
}

void WorkerLeaseMonitor::run() {
  for (;;) {
    std::vector<std::shared_ptr<WorkerClient>> to_shut_down;
    {
      MutexLock lock(mutex_);
      if (lock.wait_for(wakeup_, tick_, [&]() FOLIO_REQUIRES(mutex_) { return stopping_; })) {
        return;
      }
      to_shut_down = look(Clock::now());
    }
    for (const std::shared_ptr<WorkerClient>& worker : to_shut_down) {
      const Status status = worker->shutdown(
          stats_.snapshot().epoch,
          "this worker was given up on (a missed lease) and replaced; it must not serve");
      if (status.ok()) {
        stats_.add_shutdown_sent();
        log::info("folio coordinator: told superseded worker {} (incarnation {:016x}) to exit",
                  worker->info().address, worker->info().incarnation);
      } else {
        log::warn("folio coordinator: telling superseded worker {} to exit failed: {}",
                  worker->info().address, status.to_string());
      }
    }
  }
}

std::vector<std::shared_ptr<WorkerClient>> WorkerLeaseMonitor::look(Clock::time_point now) {
  std::vector<std::shared_ptr<WorkerClient>> to_shut_down;
  std::vector<WorkerBeat> beats;
  const Clock::duration expiry = options_.interval * options_.misses;
  auto given_up_on = [&](Lease& lease, const Status& stream) FOLIO_REQUIRES(mutex_) {
    // Its beats are stale; once one comes, the worker runs again and is told to exit.
    stats_.add_stale_beats(static_cast<int64_t>(beats.size()));
    if (!beats.empty() && stream.ok() && !lease.shutdown_sent && !is_current(*lease.worker)) {
      lease.shutdown_sent = true;
      to_shut_down.push_back(lease.worker);
    }
  };
  for (std::unique_ptr<Lease>& lease : current_) {
    if (lease == nullptr) continue;
    beats.clear();
    const Status stream = lease->watch->poll(beats);
    if (lease->declared_lost) {
      given_up_on(*lease, stream);
      continue;
    }
    for (const WorkerBeat& beat : beats) {
      if (beat.incarnation == lease->worker->info().incarnation) {
        lease->last_beat = now;
        ++lease->beats;
      } else {
        stats_.add_stale_beats(1);
      }
    }
    if (!stream.ok()) {
      declare_lost(*lease, now, fmt::format("its lease stream ended: {}", stream.to_string()));
    } else if (now - lease->last_beat > expiry) {
      declare_lost(*lease, now,
                   fmt::format("no lease beat for {} intervals of {} ms", options_.misses,
                               options_.interval.count()));
    }
  }
  for (auto it = superseded_.begin(); it != superseded_.end();) {
    Lease& lease = **it;
    beats.clear();
    const Status stream = lease.watch->poll(beats);
    given_up_on(lease, stream);
    // A stream that ended will bring nothing more: the worker exited or its link is gone.
    it = stream.ok() ? it + 1 : superseded_.erase(it);
  }
  return to_shut_down;
}

void WorkerLeaseMonitor::declare_lost(Lease& lease, Clock::time_point now,
                                      const std::string& reason) {
  lease.declared_lost = true;
  const double seconds = std::chrono::duration<double>(now - lease.last_beat).count();
  stats_.add_detection(seconds);
  const std::string message = fmt::format("worker {} of pipeline stage {} was declared lost: {}",
                                          lease.worker->info().address, lease.stage, reason);
  // Abandoned before the flag is published: whoever reads lost() == true (acquire) finds the
  // client already failing its calls fast.
  lease.worker->abandon(message);
  lost_[static_cast<size_t>(lease.stage)].store(true, std::memory_order_release);
  log::warn("folio coordinator: {} ({:.3f} s after its last beat)", message, seconds);
}

bool WorkerLeaseMonitor::is_current(const WorkerClient& worker) const {
  return std::any_of(current_.begin(), current_.end(), [&](const std::unique_ptr<Lease>& lease) {
    return lease != nullptr && !lease->declared_lost &&
           lease->worker->info().incarnation == worker.info().incarnation;
  });
}

}  // namespace folio::dist
