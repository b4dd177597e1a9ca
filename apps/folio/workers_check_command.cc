// folio workers-check: handshakes with each worker of --workers A,B,... as a coordinator would
// and prints a table (address, incarnation, host, memory, threads, model, Ping latency), so a
// user can see that a group is ready before running on it. Exits non-zero when any worker
// fails, after printing every row (a worker's error in place of its figures).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <unistd.h>

#include "apps/folio/commands.h"
#include "apps/folio/model_hash.h"
#include "folio/dist/worker_client.h"

namespace folio::app {
namespace {

struct WorkersCheckOptions {
  std::vector<std::string> workers;
  std::string model_path;
  int32_t timeout_ms = 2000;
  int32_t pings = 10;
};

std::string coordinator_id() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return fmt::format("{}:{}", name, getpid());
}

std::string model_column(const dist::WorkerInfo& info, const dist::ModelIdentity& model) {
  if (info.model.hash.empty()) return "none";
  if (model.hash.empty()) return info.model.hash;
  return info.model.hash == model.hash ? "match" : "differs";
}

void run_workers_check(const WorkersCheckOptions& options) {
  dist::ModelIdentity model;
  if (!options.model_path.empty()) {
    Result<dist::ModelIdentity> identity = model_identity(options.model_path);
    check_command(identity.status());
    model = *identity;
  }
  dist::WorkerClientOptions client_options;
  client_options.coordinator_id = coordinator_id();
  client_options.connect_timeout = std::chrono::milliseconds(options.timeout_ms);
  client_options.call_timeout = std::chrono::milliseconds(options.timeout_ms);
  std::printf("%-24s %-16s %-16s %10s %7s %-24s %12s %12s\n", "address", "incarnation", "host",
              "memory_gib", "threads", "model", "ping_us_p50", "link_mib_s");
  int failures = 0;
  for (const std::string& address : options.workers) {
    Result<std::unique_ptr<dist::WorkerClient>> client =
        dist::WorkerClient::connect(address, model, client_options);
    Result<dist::WorkerLink> link = client.ok()
                                        ? (*client)->measure_link(std::max(1, options.pings))
                                        : Result<dist::WorkerLink>(client.status());
    if (!link.ok()) {
      ++failures;
      std::printf("%-24s error: %s\n", address.c_str(), link.status().to_string().c_str());
      continue;
    }
    const dist::WorkerInfo& info = (*client)->info();
    std::printf("%-24s %016llx %-16s %10.1f %7u %-24s %12.1f %12.1f\n", address.c_str(),
                static_cast<unsigned long long>(info.incarnation), info.host_name.c_str(),
                static_cast<double>(info.memory_budget_bytes) / double(1ull << 30), info.threads,
                model_column(info, model).c_str(),
                std::chrono::duration<double, std::micro>(link->latency.median).count(),
                link->bandwidth.bytes_per_second / double(1 << 20));
  }
  std::fflush(stdout);
  if (failures > 0) {
    check_command(unavailable("{} of {} workers failed the check (see the table)", failures,
                              options.workers.size()));
  }
}

}  // namespace

void add_workers_check_command(CLI::App& app) {
  auto options = std::make_shared<WorkersCheckOptions>();
  CLI::App* command = app.add_subcommand(
      "workers-check", "Handshake with each worker and print what it declares, with latency");
  command->add_option("--workers", options->workers, "Worker addresses, HOST:PORT,...")
      ->required()
      ->delimiter(',');
  command->add_option("-m,--model", options->model_path,
                      "The coordinator's model file: checks each worker holds the same");
  command->add_option("--timeout-ms", options->timeout_ms, "Deadline of each call")
      ->capture_default_str();
  command->add_option("--pings", options->pings, "Pings per worker for the latency median")
      ->capture_default_str();
  command->callback([options] { run_workers_check(*options); });
}

}  // namespace folio::app
