// The real `folio worker` binary (FOLIO_BINARY_PATH), started with posix_spawn: it prints its
// "listening" line, answers the handshake with what its command line declared and the hash of
// its model file, exits 0 on SIGTERM; killed or stopped, it gives the coordinator an error
// within the call's deadline, not a hang.
#include <signal.h>
#include <sys/wait.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "folio/base/random.h"
#include "folio/dist/pipeline_step_runner.h"
#include "folio/dist/worker_client.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/model/llama_model.h"
#include "testing/child_process.h"
#include "testing/collective_groups.h"
#include "testing/pipeline_steps.h"
#include "testing/random_model_file.h"

#include "process_pipeline.h"
#include "testing/worker_process.h"

namespace folio::dist {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

using folio::testing::WorkerProcess;

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

// Pipeline parallelism across real processes: two `folio worker` processes hold a generated
// model file; a PipelineStepRunner in this process prepares layers [0, 2) on one and [2, 4) on
// the other and relays every step of the script through them. The logits are bit-equal to the
// whole model run in this process with the same thread count.
TEST(WorkerProcessTest, PipelineOfTwoRealWorkersGivesTheLogitsOfOneProcess) {
  using Script = folio::testing::PipelineStepScript;
  model::LlamaShape shape;
  shape.num_layers = 4;
  shape.weight_dtype = DType::kQ8_0;
  const folio::testing::RandomModelFile model_file(shape, 43, "pipeline-model.gguf");
  const std::string& path = model_file.path;
  const std::string& hash = model_file.identity.hash;

  testing::ConnectedWorkers workers =
      testing::start_connected_workers(2, path, 2, model_file.identity);
  ASSERT_EQ(workers.clients.size(), 2u);
  std::vector<std::unique_ptr<WorkerClient>> clients = std::move(workers.clients);
  const std::string second_address = clients[1]->info().address;
  auto spec_of = [](int64_t first_layer, int64_t end_layer) {
    return testing::stage_spec(first_layer, end_layer, /*use_graphs=*/true, DType::kF16);
  };
  Result<std::unique_ptr<PipelineStepRunner>> runner =
      PipelineStepRunner::create(std::move(clients), {spec_of(0, 2), spec_of(2, 4)}, hash);
  ASSERT_TRUE(runner.ok()) << runner.status();

  Result<std::unique_ptr<model::LlamaModel>> local = model::LlamaModel::open(path);
  ASSERT_TRUE(local.ok()) << local.status();
  Result<std::unique_ptr<PipelineStage>> whole = PipelineStage::create(**local, spec_of(0, 4), 2);
  ASSERT_TRUE(whole.ok()) << whole.status();
  folio::testing::PipelineStepMaker maker(static_cast<int32_t>(shape.vocab_size));
  for (size_t index = 0; index < Script::steps().size(); ++index) {
    const folio::testing::PipelineStepArrays arrays = maker.make(index);
    Result<ir::StepOutput> expected = (*whole)->run(arrays.batch(), {});
    ASSERT_TRUE(expected.ok()) << expected.status();
    Result<ir::StepOutput> actual = (*runner)->run(arrays.batch());
    ASSERT_TRUE(actual.ok()) << actual.status();
    ASSERT_EQ(actual->logits.size(), expected->logits.size());
    EXPECT_EQ(
        std::memcmp(actual->logits.data(), expected->logits.data(), expected->logits.size_bytes()),
        0)
        << "step " << index;
  }
  // A worker that is gone fails the next step with an error naming it, within the deadline.
  workers.processes[1]->signal(SIGKILL);
  workers.processes[1]->wait();
  folio::testing::PipelineStepMaker again(static_cast<int32_t>(shape.vocab_size));
  const folio::testing::PipelineStepArrays arrays = again.make(0);
  Result<ir::StepOutput> lost = (*runner)->run(arrays.batch());
  ASSERT_EQ(lost.status().code(), StatusCode::kUnavailable) << lost.status();
  EXPECT_THAT(std::string(lost.status().message()), HasSubstr(second_address));
  EXPECT_THAT(std::string(lost.status().message()), HasSubstr("pipeline stage 1"));
}

// The whole command: `folio generate --local-workers 2` (two worker processes on free loopback
// ports, the layers split by the plan, stopped at exit) writes the same greedy text as one
// process, on the shipped demo model.
TEST(WorkerProcessTest, GenerateOverLocalWorkersWritesTheTextOfOneProcess) {
  const std::string model = std::string(FOLIO_SOURCE_DIR) + "/models/demo/kjv-f16.gguf";
  auto generate = [&](std::vector<std::string> extra) {
    std::vector<std::string> arguments = {"-m", model,           "-p", "In the beginning", "-n",
                                          "24", "--temperature", "0",  "--threads",        "2",
                                          "-q"};
    arguments.insert(arguments.end(), extra.begin(), extra.end());
    WorkerProcess process(arguments, "generate");
    EXPECT_TRUE(process.read_to_end(120s)) << process.output();
    const int status = process.wait();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << process.output();
    return process.output();
  };
  const std::string alone = generate({});
  const std::string pipelined = generate({"--local-workers", "2", "--local-worker-threads", "2"});
  const size_t summary = alone.rfind("[");  // the summary line on stderr, last
  ASSERT_NE(summary, std::string::npos) << alone;
  EXPECT_THAT(alone, HasSubstr("24 generated"));
  EXPECT_EQ(pipelined.substr(0, summary), alone.substr(0, summary)) << pipelined;
  EXPECT_THAT(pipelined, HasSubstr("24 generated"));
}

// `folio plan` prints the split and the bytes at the cut, and fails (non-zero, saying so) when
// the workers' memory cannot hold the model; `folio generate --workers` with a worker that is not
// there fails before serving, naming it.
TEST(WorkerProcessTest, PlanPrintsTheSplitAndUnreachableWorkersFailBeforeServing) {
  const std::string model = std::string(FOLIO_SOURCE_DIR) + "/models/demo/kjv-f16.gguf";
  WorkerProcess plan({"-m", model, "--workers", "2"}, "plan");
  ASSERT_TRUE(plan.read_to_end(60s)) << plan.output();
  int status = plan.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << plan.output();
  EXPECT_THAT(plan.output(), HasSubstr("pipeline of 2 stages"));
  EXPECT_THAT(plan.output(), HasSubstr("worker1"));
  EXPECT_THAT(plan.output(), HasSubstr("1024 bytes per token"));  // hidden 256, f32

  WorkerProcess too_small({"-m", model, "--worker-memory", "1000000,1000000"}, "plan");
  ASSERT_TRUE(too_small.read_to_end(60s)) << too_small.output();
  status = too_small.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << too_small.output();
  EXPECT_THAT(too_small.output(), HasSubstr("does not fit 2 workers"));

  // Port 1 on loopback: nothing listens there.
  WorkerProcess generate(
      {"-m", model, "-p", "In the beginning", "-n", "4", "-q", "--workers", "127.0.0.1:1"},
      "generate");
  ASSERT_TRUE(generate.read_to_end(60s)) << generate.output();
  status = generate.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << generate.output();
  EXPECT_THAT(generate.output(), HasSubstr("worker 127.0.0.1:1 is unreachable"));
}

}  // namespace
}  // namespace folio::dist
