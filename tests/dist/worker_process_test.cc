// The real `folio worker` binary (FOLIO_BINARY_PATH), started with posix_spawn: it prints its
// "listening" line, answers the handshake with what its command line declared and the hash of
// its model file, exits 0 on SIGTERM; killed or stopped, it gives the coordinator an error
// within the call's deadline, not a hang.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "folio/base/random.h"
#include "folio/dist/worker_client.h"
#include "testing/collective_groups.h"

extern char** environ;

namespace folio::dist {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// A `folio` process (`folio worker ...` unless told otherwise) whose stdout and stderr this test
// reads; killed and reaped at the end if still running.
class WorkerProcess {
 public:
  explicit WorkerProcess(std::vector<std::string> arguments,
                         const std::string& command = "worker") {
    arguments.insert(arguments.begin(), {FOLIO_BINARY_PATH, command});
    std::vector<char*> argv;
    for (std::string& argument : arguments) argv.push_back(argument.data());
    argv.push_back(nullptr);
    int pipe_ends[2];
    EXPECT_EQ(pipe2(pipe_ends, O_CLOEXEC), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_ends[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, pipe_ends[1], STDERR_FILENO);
    const int error = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(pipe_ends[1]);
    output_ = pipe_ends[0];
    EXPECT_EQ(error, 0) << "posix_spawn " << argv[0];
    if (error != 0) pid_ = -1;
  }
  ~WorkerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      wait();
    }
    close(output_);
  }
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  // The address of the "folio worker: listening on ADDRESS (...)" line; empty when the process
  // ended or printed nothing of the kind within `timeout`.
  std::string wait_for_listening(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const std::string marker = "folio worker: listening on ";
    while (true) {
      const size_t found = text_.find(marker);
      if (found != std::string::npos) {
        const size_t start = found + marker.size();
        const size_t end = text_.find(' ', start);
        if (end != std::string::npos) return text_.substr(start, end - start);
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left <= 0ms) return "";
      pollfd descriptor{.fd = output_, .events = POLLIN, .revents = 0};
      if (poll(&descriptor, 1, static_cast<int>(left.count())) <= 0) return "";
      char buffer[4096];
      const ssize_t read_bytes = read(output_, buffer, sizeof buffer);
      if (read_bytes <= 0) return "";
      text_.append(buffer, static_cast<size_t>(read_bytes));
    }
  }
  // Reads until the process closes its output or `timeout` passes; false on the timeout.
  bool read_to_end(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left <= 0ms) return false;
      pollfd descriptor{.fd = output_, .events = POLLIN, .revents = 0};
      if (poll(&descriptor, 1, static_cast<int>(left.count())) <= 0) return false;
      char buffer[4096];
      const ssize_t read_bytes = read(output_, buffer, sizeof buffer);
      if (read_bytes <= 0) return true;
      text_.append(buffer, static_cast<size_t>(read_bytes));
    }
  }
  const std::string& output() const { return text_; }

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

 private:
  pid_t pid_ = -1;
  int output_ = -1;
  std::string text_;
};

// The model file's hash as the worker must report it: FNV-1a 64 of its bytes (base/random.h's
// fnv1a64 over the whole file at once, where the worker streams it in chunks).
std::string expected_hash(const std::string& bytes) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  return fmt::format("fnv1a64:{:016x}", fnv1a64(std::span<const uint8_t>(data, bytes.size())));
}

struct ModelFile {
  folio::testing::TemporaryDirectory directory;
  std::string path = directory.path() + "/little-model.gguf";
  std::string bytes;
  ModelFile() {
    // Over a chunk of the worker's reader (1 MiB), so chunk boundaries are crossed.
    for (uint32_t i = 0; i < 1500000; ++i) bytes.push_back(static_cast<char>((i * 7919u) >> 3));
    std::ofstream(path, std::ios::binary) << bytes;
  }
};

TEST(WorkerProcessTest, RealWorkerHandshakesAndExitsZeroOnSigterm) {
  ModelFile model;
  WorkerProcess worker(
      {"--listen", "127.0.0.1:0", "--memory", "123456789", "--threads", "3", "-m", model.path});
  const std::string address = worker.wait_for_listening(60s);
  ASSERT_FALSE(address.empty()) << worker.output();
  const ModelIdentity identity{.hash = expected_hash(model.bytes), .name = "little-model"};
  auto client = WorkerClient::connect(address, identity);
  ASSERT_TRUE(client.ok()) << client.status();
  const WorkerInfo& info = (*client)->info();
  EXPECT_EQ(info.memory_budget_bytes, 123456789u);
  EXPECT_EQ(info.threads, 3u);
  EXPECT_EQ(info.model.hash, identity.hash);
  EXPECT_EQ(info.model.name, "little-model");
  EXPECT_THAT(worker.output(), HasSubstr(fmt::format("incarnation {:016x}", info.incarnation)));
  auto latency = (*client)->measure_latency(5);
  ASSERT_TRUE(latency.ok()) << latency.status();
  worker.signal(SIGTERM);
  const int status = worker.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(WorkerProcessTest, KilledWorkerFailsTheNextCallInsteadOfHanging) {
  WorkerProcess worker({"--listen", "127.0.0.1:0"});
  const std::string address = worker.wait_for_listening(60s);
  ASSERT_FALSE(address.empty()) << worker.output();
  WorkerClientOptions options;
  options.call_timeout = 1000ms;
  auto client = WorkerClient::connect(address, {}, options);
  ASSERT_TRUE(client.ok()) << client.status();
  worker.signal(SIGKILL);
  const int status = worker.wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  auto round_trip = (*client)->ping();
  ASSERT_FALSE(round_trip.ok());
  EXPECT_EQ(round_trip.status().code(), StatusCode::kUnavailable) << round_trip.status();
  EXPECT_THAT(std::string(round_trip.status().message()), HasSubstr("worker " + address));
}

TEST(WorkerProcessTest, StoppedWorkerFailsTheNextCallAtItsDeadline) {
  WorkerProcess worker({"--listen", "127.0.0.1:0"});
  const std::string address = worker.wait_for_listening(60s);
  ASSERT_FALSE(address.empty()) << worker.output();
  WorkerClientOptions options;
  options.call_timeout = 500ms;
  auto client = WorkerClient::connect(address, {}, options);
  ASSERT_TRUE(client.ok()) << client.status();
  worker.signal(SIGSTOP);
  worker.wait_until_stopped();
  auto round_trip = (*client)->ping();
  ASSERT_FALSE(round_trip.ok());
  EXPECT_EQ(round_trip.status().code(), StatusCode::kDeadlineExceeded) << round_trip.status();
  EXPECT_THAT(std::string(round_trip.status().message()), HasSubstr("within 500 ms"));
  worker.signal(SIGCONT);
}

TEST(WorkerProcessTest, WorkersCheckPrintsEachWorkerAndFailsOnAnUnreachableOne) {
  ModelFile model;
  WorkerProcess worker({"--listen", "127.0.0.1:0", "--memory", "2147483648", "-m", model.path});
  const std::string address = worker.wait_for_listening(60s);
  ASSERT_FALSE(address.empty()) << worker.output();
  WorkerProcess good({"--workers", address, "-m", model.path, "--pings", "3"}, "workers-check");
  ASSERT_TRUE(good.read_to_end(60s)) << good.output();
  int status = good.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << good.output();
  EXPECT_THAT(good.output(), HasSubstr(address));
  EXPECT_THAT(good.output(), HasSubstr("match"));
  EXPECT_THAT(good.output(), HasSubstr("2.0"));  // memory, GiB
  // A port nothing listens on: the worker's own, once it has exited.
  worker.signal(SIGTERM);
  worker.wait();
  WorkerProcess bad({"--workers", address, "--timeout-ms", "300"}, "workers-check");
  ASSERT_TRUE(bad.read_to_end(60s)) << bad.output();
  status = bad.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << bad.output();
  EXPECT_THAT(bad.output(), HasSubstr("is unreachable (connection refused)"));
}

TEST(WorkerProcessTest, MissingModelFileIsReportedAndExitsNonZero) {
  WorkerProcess worker({"--listen", "127.0.0.1:0", "-m", "/nonexistent/model.gguf"});
  ASSERT_TRUE(worker.read_to_end(60s)) << worker.output();
  const int status = worker.wait();
  EXPECT_THAT(worker.output(), HasSubstr("/nonexistent/model.gguf"));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
}

}  // namespace
}  // namespace folio::dist
