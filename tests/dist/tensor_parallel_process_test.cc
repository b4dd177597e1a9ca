// Tensor parallelism over real `folio worker` processes (issue 15, slice 4): two workers, each a
// rank of a generated f16 model with an f32 KV cache (no rounding of activations that an ulp
// could flip; tensor_parallel_test.cc says why q8_0's int8 activations can), forming a gloo
// group over loopback through the rendezvous store rank 0's worker serves (no directory), driven by
// a TensorParallelStepRunner over gRPC; against one process: logits within 1e-4 of each row's
// largest, the same greedy tokens. Then the commands: `folio generate
// --local-workers 2 --placement tp` writes the greedy text of one process on the demo model, and
// `folio plan --placement tp|auto` prints the heads per worker, or why a split is illegal.
#include <signal.h>
#include <sys/wait.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "folio/base/random.h"
#include "folio/dist/tensor_parallel_step_runner.h"
#include "folio/dist/worker_client.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/model/llama_model.h"
#include "testing/collective_groups.h"
#include "testing/pipeline_steps.h"
#include "testing/random_model_file.h"

#include "process_pipeline.h"
#include "testing/worker_process.h"

namespace folio::dist {
namespace {

using namespace std::chrono_literals;
using folio::testing::WorkerProcess;
using ::testing::HasSubstr;
using Script = folio::testing::PipelineStepScript;

// Every layer, replayed, an f32 KV cache: the stage spec of the pipeline tests' step script.
PipelineStageSpec whole_model_spec(int64_t num_layers) {
  return testing::stage_spec(0, num_layers, /*use_graphs=*/true, DType::kF32);
}

double worst_relative_difference(std::span<const float> actual, std::span<const float> expected,
                                 int32_t vocab) {
  double worst = 0;
  for (size_t row = 0; row * static_cast<size_t>(vocab) < expected.size(); ++row) {
    double largest = 0, difference = 0;
    for (size_t i = row * vocab; i < (row + 1) * vocab; ++i) {
      largest = std::max(largest, std::abs(static_cast<double>(expected[i])));
      difference = std::max(difference, std::abs(static_cast<double>(actual[i]) - expected[i]));
    }
    worst = std::max(worst, difference / std::max(largest, 1e-30));
  }
  return worst;
}

TEST(TensorParallelProcessTest, TwoRealWorkersGiveTheLogitsOfOneProcess) {
  model::LlamaShape shape;
  shape.num_layers = 3;
  shape.weight_dtype = DType::kF16;
  const folio::testing::RandomModelFile model_file(shape, 53, "tp-model.gguf");
  const std::string& path = model_file.path;
  const std::string& hash = model_file.identity.hash;

  testing::ConnectedWorkers workers =
      testing::start_connected_workers(2, path, 1, model_file.identity);
  ASSERT_EQ(workers.clients.size(), 2u);
  std::vector<std::unique_ptr<WorkerClient>> clients = std::move(workers.clients);
  PipelineStageSpec spec = whole_model_spec(shape.num_layers);
  // No rendezvous directory: the ranks meet in the store rank 0's worker serves over gRPC.
  spec.collective_store.clear();
  spec.collective_timeout = 20s;
  Result<std::unique_ptr<TensorParallelStepRunner>> runner =
      TensorParallelStepRunner::create(std::move(clients), spec, hash);
  ASSERT_TRUE(runner.ok()) << runner.status();
  ASSERT_EQ((*runner)->ranks().size(), 2u);
  // Each rank's KV cache holds its half of the KV heads (f32).
  EXPECT_EQ((*runner)->ranks()[0].kv_cache_bytes, Script::kNumBlocks * 2 * shape.num_layers *
                                                      Script::kBlockSize * shape.kv_dim() / 2 * 4);

  Result<std::unique_ptr<model::LlamaModel>> local = model::LlamaModel::open(path);
  ASSERT_TRUE(local.ok()) << local.status();
  Result<std::unique_ptr<PipelineStage>> whole =
      PipelineStage::create(**local, whole_model_spec(shape.num_layers), 1);
  ASSERT_TRUE(whole.ok()) << whole.status();
  folio::testing::PipelineStepMaker maker(static_cast<int32_t>(shape.vocab_size));
  int64_t tokens = 0;
  for (size_t index = 0; index < Script::steps().size(); ++index) {
    const folio::testing::PipelineStepArrays arrays = maker.make(index);
    Result<ir::StepOutput> expected = (*whole)->run(arrays.batch(), {});
    ASSERT_TRUE(expected.ok()) << expected.status();
    const std::vector<float> expected_logits(expected->logits.begin(), expected->logits.end());
    Result<ir::StepOutput> actual = (*runner)->run(arrays.batch());
    ASSERT_TRUE(actual.ok()) << actual.status();
    ASSERT_EQ(actual->logits.size(), expected_logits.size());
    EXPECT_LE(worst_relative_difference(actual->logits, expected_logits, actual->vocab_size), 1e-4)
        << "step " << index;
    for (int32_t row = 0; row < actual->num_rows; ++row) {
      const auto begin = static_cast<size_t>(row) * actual->vocab_size;
      const auto expected_row = std::span<const float>(expected_logits)
                                    .subspan(begin, static_cast<size_t>(actual->vocab_size));
      const auto actual_row = actual->logits.subspan(begin, expected_row.size());
      EXPECT_EQ(std::max_element(actual_row.begin(), actual_row.end()) - actual_row.begin(),
                std::max_element(expected_row.begin(), expected_row.end()) - expected_row.begin())
          << "step " << index << ", row " << row;
    }
    // The step runs padded to its bucket (1, 2, 4, ... 32): the reductions cover the padding.
    int32_t bucket = 1;
    while (bucket < arrays.batch().num_tokens()) bucket *= 2;
    tokens += bucket;
  }
  // Two all-reduces per layer of each (padded) token's hidden row, f32.
  const TensorParallelTraffic& traffic = (*runner)->traffic();
  EXPECT_EQ(traffic.reduced_bytes, tokens * 2 * shape.num_layers * shape.hidden_size * 4);
  EXPECT_GT(traffic.communication_ns, 0);

  // A rank that is gone fails the next step, naming it.
  workers.processes[1]->signal(SIGKILL);
  workers.processes[1]->wait();
  folio::testing::PipelineStepMaker again(static_cast<int32_t>(shape.vocab_size));
  Result<ir::StepOutput> lost = (*runner)->run(again.make(0).batch());
  ASSERT_FALSE(lost.ok());
  EXPECT_THAT(std::string(lost.status().message()), HasSubstr("tensor rank"));
}

std::string demo_model(const char* name) {
  return std::string(FOLIO_SOURCE_DIR) + "/models/demo/" + name;
}

// `folio generate --local-workers 2 --placement tp` writes the greedy text of one process.
TEST(TensorParallelProcessTest, GenerateOverTwoLocalRanksWritesTheTextOfOneProcess) {
  auto generate = [&](std::vector<std::string> extra) {
    std::vector<std::string> arguments = {"-m",
                                          demo_model("kjv-q8_0.gguf"),
                                          "-p",
                                          "In the beginning",
                                          "-n",
                                          "24",
                                          "--temperature",
                                          "0",
                                          "--threads",
                                          "2",
                                          "-q"};
    arguments.insert(arguments.end(), extra.begin(), extra.end());
    WorkerProcess process(arguments, "generate");
    EXPECT_TRUE(process.read_to_end(120s)) << process.output();
    const int status = process.wait();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << process.output();
    return process.output();
  };
  // The text, without the log lines (their times differ).
  auto text_of = [](const std::string& output) {
    std::string text;
    size_t start = 0;
    while (start < output.size()) {
      size_t end = output.find('\n', start);
      if (end == std::string::npos) end = output.size();
      const std::string line = output.substr(start, end - start);
      if (line.find("] [info]") == std::string::npos) text += line + "\n";
      start = end + 1;
    }
    return text;
  };
  const std::string alone = text_of(generate({}));
  const std::string split = text_of(
      generate({"--local-workers", "2", "--local-worker-threads", "1", "--placement", "tp"}));
  const size_t summary = alone.rfind("[");
  ASSERT_NE(summary, std::string::npos) << alone;
  EXPECT_THAT(alone, HasSubstr("24 generated"));
  EXPECT_EQ(split.substr(0, summary), alone.substr(0, summary)) << split;
  EXPECT_THAT(split, HasSubstr("24 generated"));
}

// `folio plan --placement tp` prints heads and bytes per worker and the all-reduce traffic;
// an illegal split fails naming why and the worker counts that work; auto says what it chose.
TEST(TensorParallelProcessTest, PlanPrintsTheRanksOrWhyTheyCannotSplit) {
  auto plan = [](std::vector<std::string> arguments, bool succeeds) {
    WorkerProcess process(arguments, "plan");
    EXPECT_TRUE(process.read_to_end(60s)) << process.output();
    const int status = process.wait();
    EXPECT_EQ(WIFEXITED(status) && WEXITSTATUS(status) == 0, succeeds) << process.output();
    return process.output();
  };
  const std::string two =
      plan({"-m", demo_model("kjv-q8_0.gguf"), "--workers", "2", "--placement", "tp"}, true);
  EXPECT_THAT(two, HasSubstr("tensor parallel over 2 ranks"));
  EXPECT_THAT(two, HasSubstr("worker1"));
  EXPECT_THAT(two, HasSubstr("4-7"));      // rank 1's heads of 8
  EXPECT_THAT(two, HasSubstr("352-703"));  // rank 1's FFN features of 704
  // 4 layers x 2 all-reduces x 256 f32: 8192 bytes reduced, half of it sent by each of 2 ranks.
  EXPECT_THAT(two, HasSubstr("8 all-reduces"));
  EXPECT_THAT(two, HasSubstr("8192 bytes in all; each rank sends 8192 bytes"));

  const std::string three =
      plan({"-m", demo_model("kjv-q8_0.gguf"), "--workers", "3", "--placement", "tp"}, false);
  EXPECT_THAT(three, HasSubstr("4 KV heads do not divide over 3 ranks"));
  // FFN 704 over 4 ranks is 176 per rank, not whole q8_0 blocks; f16 splits.
  const std::string four =
      plan({"-m", demo_model("kjv-q8_0.gguf"), "--workers", "4", "--placement", "tp"}, false);
  EXPECT_THAT(four, HasSubstr("ffn_down.weight (q8_0, 704 input features)"));
  EXPECT_THAT(four, HasSubstr("rank counts that split this model: 2"));
  plan({"-m", demo_model("kjv-f16.gguf"), "--workers", "4", "--placement", "tp"}, true);

  const std::string automatic =
      plan({"-m", demo_model("kjv-q8_0.gguf"), "--workers", "2", "--placement", "auto"}, true);
  EXPECT_THAT(automatic, HasSubstr("placement auto chose"));
  EXPECT_THAT(automatic, HasSubstr("with tensor parallelism"));
  EXPECT_THAT(automatic, HasSubstr("with a pipeline"));
}

}  // namespace
}  // namespace folio::dist
