// LocalWorkers: `folio worker` processes of this very binary on free loopback ports, for
// `--local-workers N`: each listens on 127.0.0.1:0 with the coordinator's model file, logs to a
// file of its own (read here for its "listening on ADDRESS" line), and dies with the
// coordinator (--parent-pid). Destroying the group stops them: SIGTERM, then SIGKILL
// after a grace, and reaps them.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "folio/base/result.h"

namespace folio::app {

class LocalWorkers {
 public:
  // Starts `count` workers holding `model_path`, `threads` compute threads and a memory budget
  // of `memory_bytes` each (0: the worker's default), and waits up to 30 s for each to listen.
  // Errors name the worker and quote its log.
  static Result<std::unique_ptr<LocalWorkers>> start(int32_t count, const std::string& model_path,
                                                     int32_t threads, uint64_t memory_bytes);
  ~LocalWorkers();
  LocalWorkers(const LocalWorkers&) = delete;
  LocalWorkers& operator=(const LocalWorkers&) = delete;

  const std::vector<std::string>& addresses() const { return addresses_; }

 private:
  LocalWorkers() = default;

  std::string log_directory_;
  std::vector<pid_t> pids_;
  std::vector<std::string> logs_;
  std::vector<std::string> addresses_;
};

}  // namespace folio::app
