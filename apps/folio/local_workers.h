// LocalWorkers: `folio worker` processes of this very binary on free loopback ports, for
// `--local-workers N`: each listens on 127.0.0.1:0 with the coordinator's model file (or, with
// `--local-worker-cache DIR`, without it and with a weight cache), logs to a
// file of its own (read here for its "listening on ADDRESS" line), and dies with the
// coordinator (--parent-pid). Destroying the group stops them: SIGTERM, then SIGKILL
// after a grace, and reaps them.
//
// Supervision (issue 16): replace() starts a new worker in a lost one's place, on a new port;
// the pipeline's recovery calls it from its WorkerReplacer. The lost process is not killed here:
// one that was only stopped (SIGSTOP) and comes back is fenced by the coordinator's epochs and
// told to exit; whatever is left is stopped with the group.
//
// Thread-safety: start() and the destructor from one thread; replace(), addresses() and
// worker_pids() from any thread (the engine's, the fault injection's).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "folio/base/mutex.h"
#include "folio/base/result.h"

namespace folio::app {

class LocalWorkers {
 public:
  // Starts `count` workers holding `model_path`, `threads` compute threads and a memory budget
  // of `memory_bytes` each (0: the worker's default), and waits up to 30 s for each to listen.
  // With a `cache_directory` the workers start without the model file (--cache-dir, all of them
  // and their replacements sharing the directory, which is safe across processes): the
  // coordinator sends each its stage's tensors the cache lacks, so a replacement started where
  // its predecessor fetched them fetches nothing. Errors name the worker and quote its log.
  static Result<std::unique_ptr<LocalWorkers>> start(int32_t count, const std::string& model_path,
                                                     int32_t threads, uint64_t memory_bytes,
                                                     const std::string& cache_directory = "");
  ~LocalWorkers();
  LocalWorkers(const LocalWorkers&) = delete;
  LocalWorkers& operator=(const LocalWorkers&) = delete;

  // The addresses of the workers now in the group, in start order (a replacement takes its
  // predecessor's index).
  std::vector<std::string> addresses() const;
  // Their process ids, in the same order.
  std::vector<pid_t> worker_pids() const;

  // Starts a worker in the place of the one at `lost_address` and returns its address, once it
  // listens. kNotFound if no worker of the group had that address; the start's errors as
  // start()'s.
  Result<std::string> replace(const std::string& lost_address);
  // Workers started by replace() so far.
  int32_t num_replaced() const;

 private:
  struct Worker {
    pid_t pid = -1;
    std::string log;
    std::string address;
  };
  LocalWorkers() = default;
  // Starts the worker of slot `index` (its log named after the index and `generation`).
  Result<Worker> spawn(size_t index, int32_t generation) const;
  // Waits until `worker` prints its address, up to `deadline`.
  Status wait_listening(size_t index, Worker& worker,
                        std::chrono::steady_clock::time_point deadline) const;

  std::string binary_;
  std::string model_path_;
  std::string cache_directory_;  // empty: the workers read model_path_
  int32_t threads_ = 0;
  uint64_t memory_bytes_ = 0;
  std::string log_directory_;

  mutable Mutex mutex_;
  std::vector<Worker> workers_ FOLIO_GUARDED_BY(mutex_);
  // Processes replaced: stopped (if still there) and reaped with the group.
  std::vector<pid_t> retired_pids_ FOLIO_GUARDED_BY(mutex_);
  int32_t num_replaced_ FOLIO_GUARDED_BY(mutex_) = 0;
};

}  // namespace folio::app
