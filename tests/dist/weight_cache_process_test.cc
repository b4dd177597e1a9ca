// The weight cache with real `folio worker --cache-dir` processes (FOLIO_BINARY_PATH), started
// without the model file: a PP=2 pipeline's first start fetches each stage's tensors, bit-equal
// to the whole model in this process; a second start over the same caches fetches 0 bytes; a
// stage worker killed with SIGKILL is replaced by a new process on the same cache, which fetches
// 0 bytes, and the logits stay bit-equal after the replay.
#include <signal.h>
#include <sys/wait.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "folio/dist/pipeline_step_runner.h"
#include "folio/dist/shard_source.h"
#include "pipeline_test_model.h"
#include "process_pipeline.h"

namespace folio::dist {
namespace {

using engine::RunnerRecovery;
using testing::expect_bit_equal;
using testing::kNumLayers;
using testing::ModelOnDisk;
using testing::ProcessPipeline;
using testing::WorkerPlacement;

// The bytes of every tensor of the file: a PP=2 split of the fixture's model reads each tensor
// exactly once (untied: the embedding on stage 0, output.weight on stage 1).
int64_t all_tensor_bytes(const gguf::GgufFile& file) {
  int64_t bytes = 0;
  for (const gguf::GgufTensorInfo& info : file.tensors()) {
    bytes += static_cast<int64_t>(info.byte_size);
  }
  return bytes;
}

TEST(WeightCacheProcessTest, WarmStartAndAReplacementAfterSigkillFetchNothing) {
  const ModelOnDisk model(DType::kF32);
  const std::vector<std::vector<float>> expected =
      testing::reference_logits(model, testing::stage_spec(0, kNumLayers, true));
  const std::vector<folio::testing::PipelineStepArrays> steps = testing::script_steps();
  Result<gguf::GgufFile> file = gguf::GgufFile::open(model.path);
  ASSERT_TRUE(file.ok());
  folio::testing::TemporaryDirectory caches;
  const auto placement = [&](int32_t stage) {
    WorkerPlacement where;
    where.cache_directory = fmt::format("{}/stage{}", caches.path(), stage);
    return where;
  };

  {  // Cold: both stages fetch their shards.
    ShardSource source(*file, model.identity.hash);
    ProcessPipeline pipeline(model, placement, &source);
    EXPECT_EQ(source.bytes_fetched_total(), all_tensor_bytes(*file));
    for (size_t index = 0; index < steps.size(); ++index) {
      expect_bit_equal(pipeline.runner().run(steps[index].batch()), expected[index], index);
    }
  }

  // Warm: new processes on the same caches fetch nothing; then stage 1's worker is killed and
  // its replacement, on stage 1's cache, fetches nothing either.
  ShardSource source(*file, model.identity.hash);
  ProcessPipeline pipeline(model, placement, &source);
  EXPECT_EQ(source.bytes_fetched_total(), 0);
  PipelineStepRunner& runner = pipeline.runner();
  constexpr size_t kFailingStep = 4;
  for (size_t index = 0; index < kFailingStep; ++index) {
    expect_bit_equal(runner.run(steps[index].batch()), expected[index], index);
  }
  pipeline.worker(1).signal(SIGKILL);
  const int status = pipeline.worker(1).wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  Result<ir::StepOutput> failed = runner.run(steps[kFailingStep].batch());
  ASSERT_EQ(failed.status().code(), StatusCode::kUnavailable) << failed.status();
  const Result<RunnerRecovery> recovery = runner.recover(failed.status());
  ASSERT_TRUE(recovery.ok()) << recovery.status();
  EXPECT_EQ(pipeline.num_processes(), 3u);
  EXPECT_EQ(source.bytes_fetched_total(), 0) << "the replacement found its shard in the cache";
  for (size_t index = 0; index < kFailingStep; ++index) {
    ASSERT_TRUE(runner.replay(steps[index].batch(), recovery->replay_through_stage).ok());
  }
  for (size_t index = kFailingStep; index < steps.size(); ++index) {
    expect_bit_equal(runner.run(steps[index].batch()), expected[index], index);
  }
}

}  // namespace
}  // namespace folio::dist
