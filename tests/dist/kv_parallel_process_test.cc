// KV-parallel members on workers (issue 15, slice 6; dist.md "KV-parallel groups"): a
// KvParallelStepRunner drives two members, each a worker holding 32 positions of every sequence
// in a KV cache of its own (the 64-token sequence fits neither), forming a gloo group over
// loopback (meeting in the rendezvous store member 0's worker serves over gRPC; the replayed
// processes in a directory), stepped over gRPC with each member's slots and block tables. The steps
// come from a kv::KvParallelCache (testing/kv_parallel_group.h: prefill chunks of 20 crossing the
// members' boundary, then greedy decodes to the context limit, beside a short sequence member 0
// holds); the reference is one process whose cache holds every position (the group's "whole"):
// every logits row within 1e-4 of the row's largest magnitude, the same greedy tokens. Eager and
// replayed. WorkerServices in this process (cheap, under the sanitizers) and real `folio worker`
// processes (FOLIO_BINARY_PATH), where a killed member fails the next step naming it. Bad
// input: a step for another member count, a range not of whole blocks, copy-on-write copies.
#include <signal.h>
#include <sys/wait.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "folio/dist/kv_parallel_step_runner.h"
#include "folio/dist/worker_client.h"
#include "folio/dist/worker_service.h"
#include "testing/kv_parallel_group.h"
#include "testing/random_model_file.h"

#include "process_pipeline.h"
#include "testing/worker_process.h"

namespace folio::dist {
namespace {

using namespace std::chrono_literals;
using folio::testing::KvParallelGroup;
using folio::testing::KvParallelGroupOptions;
using folio::testing::KvpStepArrays;
using folio::testing::ScriptSequence;
using folio::testing::WorkerProcess;
using ::testing::HasSubstr;

int32_t argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

KvParallelGroupOptions group_options(exec::ExecutionMode mode) {
  KvParallelGroupOptions options;
  options.shape.num_layers = 2;
  options.kv_dtype = DType::kF32;
  options.mode = mode;
  options.num_members = 2;
  return options;
}

// A member's stage: the group's member caches (the same block ids, padding blocks and block
// table width), every layer, 32 positions per member.
// `store`: the rendezvous directory, empty for the gRPC store of member 0's worker.
PipelineStageSpec member_spec(KvParallelGroup& group, const std::string& store,
                              const std::string& group_id) {
  const KvParallelGroupOptions& options = group.options();
  PipelineStageSpec spec;
  spec.first_layer = 0;
  spec.end_layer = options.shape.num_layers;
  spec.num_kv_blocks = int64_t{options.blocks_per_page} * options.member_pages;
  spec.block_size = options.block_size;
  spec.max_blocks_per_sequence = group.member(0).max_blocks_per_sequence();
  spec.kv_dtype = options.kv_dtype;
  spec.first_dummy_block = group.member(0).manager().dummy_block().value();
  spec.num_dummy_blocks = options.num_dummy_blocks;
  spec.bucket_ladder = options.bucket_ladder;
  spec.max_sequences = options.max_sequences;
  spec.max_logit_rows = options.max_sequences;
  spec.use_graphs = options.mode == exec::ExecutionMode::kGraph;
  spec.pool_bytes = int64_t{32} << 20;
  spec.collective_store = store;
  spec.collective_group_id = group_id;
  spec.collective_timeout = 20s;
  spec.kv_tokens_per_member = options.tokens_per_member;
  return spec;
}

// The step as the engine hands it to the runner: member 0's arrays, and every member's slots and
// block tables in kv_members.
struct GroupStep {
  std::vector<KvpStepArrays> members;
  std::vector<ir::KvMemberArrays> views;
  ir::StepBatch batch() {
    views.clear();
    for (const KvpStepArrays& member : members) {
      views.push_back({.slot_mapping = member.slot_mapping, .block_tables = member.block_tables});
    }
    ir::StepBatch step = members.front().batch();
    step.kv_members = views;
    return step;
  }
};

struct ScriptStats {
  double worst_relative = 0.0;
  int32_t decode_rows = 0;
  int64_t steps = 0;
};

// The script of kv_parallel_test.cc through `runner` and the whole process: the long sequence
// (a 45-token prompt) to the context limit, the short one (9 tokens) to 20.
void run_script(KvParallelGroup& group, KvParallelStepRunner& runner, ScriptStats& stats) {
  const int32_t context = group.context();
  std::vector<ScriptSequence> sequences(2);
  sequences[0].id = kv::SeqId(1);
  sequences[1].id = kv::SeqId(2);
  for (int32_t i = 0; i < context - 19; ++i) sequences[0].tokens.push_back((i * 37 + 11) % 500);
  for (int32_t i = 0; i < 9; ++i) sequences[1].tokens.push_back((i * 53 + 7) % 500);
  // No member can take the long sequence alone.
  const Result<kv::AllocateOutcome> alone =
      group.member(0).manager().allocate(kv::SeqId(99), sequences[0].tokens);
  EXPECT_TRUE(!alone.ok() || alone->admission != kv::Admission::kAdmitted);
  for (const ScriptSequence& sequence : sequences) {
    const Result<int32_t> cached = group.allocate(sequence);
    ASSERT_TRUE(cached.ok()) << cached.status();
  }
  const std::map<kv::SeqId, int32_t> stop_length = {{kv::SeqId(1), context}, {kv::SeqId(2), 20}};
  for (int step = 0; step < 100; ++step) {
    const std::vector<kv::StepSegment> segments = KvParallelGroup::plan_step(sequences, 20);
    if (segments.empty()) break;
    Result<KvpStepArrays> reference = group.arrays(sequences, segments, -1);
    ASSERT_TRUE(reference.ok()) << reference.status();
    Result<ir::StepOutput> expected = group.whole().executor().execute(reference->batch());
    ASSERT_TRUE(expected.ok()) << expected.status();
    const std::vector<float> want_logits(expected->logits.begin(), expected->logits.end());
    GroupStep group_step;
    for (int32_t g = 0; g < group.options().num_members; ++g) {
      Result<KvpStepArrays> arrays = group.arrays(sequences, segments, g);
      ASSERT_TRUE(arrays.ok()) << arrays.status();
      group_step.members.push_back(std::move(arrays).value());
    }
    Result<ir::StepOutput> actual = runner.run(group_step.batch());
    ASSERT_TRUE(actual.ok()) << "step " << step << ": " << actual.status();
    ASSERT_EQ(actual->logits.size(), want_logits.size()) << "step " << step;
    ++stats.steps;
    const int64_t vocab = expected->vocab_size;
    std::vector<int32_t> next_tokens;
    for (int32_t row = 0; row < expected->num_rows; ++row) {
      const std::span<const float> want =
          std::span<const float>(want_logits)
              .subspan(static_cast<size_t>(row * vocab), static_cast<size_t>(vocab));
      const std::span<const float> got =
          actual->logits.subspan(static_cast<size_t>(row * vocab), static_cast<size_t>(vocab));
      float largest = 0.0f;
      for (const float value : want) largest = std::max(largest, std::abs(value));
      double worst = 0.0;
      for (int64_t i = 0; i < vocab; ++i) {
        worst = std::max(worst, double{std::abs(want[i] - got[i])} / largest);
      }
      stats.worst_relative = std::max(stats.worst_relative, worst);
      EXPECT_LE(worst, 1e-4) << "step " << step << " row " << row;
      EXPECT_EQ(argmax(got), argmax(want)) << "step " << step << " row " << row;
      next_tokens.push_back(argmax(want));
    }
    size_t row = 0;
    for (const kv::StepSegment& segment : segments) {
      const ScriptSequence& sequence =
          *std::find_if(sequences.begin(), sequences.end(),
                        [&](const ScriptSequence& s) { return s.id == segment.seq; });
      if (segment.first_position + segment.num_tokens <
          static_cast<int32_t>(sequence.tokens.size())) {
        continue;
      }
      if (segment.num_tokens == 1) ++stats.decode_rows;
      if (static_cast<int32_t>(sequence.tokens.size()) >= stop_length.at(segment.seq)) {
        next_tokens[row] = -1;
      }
      ++row;
    }
    const Status committed = group.commit(sequences, segments, next_tokens);
    ASSERT_TRUE(committed.ok()) << committed;
  }
  EXPECT_EQ(static_cast<int32_t>(sequences[0].tokens.size()), context);
  EXPECT_EQ(sequences[1].tokens.size(), 20u);
  EXPECT_GT(stats.decode_rows, 15);
}

// A step of one member's arrays only (no kv_members): refused before anything is sent.
void expect_member_count_refused(KvParallelStepRunner& runner, KvParallelGroup& group) {
  std::vector<ScriptSequence> sequences(1);
  sequences[0].id = kv::SeqId(7);
  sequences[0].tokens = {1, 2, 3};
  const std::vector<kv::StepSegment> segments = KvParallelGroup::plan_step(sequences, 20);
  ASSERT_TRUE(group.cache().allocate(sequences[0].id, sequences[0].tokens).ok());
  Result<KvpStepArrays> arrays = group.arrays(sequences, segments, 0);
  ASSERT_TRUE(arrays.ok()) << arrays.status();
  GroupStep one;
  one.members.push_back(std::move(arrays).value());
  Result<ir::StepOutput> refused = runner.run(one.batch());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("group of 2 members carries the slots and block tables of 1"));
  const std::vector<kv::BlockCopy> copies = {{1, 2}};
  const Status copied = runner.copy_blocks(copies);
  EXPECT_EQ(copied.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(copied.message()), HasSubstr("copy-on-write"));
}

struct ProcessCase {
  const char* name;
  exec::ExecutionMode mode;
};

void PrintTo(const ProcessCase& test, std::ostream* out) {
  *out << test.name;
}

class KvParallelServiceTest : public ::testing::TestWithParam<ProcessCase> {};

// Members as WorkerServices of this process on loopback ports (gloo members on threads).
TEST_P(KvParallelServiceTest, TwoMembersOverServicesEqualOneProcess) {
  const KvParallelGroupOptions options = group_options(GetParam().mode);
  Result<std::unique_ptr<KvParallelGroup>> created = KvParallelGroup::create(options);
  ASSERT_TRUE(created.ok()) << created.status();
  KvParallelGroup& group = **created;
  const folio::testing::RandomModelFile model_file(options.shape, options.model_seed,
                                                   "kvp-model.gguf");
  std::vector<std::unique_ptr<WorkerService>> services;
  std::vector<std::unique_ptr<WorkerClient>> clients;
  for (int g = 0; g < 2; ++g) {
    WorkerServiceOptions service_options;
    service_options.threads = 1;
    service_options.model = model_file.identity;
    service_options.model_path = model_file.path;
    Result<std::unique_ptr<WorkerService>> service = WorkerService::start(service_options);
    ASSERT_TRUE(service.ok()) << service.status();
    services.push_back(std::move(service).value());
    Result<std::unique_ptr<WorkerClient>> client =
        WorkerClient::connect(services.back()->address(), model_file.identity);
    ASSERT_TRUE(client.ok()) << client.status();
    clients.push_back(std::move(client).value());
  }
  // No rendezvous directory: the members meet in the store member 0's service holds.
  Result<std::unique_ptr<KvParallelStepRunner>> runner = KvParallelStepRunner::create(
      std::move(clients), member_spec(group, "", "kvp-services"), model_file.identity.hash);
  ASSERT_TRUE(runner.ok()) << runner.status();
  ASSERT_EQ((*runner)->members().size(), 2u);
  ScriptStats stats;
  run_script(group, **runner, stats);
  if (HasFatalFailure()) return;
  const KvParallelTraffic& traffic = (*runner)->traffic();
  EXPECT_EQ(traffic.steps, stats.steps);
  EXPECT_GT(traffic.communication_ns, 0);
  // Each layer's all_gather brings the other member's partial output and log-sum-exp of every
  // (padded) token: a multiple of layers x heads x (head_dim + 1) floats.
  const int64_t per_token =
      options.shape.num_layers * options.shape.num_heads * (options.shape.head_dim() + 1) * 4;
  EXPECT_GT(traffic.gathered_bytes, 0);
  EXPECT_EQ(traffic.gathered_bytes % per_token, 0);
  EXPECT_GE(traffic.gathered_bytes / per_token, traffic.tokens);
  expect_member_count_refused(**runner, group);
  RecordProperty("worst_relative_logit_difference", std::to_string(stats.worst_relative));
}

INSTANTIATE_TEST_SUITE_P(Modes, KvParallelServiceTest,
                         ::testing::Values(ProcessCase{"eager", exec::ExecutionMode::kEager},
                                           ProcessCase{"replayed", exec::ExecutionMode::kGraph}),
                         [](const auto& info) { return std::string(info.param.name); });

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

// Bad input, refused before a step: a range not of whole blocks, a single worker, a member
// count the workers' specs do not match.
TEST(KvParallelRunnerTest, RefusesMalformedGroups) {
  const KvParallelGroupOptions options = group_options(exec::ExecutionMode::kEager);
  Result<std::unique_ptr<KvParallelGroup>> created = KvParallelGroup::create(options);
  ASSERT_TRUE(created.ok()) << created.status();
  const folio::testing::RandomModelFile model_file(options.shape, options.model_seed,
                                                   "kvp-model.gguf");
  PipelineStageSpec spec = member_spec(**created, model_file.directory.path(), "kvp-bad");
  auto clients = [&](int count) {
    std::vector<std::unique_ptr<WorkerClient>> result;
    for (int i = 0; i < count; ++i) result.push_back(nullptr);
    return result;
  };
  spec.kv_tokens_per_member = 30;
  Result<std::unique_ptr<KvParallelStepRunner>> ragged =
      KvParallelStepRunner::create(clients(2), spec, model_file.identity.hash);
  ASSERT_FALSE(ragged.ok());
  EXPECT_THAT(std::string(ragged.status().message()),
              HasSubstr("30 tokens per member is not a positive multiple of the block size 8"));
  spec.kv_tokens_per_member = 32;
  Result<std::unique_ptr<KvParallelStepRunner>> alone =
      KvParallelStepRunner::create(clients(1), spec, model_file.identity.hash);
  ASSERT_FALSE(alone.ok());
  EXPECT_THAT(std::string(alone.status().message()), HasSubstr("at least two workers, got 1"));

  // A worker asked for a member its group does not have.
  Result<std::unique_ptr<model::LlamaModel>> model = model::LlamaModel::open(model_file.path);
  ASSERT_TRUE(model.ok()) << model.status();
  spec.kv_member = 1;
  spec.kv_members = 2;
  spec.kv_tokens_per_member = 12;
  Result<std::unique_ptr<PipelineStage>> stage = PipelineStage::create(**model, spec, 1);
  ASSERT_FALSE(stage.ok());
  EXPECT_THAT(std::string(stage.status().message()),
              HasSubstr("12 tokens per member is not a positive multiple of the block size 8"));
  spec.kv_tokens_per_member = 32;
  stage = PipelineStage::create(**model, spec, 1);
  ASSERT_FALSE(stage.ok());
  EXPECT_THAT(std::string(stage.status().message()),
              HasSubstr("KV-parallel member 1 of 2 needs its member of a group of 2, got none"));
  spec.end_layer = 1;
  stage = PipelineStage::create(**model, spec, 1);
  ASSERT_FALSE(stage.ok());
  EXPECT_THAT(std::string(stage.status().message()), HasSubstr("runs every layer"));
}

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
