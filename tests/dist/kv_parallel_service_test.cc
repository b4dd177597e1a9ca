// KV-parallel members on workers (issue 15, slice 6; dist.md "KV-parallel groups"), in one
// process: a KvParallelStepRunner drives two WorkerServices of the test process on loopback
// ports, each a member holding 32 positions of every sequence in a KV cache of its own (the
// 64-token sequence fits neither), forming a gloo group (meeting in the rendezvous store member 0's
// service holds over gRPC), stepped over gRPC with each member's slots and block tables
// (kv_parallel_script.h); every logits row within 1e-4 of one process's largest magnitude, the same
// greedy tokens, eager and replayed. Cheap, and run under the sanitizers (label concurrency);
// kv_parallel_process_test.cc runs the same script over `folio worker` processes. Bad input: a step
// for another member count, a range not of whole blocks, copy-on-write copies, a member without its
// group.
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
#include "testing/random_model_file.h"

namespace folio::dist {
namespace {

using folio::testing::KvParallelGroup;
using folio::testing::KvParallelGroupOptions;
using testing::expect_member_count_refused;
using testing::group_options;
using ::testing::HasSubstr;
using testing::member_spec;
using testing::ProcessCase;
using testing::run_script;
using testing::ScriptStats;

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

}  // namespace
}  // namespace folio::dist
