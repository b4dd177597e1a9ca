// A `folio` process (`folio worker ...` unless told otherwise) for tests of the real binary
// (FOLIO_BINARY_PATH, defined by the test's CMake target), whose stdout and stderr the test
// reads. A `launcher` runs the binary in another context (e.g. `ip netns exec NS`, which execs
// it in place, so the process is still the worker itself).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "testing/child_process.h"

namespace folio::testing {

class WorkerProcess : public ChildProcess {
 public:
  explicit WorkerProcess(std::vector<std::string> arguments, const std::string& command = "worker",
                         std::vector<std::string> launcher = {})
      : ChildProcess(with_binary(std::move(arguments), command, std::move(launcher)),
                     /*capture_output=*/true) {}

  // The address of the "folio worker: listening on ADDRESS (...)" line; empty when the process
  // ended or printed nothing of the kind within `timeout`.
  std::string wait_for_listening(std::chrono::milliseconds timeout) {
    std::string address;
    read_until(timeout, [&](const std::string& text) {
      const std::string marker = "folio worker: listening on ";
      const size_t found = text.find(marker);
      if (found == std::string::npos) return false;
      const size_t start = found + marker.size();
      const size_t end = text.find(' ', start);
      if (end == std::string::npos) return false;
      address = text.substr(start, end - start);
      return true;
    });
    return address;
  }

 private:
  static std::vector<std::string> with_binary(std::vector<std::string> arguments,
                                              const std::string& command,
                                              std::vector<std::string> launcher) {
    arguments.insert(arguments.begin(), {FOLIO_BINARY_PATH, command});
    arguments.insert(arguments.begin(), launcher.begin(), launcher.end());
    return arguments;
  }
};

}  // namespace folio::testing
