// KV-parallel members as real `folio worker` processes (FOLIO_BINARY_PATH; issue 15, slice 6):
// the script of kv_parallel_script.h through a KvParallelStepRunner over two worker processes
// against one process, eager and replayed, then a killed member fails the next step naming it;
// and the command line: `--kv-parallel` refusals, `folio plan --kv-parallel`, and `folio
// generate --local-workers 2 --kv-parallel 2` writing one process's text. Not under the
// ThreadSanitizer run, as the other process tests (kv_parallel_service_test.cc is).
#include <signal.h>
#include <sys/wait.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "folio/dist/kv_parallel_step_runner.h"
#include "folio/dist/worker_client.h"
#include "folio/dist/worker_service.h"
#include "kv_parallel_script.h"
#include "process_pipeline.h"
#include "testing/random_model_file.h"
#include "testing/worker_process.h"

namespace folio::dist {
namespace {

using folio::testing::KvParallelGroup;
using folio::testing::KvParallelGroupOptions;
using folio::testing::KvpStepArrays;
using folio::testing::ScriptSequence;
using folio::testing::WorkerProcess;
using testing::group_options;
using testing::GroupStep;
using ::testing::HasSubstr;
using testing::member_spec;
using testing::ProcessCase;
using testing::run_script;
using testing::ScriptStats;
using namespace std::chrono_literals;

class KvParallelProcessTest : public ::testing::TestWithParam<ProcessCase> {};

// Members as real `folio worker` processes; a killed member fails the next step naming it.
TEST_P(KvParallelProcessTest, TwoWorkerProcessesEqualOneProcess) {
  const KvParallelGroupOptions options = group_options(GetParam().mode);
  Result<std::unique_ptr<KvParallelGroup>> created = KvParallelGroup::create(options);
  ASSERT_TRUE(created.ok()) << created.status();
  KvParallelGroup& group = **created;
  const folio::testing::RandomModelFile model_file(options.shape, options.model_seed,
                                                   "kvp-model.gguf");
  testing::ConnectedWorkers workers =
      testing::start_connected_workers(2, model_file.path, 1, model_file.identity);
  ASSERT_EQ(workers.clients.size(), 2u);
  // The replayed case meets in a directory (the file store), the eager one in the store
  // worker 0 serves over gRPC: processes with no file system in common would.
  std::string store;
  if (GetParam().mode == exec::ExecutionMode::kGraph) {
    store = model_file.directory.path() + "/rendezvous";
    std::filesystem::create_directory(store);
  }
  Result<std::unique_ptr<KvParallelStepRunner>> runner = KvParallelStepRunner::create(
      std::move(workers.clients), member_spec(group, store, "kvp-processes"),
      model_file.identity.hash);
  ASSERT_TRUE(runner.ok()) << runner.status();
  ScriptStats stats;
  run_script(group, **runner, stats);
  if (HasFatalFailure()) return;
  EXPECT_GT((*runner)->traffic().gathered_bytes, 0);

  // A member that is gone fails the next step, naming it.
  workers.processes[1]->signal(SIGKILL);
  workers.processes[1]->wait();
  std::vector<ScriptSequence> sequences(1);
  sequences[0].id = kv::SeqId(8);
  sequences[0].tokens = {4, 5, 6};
  ASSERT_TRUE(group.cache().allocate(sequences[0].id, sequences[0].tokens).ok());
  const std::vector<kv::StepSegment> segments = KvParallelGroup::plan_step(sequences, 20);
  GroupStep step;
  for (int32_t g = 0; g < 2; ++g) {
    Result<KvpStepArrays> arrays = group.arrays(sequences, segments, g);
    ASSERT_TRUE(arrays.ok()) << arrays.status();
    step.members.push_back(std::move(arrays).value());
  }
  Result<ir::StepOutput> lost = (*runner)->run(step.batch());
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.status().code(), StatusCode::kUnavailable) << lost.status();
  EXPECT_THAT(std::string(lost.status().message()), HasSubstr("KV-parallel member 1 of 2"));
}

INSTANTIATE_TEST_SUITE_P(Modes, KvParallelProcessTest,
                         ::testing::Values(ProcessCase{"eager", exec::ExecutionMode::kEager},
                                           ProcessCase{"replayed", exec::ExecutionMode::kGraph}),
                         [](const auto& info) { return std::string(info.param.name); });

std::string demo_model(const char* name) {
  return std::string(FOLIO_SOURCE_DIR) + "/models/demo/" + name;
}

// A `folio generate` run on the demo model: its output and whether it exited 0.
std::pair<std::string, bool> generate(std::vector<std::string> extra) {
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
                                        "--block-size",
                                        "16",
                                        "--max-context",
                                        "32",
                                        "-q"};
  arguments.insert(arguments.end(), extra.begin(), extra.end());
  WorkerProcess process(arguments, "generate");
  EXPECT_TRUE(process.read_to_end(120s)) << process.output();
  const int status = process.wait();
  return {process.output(), WIFEXITED(status) && WEXITSTATUS(status) == 0};
}

// The command line refuses what a KV-parallel group cannot be, before starting any worker.
TEST(KvParallelCommandTest, RefusesGroupsItCannotBuild) {
  const auto refused = [](std::vector<std::string> extra, const std::string& expected) {
    const auto [output, ok] = generate(std::move(extra));
    EXPECT_FALSE(ok) << output;
    EXPECT_THAT(output, HasSubstr(expected));
    EXPECT_THAT(output, ::testing::Not(HasSubstr("started"))) << "workers started";
  };
  refused({"--kv-parallel", "2"}, "give --workers or --local-workers 2");
  refused({"--kv-parallel", "2", "--local-workers", "3"}, "needs one worker per member, got 3");
  refused({"--kv-parallel", "2", "--local-workers", "2", "--placement", "tp"},
          "KV-parallel groups and tensor splits do not combine yet");
  refused({"--kv-parallel", "2", "--local-workers", "2", "--kv-tokens-per-member", "20"},
          "--kv-tokens-per-member 20 is not a multiple of --block-size 16");
  refused({"--kv-tokens-per-member", "16"}, "--kv-tokens-per-member needs --kv-parallel");
}

// `folio plan --kv-parallel 2`: each member's range, weights and KV, and the bytes exchanged per
// token; a member over its worker's memory is refused naming the bytes.
TEST(KvParallelCommandTest, PlanPrintsTheMembers) {
  auto plan = [](std::vector<std::string> arguments, bool succeeds) {
    WorkerProcess process(arguments, "plan");
    EXPECT_TRUE(process.read_to_end(60s)) << process.output();
    const int status = process.wait();
    EXPECT_EQ(WIFEXITED(status) && WEXITSTATUS(status) == 0, succeeds) << process.output();
    return process.output();
  };
  const std::string two = plan({"-m", demo_model("kjv-q8_0.gguf"), "--workers", "2",
                                "--kv-parallel", "2", "--kv-tokens-per-member", "512"},
                               true);
  EXPECT_THAT(two, HasSubstr("KV-parallel group of 2 members: 512 positions of each sequence "
                             "per member (a context of 1024)"));
  EXPECT_THAT(two, HasSubstr("member 1 on worker1: positions [512, 1024)"));
  // 4 layers x 8 heads x (32 + 1) floats x 4 bytes from the other member.
  EXPECT_THAT(two, HasSubstr("each member receives 4224 bytes"));
  const std::string small = plan({"-m", demo_model("kjv-q8_0.gguf"), "--worker-memory",
                                  "1000000,1000000", "--kv-parallel", "2"},
                                 false);
  EXPECT_THAT(small, HasSubstr("member 0 needs"));
  const std::string ragged = plan({"-m", demo_model("kjv-q8_0.gguf"), "--workers", "2",
                                   "--kv-parallel", "2", "--kv-tokens-per-member", "20"},
                                  false);
  EXPECT_THAT(ragged, HasSubstr("not a multiple of --block-size 16"));
}

// `folio generate --local-workers 2 --kv-parallel 2`, 16 positions per member: the sequence
// (a 4-token prompt and 24 generated) crosses into member 1, and the text is one process's.
TEST(KvParallelCommandTest, GenerateOverTwoMembersWritesTheTextOfOneProcess) {
  const auto [split, split_ok] = generate({"--local-workers", "2", "--local-worker-threads", "1",
                                           "--kv-parallel", "2", "--kv-tokens-per-member", "16"});
  ASSERT_TRUE(split_ok) << split;
  const auto [alone, alone_ok] = generate({});
  ASSERT_TRUE(alone_ok) << alone;
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
  const std::string want = text_of(alone);
  const std::string got = text_of(split);
  const size_t summary = want.rfind("[");
  ASSERT_NE(summary, std::string::npos) << want;
  EXPECT_THAT(want, HasSubstr("24 generated"));
  EXPECT_EQ(got.substr(0, summary), want.substr(0, summary)) << got;
}

}  // namespace
}  // namespace folio::dist
