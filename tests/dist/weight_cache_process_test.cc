// The weight cache with real `folio worker --cache-dir` processes (FOLIO_BINARY_PATH), started
// without the model file: a PP=2 pipeline's first start fetches each stage's tensors, bit-equal
// to the whole model in this process; a second start over the same caches fetches 0 bytes; a
// stage worker killed with SIGKILL is replaced by a new process on the same cache, which fetches
// 0 bytes, and the logits stay bit-equal after the replay. The whole command: `folio generate
// --local-workers 2 --local-worker-cache DIR` on the demo model writes the text of one process,
// fetching every shard on the first run and nothing on the second, nor for the replacement of a
// worker it kills.
#include <signal.h>
#include <sys/wait.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>

#include "folio/dist/pipeline_step_runner.h"
#include "folio/dist/shard_source.h"
#include "pipeline_test_model.h"
#include "process_pipeline.h"
#include "testing/worker_process.h"

namespace folio::dist {
namespace {

using engine::RunnerRecovery;
using testing::expect_bit_equal;
using ::testing::HasSubstr;
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

// The byte counts of the coordinator's "worker A fetched N weight bytes" lines, in order.
// (Scanned by hand: GCC 12's -Wmaybe-uninitialized trips over <regex> in the ASan build.)
std::vector<int64_t> fetched_lines(const std::string& output) {
  std::vector<int64_t> fetched;
  const std::string before = "fetched ", after = " weight bytes";
  for (size_t at = output.find(before); at != std::string::npos; at = output.find(before, at + 1)) {
    const size_t digits = at + before.size();
    size_t end = digits;
    while (end < output.size() && std::isdigit(static_cast<unsigned char>(output[end]))) ++end;
    if (end > digits && output.compare(end, after.size(), after) == 0) {
      fetched.push_back(std::stoll(output.substr(digits, end - digits)));
    }
  }
  return fetched;
}

// Whether a log line ("[hh:mm:ss.mmm] [level] ...") starts at `at`: a bracket of digits, colons
// and dots, a space, a bracket of lower-case letters, a space.
bool log_line_at(const std::string& text, size_t at) {
  auto bracket = [&](size_t& position, auto allowed) {
    if (position >= text.size() || text[position] != '[') return false;
    size_t end = position + 1;
    while (end < text.size() && allowed(text[end])) ++end;
    if (end == position + 1 || end >= text.size() || text[end] != ']') return false;
    position = end + 1;
    return position < text.size() && text[position++] == ' ';
  };
  size_t position = at;
  return bracket(position,
                 [](char c) {
                   return std::isdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.';
                 }) &&
         bracket(position, [](char c) { return c >= 'a' && c <= 'z'; });
}

// The output without its log lines ("[hh:mm:ss.mmm] [level] ...\n"), which may cut into the
// streamed text.
std::string without_log_lines(const std::string& output) {
  std::string text;
  for (size_t at = 0; at < output.size();) {
    if (log_line_at(output, at)) {
      const size_t end = output.find('\n', at);
      if (end == std::string::npos) {  // an unfinished line stays, as the pattern required '\n'
        text += output.substr(at);
        break;
      }
      at = end + 1;
      continue;
    }
    text += output[at++];
  }
  return text;
}

TEST(WeightCacheProcessTest, GenerateOverCacheBackedLocalWorkersFetchesOnceAndNotAfterAKill) {
  using namespace std::chrono_literals;
  const std::string model = std::string(FOLIO_SOURCE_DIR) + "/models/demo/kjv-f16.gguf";
  auto generate = [&](std::vector<std::string> extra) {
    std::vector<std::string> arguments = {"-m", model,           "-p", "In the beginning", "-n",
                                          "24", "--temperature", "0",  "--threads",        "2",
                                          "-q"};
    arguments.insert(arguments.end(), extra.begin(), extra.end());
    folio::testing::WorkerProcess process(arguments, "generate");
    EXPECT_TRUE(process.read_to_end(120s)) << process.output();
    const int status = process.wait();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << process.output();
    return process.output();
  };
  const std::string alone = generate({});
  const size_t summary = alone.rfind("[");
  ASSERT_NE(summary, std::string::npos) << alone;
  const std::string text = alone.substr(0, summary);

  Result<gguf::GgufFile> file = gguf::GgufFile::open(model);
  ASSERT_TRUE(file.ok());
  // Two stages read every tensor once, and the embedding twice when the LM head is tied to it.
  int64_t expected = all_tensor_bytes(*file);
  if (file->find_tensor("output.weight") == nullptr) {
    expected += static_cast<int64_t>(file->find_tensor("token_embd.weight")->byte_size);
  }
  folio::testing::TemporaryDirectory cache;
  const std::vector<std::string> workers = {
      "--local-workers", "2", "--local-worker-threads", "2", "--local-worker-cache", cache.path()};
  const std::string cold = generate(workers);
  EXPECT_THAT(without_log_lines(cold), HasSubstr(text));
  const std::vector<int64_t> cold_fetched = fetched_lines(cold);
  ASSERT_EQ(cold_fetched.size(), 2u) << cold;
  EXPECT_EQ(cold_fetched[0] + cold_fetched[1], expected) << cold;

  std::vector<std::string> killing = workers;
  killing.insert(killing.end(), {"--kill-local-worker-every", "8", "--kill-rounds", "1"});
  const std::string warm = generate(killing);
  EXPECT_THAT(without_log_lines(warm), HasSubstr(text));
  EXPECT_THAT(warm, HasSubstr("recovered from a lost worker 1 time"));
  EXPECT_EQ(fetched_lines(warm), (std::vector<int64_t>{0, 0, 0})) << warm;
}

}  // namespace
}  // namespace folio::dist
