// A PP=2 pipeline (layers [0, 2) and [2, 4) of pipeline_test_model.h's model) over real `folio
// worker` processes, with a replacer that spawns a new process beside the coordinator: the
// fixture of the recovery tests that kill, stop or cut off a worker process.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "folio/base/check.h"
#include "folio/dist/pipeline_step_runner.h"
#include "folio/dist/worker_client.h"
#include "testing/worker_process.h"

#include "pipeline_test_model.h"

namespace folio::dist::testing {

// The pipelines' leases: a stopped worker is given up on after 5 x 100 ms, while a busy survivor
// (its step's threads on the same 2 cores as everything else) does not miss that many beats.
inline constexpr std::chrono::milliseconds kLeaseInterval{100};
inline constexpr int32_t kPipelineLeaseMisses = 5;

// Polls `done` every millisecond (a polling period, not synchronization) until it holds (true)
// or 60 s pass (false).
template <typename Done>
bool wait_for(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// `count` `folio worker -m MODEL --threads N` processes on free loopback ports and a client
// connected to each, in order.
struct ConnectedWorkers {
  std::vector<std::unique_ptr<folio::testing::WorkerProcess>> processes;
  std::vector<std::unique_ptr<WorkerClient>> clients;
};

// Empty, with the test failed naming the worker, when one does not start or answer.
inline ConnectedWorkers start_connected_workers(int count, const std::string& model_path,
                                                int threads, const ModelIdentity& identity) {
  ConnectedWorkers workers;
  for (int index = 0; index < count; ++index) {
    workers.processes.push_back(
        std::make_unique<folio::testing::WorkerProcess>(std::vector<std::string>{
            "--listen", "127.0.0.1:0", "--threads", std::to_string(threads), "-m", model_path}));
  }
  for (const std::unique_ptr<folio::testing::WorkerProcess>& process : workers.processes) {
    const std::string address = process->wait_for_listening(std::chrono::seconds(60));
    if (address.empty()) {
      ADD_FAILURE() << "a worker did not start: " << process->output();
      return {};
    }
    Result<std::unique_ptr<WorkerClient>> client = WorkerClient::connect(address, identity);
    if (!client.ok()) {
      ADD_FAILURE() << "worker " << address << ": " << client.status().to_string();
      return {};
    }
    workers.clients.push_back(std::move(client).value());
  }
  return workers;
}

// Where a stage's worker runs and how the coordinator connects to it.
struct WorkerPlacement {
  std::string host = "127.0.0.1";
  // Runs the binary in another context (e.g. `ip netns exec NS`); empty: directly.
  std::vector<std::string> launcher;
  WorkerClientOptions client_options;
  // Non-empty: the worker starts without the model file, with this weight cache (--cache-dir),
  // and is sent its stage's tensors (the pipeline's ShardSource); its replacements too.
  std::string cache_directory;
};

// A `folio worker` of 2 threads holding `model` on HOST:0; `address` is where it listens (empty
// if it did not start within 60 s).
inline std::unique_ptr<folio::testing::WorkerProcess> spawn_worker(const ModelOnDisk& model,
                                                                   const WorkerPlacement& placement,
                                                                   std::string& address) {
  std::vector<std::string> arguments{"--listen", placement.host + ":0", "--threads", "2"};
  if (placement.cache_directory.empty()) {
    arguments.insert(arguments.end(), {"-m", model.path});
  } else {
    arguments.insert(arguments.end(), {"--cache-dir", placement.cache_directory});
  }
  auto process = std::make_unique<folio::testing::WorkerProcess>(std::move(arguments), "worker",
                                                                 placement.launcher);
  address = process->wait_for_listening(std::chrono::seconds(60));
  return process;
}

// Members in destruction order: the runner first, then the processes (killed).
class ProcessPipeline {
 public:
  // `placement(stage)` says where each stage's first worker runs (default: loopback);
  // replacements always run on loopback, with the weight cache of the stage's placement.
  // `weights`: sends workers without the model file their shards (must outlive the pipeline).
  explicit ProcessPipeline(const ModelOnDisk& model,
                           const std::function<WorkerPlacement(int32_t)>& placement = {},
                           ShardSource* weights = nullptr)
      : model_(model) {
    std::vector<std::unique_ptr<WorkerClient>> clients;
    for (int32_t s = 0; s < 2; ++s) {
      const WorkerPlacement where = placement ? placement(s) : WorkerPlacement{};
      std::string address;
      workers_.push_back(spawn_worker(model, where, address));
      FOLIO_CHECK(!address.empty(), "worker did not start: {}", workers_.back()->output());
      Result<std::unique_ptr<WorkerClient>> client =
          WorkerClient::connect(address, model.identity, where.client_options);
      FOLIO_CHECK(client.ok(), "{}", client.status().to_string());
      clients.push_back(std::move(client).value());
    }
    PipelineRecoveryOptions recovery;
    recovery.lease_interval = kLeaseInterval;
    recovery.lease_misses = kPipelineLeaseMisses;
    recovery.weight_source = weights;
    recovery.replace_worker = [this, placement](
                                  int32_t stage,
                                  const std::string&) -> Result<std::unique_ptr<WorkerClient>> {
      WorkerPlacement replacement;
      if (placement) replacement.cache_directory = placement(stage).cache_directory;
      std::string address;
      workers_.push_back(spawn_worker(model_, replacement, address));
      if (address.empty()) return unavailable("a spare worker did not start");
      return WorkerClient::connect(address, model_.identity);
    };
    Result<std::unique_ptr<PipelineStepRunner>> runner = PipelineStepRunner::create(
        std::move(clients), {stage_spec(0, 2, true), stage_spec(2, 4, true)}, model.identity.hash,
        recovery);
    FOLIO_CHECK(runner.ok(), "{}", runner.status().to_string());
    runner_ = std::move(runner).value();
  }

  PipelineStepRunner& runner() { return *runner_; }
  folio::testing::WorkerProcess& worker(size_t index) { return *workers_[index]; }
  size_t num_processes() const { return workers_.size(); }

 private:
  const ModelOnDisk& model_;
  std::vector<std::unique_ptr<folio::testing::WorkerProcess>> workers_;
  std::unique_ptr<PipelineStepRunner> runner_;
};

}  // namespace folio::dist::testing
