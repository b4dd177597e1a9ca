#include "apps/folio/local_workers.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
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

// True once `pid` has exited (and is reaped, here or before: ECHILD).
bool reaped(pid_t pid) {
  int status = 0;
  const pid_t answered = waitpid(pid, &status, WNOHANG);
  return answered == pid || (answered < 0 && errno == ECHILD);
}

}  // namespace

Result<std::unique_ptr<LocalWorkers>> LocalWorkers::start(int32_t count,
                                                          const std::string& model_path,
                                                          int32_t threads, uint64_t memory_bytes,
                                                          const std::string& cache_directory) {
  if (count < 1) return invalid_argument("--local-workers needs at least 1 worker, got {}", count);
  std::error_code error;
  const std::filesystem::path binary = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return internal_error("cannot find this program's path: {}", error.message());
  std::unique_ptr<LocalWorkers> group(new LocalWorkers());
  group->binary_ = binary.string();
  group->model_path_ = model_path;
  group->cache_directory_ = cache_directory;
  group->threads_ = threads;
  group->memory_bytes_ = memory_bytes;
  std::string pattern =
      (std::filesystem::temp_directory_path() / "folio-local-workers-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    return internal_error("cannot create a directory for the workers' logs ({})", pattern);
  }
  group->log_directory_ = pattern;
  const MutexLock lock(group->mutex_);
  // All start at once; then each is waited for.
  for (int32_t i = 0; i < count; ++i) {
    FOLIO_ASSIGN_OR_RETURN(Worker worker, group->spawn(static_cast<size_t>(i), 0));
    group->workers_.push_back(std::move(worker));
  }
  const auto deadline = std::chrono::steady_clock::now() + kListenTimeout;
  for (size_t i = 0; i < group->workers_.size(); ++i) {
    FOLIO_RETURN_IF_ERROR(group->wait_listening(i, group->workers_[i], deadline));
  }
  return group;
}

Result<LocalWorkers::Worker> LocalWorkers::spawn(size_t index, int32_t generation) const {
  std::vector<std::string> arguments = {binary_,       "worker",       "--listen",
                                        "127.0.0.1:0", "--parent-pid", std::to_string(getpid())};
  if (cache_directory_.empty()) {
    arguments.insert(arguments.end(), {"-m", model_path_});
  } else {
    arguments.insert(arguments.end(), {"--cache-dir", cache_directory_});
  }
  if (threads_ > 0) arguments.insert(arguments.end(), {"--threads", std::to_string(threads_)});
  if (memory_bytes_ > 0) {
    arguments.insert(arguments.end(), {"--memory", std::to_string(memory_bytes_)});
  }
  std::vector<char*> argv;
  for (std::string& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  Worker worker;
  worker.log = generation == 0
                   ? fmt::format("{}/worker{}.log", log_directory_, index)
                   : fmt::format("{}/worker{}.{}.log", log_directory_, index, generation);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, worker.log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  const int spawned = posix_spawn(&worker.pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    return internal_error("cannot start local worker {} ({}): {}", index, argv[0],
                          std::strerror(spawned));
  }
  return worker;
}

Status LocalWorkers::wait_listening(size_t index, Worker& worker,
                                    std::chrono::steady_clock::time_point deadline) const {
  while (true) {
    const std::string text = read_text(worker.log);
    worker.address = listening_address(text);
    if (!worker.address.empty()) return Status();
    if (reaped(worker.pid)) {
      worker.pid = -1;
      return unavailable("local worker {} exited before listening: {}", index, text);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return deadline_exceeded("local worker {} did not listen within {} s: {}", index,
                               kListenTimeout.count(), text);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::vector<std::string> LocalWorkers::addresses() const {
  const MutexLock lock(mutex_);
  std::vector<std::string> addresses;
  for (const Worker& worker : workers_) addresses.push_back(worker.address);
  return addresses;
}

std::vector<pid_t> LocalWorkers::worker_pids() const {
  const MutexLock lock(mutex_);
  std::vector<pid_t> pids;
  for (const Worker& worker : workers_) pids.push_back(worker.pid);
  return pids;
}

int32_t LocalWorkers::num_replaced() const {
  const MutexLock lock(mutex_);
  return num_replaced_;
}

Result<std::string> LocalWorkers::replace(const std::string& lost_address) {
  const MutexLock lock(mutex_);
  size_t index = 0;
  while (index < workers_.size() && workers_[index].address != lost_address) ++index;
  if (index == workers_.size()) {
    return not_found("no local worker listens on {} (it may have been replaced already)",
                     lost_address);
  }
  FOLIO_ASSIGN_OR_RETURN(Worker worker, spawn(index, num_replaced_ + 1));
  const Status listening =
      wait_listening(index, worker, std::chrono::steady_clock::now() + kListenTimeout);
  if (!listening.ok()) {
    if (worker.pid > 0) retired_pids_.push_back(worker.pid);
    return listening.with_context(fmt::format("replacing the worker at {}", lost_address));
  }
  retired_pids_.push_back(workers_[index].pid);
  workers_[index] = std::move(worker);
  ++num_replaced_;
  return workers_[index].address;
}

LocalWorkers::~LocalWorkers() {
  const MutexLock lock(mutex_);
  std::vector<pid_t> pids = retired_pids_;
  for (const Worker& worker : workers_) pids.push_back(worker.pid);
  for (pid_t pid : pids) {
    if (pid > 0) kill(pid, SIGTERM);
    // A stopped worker (SIGSTOP) acts on SIGTERM only once it runs again.
    if (pid > 0) kill(pid, SIGCONT);
  }
  const auto deadline = std::chrono::steady_clock::now() + kStopGrace;
  for (pid_t& pid : pids) {
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
