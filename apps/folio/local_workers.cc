#include "apps/folio/local_workers.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

extern char** environ;

namespace folio::app {
namespace {

constexpr auto kListenTimeout = std::chrono::seconds(30);
constexpr auto kStopGrace = std::chrono::seconds(5);

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The address of the worker's "folio worker: listening on ADDRESS (...)" line, or empty.
std::string listening_address(const std::string& log) {
  const std::string marker = "folio worker: listening on ";
  const size_t found = log.find(marker);
  if (found == std::string::npos) return std::string();
  const size_t start = found + marker.size();
  const size_t end = log.find(' ', start);
  if (end == std::string::npos) return std::string();
  return log.substr(start, end - start);
}

// True once `pid` has exited (and is reaped).
bool reaped(pid_t pid) {
  int status = 0;
  return waitpid(pid, &status, WNOHANG) == pid;
}

}  // namespace

Result<std::unique_ptr<LocalWorkers>> LocalWorkers::start(int32_t count,
                                                          const std::string& model_path,
                                                          int32_t threads, uint64_t memory_bytes) {
  if (count < 1) return invalid_argument("--local-workers needs at least 1 worker, got {}", count);
  std::error_code error;
  const std::filesystem::path binary = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return internal_error("cannot find this program's path: {}", error.message());
  std::unique_ptr<LocalWorkers> group(new LocalWorkers());
  std::string pattern =
      (std::filesystem::temp_directory_path() / "folio-local-workers-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    return internal_error("cannot create a directory for the workers' logs ({})", pattern);
  }
  group->log_directory_ = pattern;
  for (int32_t i = 0; i < count; ++i) {
    std::vector<std::string> arguments = {binary.string(),
                                          "worker",
                                          "--listen",
                                          "127.0.0.1:0",
                                          "-m",
                                          model_path,
                                          "--parent-pid",
                                          std::to_string(getpid())};
    if (threads > 0) {
      arguments.insert(arguments.end(), {"--threads", std::to_string(threads)});
    }
    if (memory_bytes > 0) {
      arguments.insert(arguments.end(), {"--memory", std::to_string(memory_bytes)});
    }
    std::vector<char*> argv;
    for (std::string& argument : arguments) argv.push_back(argument.data());
    argv.push_back(nullptr);
    const std::string log = fmt::format("{}/worker{}.log", group->log_directory_, i);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    pid_t pid = -1;
    const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) {
      return internal_error("cannot start local worker {} ({}): {}", i, argv[0],
                            std::strerror(spawned));
    }
    group->pids_.push_back(pid);
    group->logs_.push_back(log);
  }
  const auto deadline = std::chrono::steady_clock::now() + kListenTimeout;
  for (size_t i = 0; i < group->pids_.size(); ++i) {
    while (true) {
      const std::string text = read_text(group->logs_[i]);
      const std::string address = listening_address(text);
      if (!address.empty()) {
        group->addresses_.push_back(address);
        break;
      }
      if (reaped(group->pids_[i])) {
        group->pids_[i] = -1;
        return unavailable("local worker {} exited before listening: {}", i, text);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        return deadline_exceeded("local worker {} did not listen within {} s: {}", i,
                                 kListenTimeout.count(), text);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return group;
}

LocalWorkers::~LocalWorkers() {
  for (pid_t pid : pids_) {
    if (pid > 0) kill(pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + kStopGrace;
  for (pid_t& pid : pids_) {
    while (pid > 0 && !reaped(pid)) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid = -1;
  }
  std::error_code ignored;
  if (!log_directory_.empty()) std::filesystem::remove_all(log_directory_, ignored);
}

}  // namespace folio::app
