// folio worker: a worker process of a scale-out group (issue 15). It serves the control plane
// (dist::WorkerService) on --listen HOST:PORT until SIGINT or SIGTERM, and declares its memory
// budget, threads and model (-m, hashed at start) to coordinators that connect. Prints one line
// on stderr once it listens ("folio worker: listening on HOST:PORT ..."), which scripts and
// tests wait for. With a model it runs one pipeline stage a coordinator prepares on it
// (PrepareStage, RunStage: docs/design/dist.md, "Pipeline stages"). A coordinator that gave up
// on it (recovery, issue 16) tells it to exit with the Shutdown call: it then stops as on
// SIGTERM (exit 0). Without -m it keeps a weight cache (--cache-dir, by default
// $XDG_CACHE_HOME/folio/weights, else ~/.cache/folio/weights): a coordinator sends it the
// tensors of its stage that the cache lacks, and it builds the stage from the cache alone
// (issue 15, slice 5; docs/design/dist.md, "Weight cache").
#include <pthread.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "apps/folio/commands.h"
#include "apps/folio/model_hash.h"
#include "apps/folio/shutdown_signals.h"
#include "folio/dist/weight_cache.h"
#include "folio/dist/worker_service.h"

namespace folio::app {
namespace {

struct WorkerOptions {
  std::string listen_address;
  uint64_t memory_budget_bytes = 0;  // 0: the machine's physical memory
  uint32_t threads = 0;              // 0: the machine's hardware threads
  std::string model_path;
  std::string cache_directory;  // empty: the default (default_cache_directory), without -m
  int32_t shutdown_grace_ms = 2000;
  int64_t parent_pid = 0;  // 0: live on without a parent
};

uint64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

// Where a worker without -m keeps its weight cache unless told: the user's cache directory
// (XDG's rule), so a worker started again on the same machine finds what it fetched before.
std::string default_cache_directory() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && xdg[0] == '/') {
    return fmt::format("{}/folio/weights", xdg);
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0') {
    return fmt::format("{}/.cache/folio/weights", home);
  }
  return fmt::format("/tmp/folio-weights-{}", getuid());
}

void run_worker(const WorkerOptions& options) {
  ShutdownSignals shutdown_signals;  // before any thread starts (gRPC's included)
  if (options.parent_pid != 0) {
    // SIGTERM, which shutdown_signals waits for, when the process that started this one ends
    // (`--local-workers`); a parent gone before this call is seen by getppid() after it.
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != options.parent_pid) {
      check_command(
          failed_precondition("folio worker: parent process {} is gone", options.parent_pid));
    }
  }

  dist::WorkerServiceOptions service_options;
  service_options.listen_address = options.listen_address;
  service_options.memory_budget_bytes =
      options.memory_budget_bytes != 0 ? options.memory_budget_bytes : physical_memory_bytes();
  service_options.threads =
      options.threads != 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  if (!options.model_path.empty()) {
    Result<dist::ModelIdentity> model = model_identity(options.model_path);
    check_command(model.status());
    service_options.model = *model;
    service_options.model_path = options.model_path;
  } else if (!options.cache_directory.empty()) {
    service_options.cache_directory = options.cache_directory;  // an error at start if unusable
  } else {
    // The default is a convenience: a worker that cannot use it still serves the handshake, and
    // refuses stages saying to give --cache-dir.
    const std::string directory = default_cache_directory();
    Result<std::unique_ptr<dist::WeightCache>> usable = dist::WeightCache::open(directory);
    if (usable.ok()) {
      service_options.cache_directory = directory;
    } else {
      std::fprintf(stderr, "folio worker: no weight cache: %s\n",
                   usable.status().to_string().c_str());
    }
  }
  // Shutdown from a coordinator: SIGTERM to the thread that waits for it below, so the service
  // stops in the same order (the Shutdown call's answer goes out in the grace).
  service_options.on_shutdown_request = [&shutdown_signals] { shutdown_signals.request(SIGTERM); };
  Result<std::unique_ptr<dist::WorkerService>> service =
      dist::WorkerService::start(service_options);
  check_command(service.status());
  const std::string cache_note =
      service_options.cache_directory.empty()
          ? std::string()
          : fmt::format(", weight cache {}", service_options.cache_directory);
  std::fprintf(
      stderr,
      "folio worker: listening on %s (incarnation %016llx, memory %llu bytes, %u "
      "threads, model %s%s)\n",
      (*service)->address().c_str(), static_cast<unsigned long long>((*service)->incarnation()),
      static_cast<unsigned long long>(service_options.memory_budget_bytes), service_options.threads,
      service_options.model.hash.empty()
          ? "none"
          : (service_options.model.name + " " + service_options.model.hash).c_str(),
      cache_note.c_str());
  std::fflush(stderr);
  const int received = shutdown_signals.wait();
  std::fprintf(stderr, "folio worker: signal %d, shutting down\n", received);
  (*service)->shutdown(std::chrono::milliseconds(options.shutdown_grace_ms));
  std::fprintf(stderr, "folio worker: stopped\n");
}

}  // namespace

void add_worker_command(CLI::App& app) {
  auto options = std::make_shared<WorkerOptions>();
  CLI::App* command =
      app.add_subcommand("worker", "Serve as a worker of a scale-out group (control plane)");
  command->add_option("--listen", options->listen_address, "HOST:PORT to listen on (port 0: any)")
      ->required();
  command->add_option("--memory", options->memory_budget_bytes,
                      "Memory budget to declare, bytes (default: the machine's physical memory)");
  command->add_option("--threads", options->threads,
                      "Compute threads to declare (default: the machine's hardware threads)");
  command->add_option("-m,--model", options->model_path,
                      "Model file this worker holds; its hash is checked at the handshake and "
                      "it runs the pipeline stages coordinators prepare");
  command->add_option("--cache-dir", options->cache_directory,
                      "Without -m: the weight cache, where the tensors a coordinator sends are "
                      "kept by content hash and verified when read (default: "
                      "$XDG_CACHE_HOME/folio/weights, else ~/.cache/folio/weights)");
  command
      ->add_option("--shutdown-grace-ms", options->shutdown_grace_ms,
                   "Milliseconds calls in flight get to finish on SIGINT/SIGTERM")
      ->capture_default_str();
  command->add_option("--parent-pid", options->parent_pid,
                      "Stop (as on SIGTERM) when this process, the one that started the worker, "
                      "ends");
  command->callback([options] { run_worker(*options); });
}

}  // namespace folio::app
