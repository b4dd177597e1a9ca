// A child process for tests that run real binaries: started with posix_spawn (never fork: the
// test process has threads), killed with SIGKILL and reaped at the end if still running. With
// `capture_output`, its stdout and stderr go to one pipe that read_until / read_to_end collect
// into output(). Every read is bounded by a timeout, so a child that hangs fails the test
// instead of hanging it.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

extern char** environ;

namespace folio::testing {

class ChildProcess {
 public:
  // arguments[0] is the binary's path.
  ChildProcess(std::vector<std::string> arguments, bool capture_output) {
    std::vector<char*> argv;
    for (std::string& argument : arguments) argv.push_back(argument.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    int pipe_ends[2] = {-1, -1};
    if (capture_output) {
      EXPECT_EQ(pipe2(pipe_ends, O_CLOEXEC), 0);
      posix_spawn_file_actions_adddup2(&actions, pipe_ends[1], STDOUT_FILENO);
      posix_spawn_file_actions_adddup2(&actions, pipe_ends[1], STDERR_FILENO);
    }
    const int error = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (capture_output) {
      close(pipe_ends[1]);
      output_ = pipe_ends[0];
    }
    EXPECT_EQ(error, 0) << "posix_spawn " << argv[0];
    if (error != 0) pid_ = -1;
  }
  ~ChildProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      wait();
    }
    if (output_ >= 0) close(output_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int number) { ASSERT_EQ(kill(pid_, number), 0); }
  // After SIGSTOP: returns once the process is stopped (the signal is delivered asynchronously,
  // so a call right after kill() could still be answered).
  void wait_until_stopped() {
    int status = 0;
    ASSERT_EQ(waitpid(pid_, &status, WUNTRACED), pid_);
    ASSERT_TRUE(WIFSTOPPED(status)) << status;
  }
  // The raw wait status.
  int wait() {
    int status = 0;
    if (pid_ > 0) {
      EXPECT_EQ(waitpid(pid_, &status, 0), pid_);
      pid_ = -1;
    }
    return status;
  }

  // Reads the captured output until done(output()) holds (true), or the child closes its output
  // or `timeout` passes first (false).
  bool read_until(std::chrono::milliseconds timeout,
                  const std::function<bool(const std::string&)>& done) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done(text_)) {
      if (read_some(deadline) != ReadResult::kData) return false;
    }
    return true;
  }
  // Reads until the child closes its output; false if `timeout` passes first.
  bool read_to_end(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    ReadResult result;
    while ((result = read_some(deadline)) == ReadResult::kData) {
    }
    return result == ReadResult::kEnd;
  }
  const std::string& output() const { return text_; }

 private:
  enum class ReadResult { kData, kEnd, kTimeout };

  ReadResult read_some(std::chrono::steady_clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return ReadResult::kTimeout;
    pollfd descriptor{.fd = output_, .events = POLLIN, .revents = 0};
    if (poll(&descriptor, 1, static_cast<int>(left.count())) <= 0) return ReadResult::kTimeout;
    char buffer[4096];
    const ssize_t read_bytes = read(output_, buffer, sizeof buffer);
    if (read_bytes <= 0) return ReadResult::kEnd;
    text_.append(buffer, static_cast<size_t>(read_bytes));
    return ReadResult::kData;
  }

  pid_t pid_ = -1;
  int output_ = -1;
  std::string text_;
};

}  // namespace folio::testing
