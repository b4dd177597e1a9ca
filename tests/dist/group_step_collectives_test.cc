// A step graph's all_reduce_sum op run by two executors over a dist group (the executor's
// StepCollectives over dist::Collectives): the sum of the members' values, eager and replayed,
// against a float64 reference; a lost member fails the step instead of hanging or corrupting it;
// a graph with a collective op and no group is refused.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include "exec_test_util.h"
#include "folio/base/thread_pool.h"
#include "folio/dist/group_step_collectives.h"
#include "folio/dist/in_process_collectives.h"
#include "folio/ir/builder.h"
#include "folio/ir/step_graph.h"
#include "testing/collective_groups.h"

namespace folio::dist {
namespace {

using exec::testing::RandomWeights;
using exec::testing::StepGenerator;
using exec::testing::TestModelConfig;

constexpr int64_t kVocab = 96;
constexpr int64_t kHidden = 64;

// logits = head * all_reduce_sum(table[token]): each member embeds with its own table, so the
// logits depend on every member's table and only the sum makes them right. The block tables
// are read by no op; they size the steps the executor accepts.
ir::GraphFactory all_reduce_factory(int32_t max_blocks_per_sequence) {
  return [max_blocks_per_sequence](const ir::StepShape& shape) -> Result<ir::Graph> {
    ir::GraphBuilder builder(shape.ir_phase());
    FOLIO_RETURN_IF_ERROR(builder
                              .input(std::string(ir::kInputBlockTables), DType::kI32,
                                     ir::Shape{shape.num_sequence_slots, max_blocks_per_sequence})
                              .status());
    FOLIO_ASSIGN_OR_RETURN(
        const ir::TensorId token_ids,
        builder.input(std::string(ir::kInputTokenIds), DType::kI32, ir::Shape{shape.num_tokens}));
    FOLIO_ASSIGN_OR_RETURN(const ir::TensorId logit_indices,
                           builder.input(std::string(ir::kInputLogitIndices), DType::kI32,
                                         ir::Shape{shape.num_logit_rows}));
    FOLIO_ASSIGN_OR_RETURN(const ir::TensorId table,
                           builder.weight("table", DType::kF32, ir::Shape{kVocab, kHidden}));
    FOLIO_ASSIGN_OR_RETURN(const ir::TensorId head,
                           builder.weight("head", DType::kF32, ir::Shape{kVocab, kHidden}));
    FOLIO_ASSIGN_OR_RETURN(const ir::TensorId embedded,
                           builder.embedding(token_ids, table, "embedded"));
    FOLIO_ASSIGN_OR_RETURN(const ir::TensorId summed, builder.all_reduce_sum(embedded, "summed"));
    FOLIO_ASSIGN_OR_RETURN(const ir::TensorId rows,
                           builder.gather_rows(summed, logit_indices, "rows"));
    FOLIO_ASSIGN_OR_RETURN(const ir::TensorId logits,
                           builder.matmul(rows, head, std::string(ir::kOutputLogits)));
    FOLIO_RETURN_IF_ERROR(builder.mark_output(logits));
    return builder.finish();
  };
}

struct Member {
  std::unique_ptr<RandomWeights> weights;
  exec::testing::TestKvCache kv;
  exec::testing::TestArena arena;
  std::unique_ptr<ThreadPool> pool;
};

class GroupStepCollectivesTest : public ::testing::TestWithParam<exec::ExecutionMode> {
 protected:
  static constexpr int kMembers = 2;

  void SetUp() override {
    config_.model.vocab_size = kVocab;
    Result<ir::Graph> graph = all_reduce_factory(config_.max_blocks_per_sequence)(config_.step);
    ASSERT_TRUE(graph.ok()) << graph.status().to_string();
    for (int rank = 0; rank < kMembers; ++rank) {
      Member member;
      member.weights = RandomWeights::for_graph(*graph, 100 + static_cast<uint64_t>(rank));
      member.kv = exec::testing::TestKvCache::create(config_);
      member.arena = exec::testing::TestArena::create();
      member.pool = std::make_unique<ThreadPool>(2);
      members_.push_back(std::move(member));
    }
  }

  Result<std::unique_ptr<exec::Executor>> make_executor(int rank, exec::StepCollectives* group) {
    Member& member = members_[static_cast<size_t>(rank)];
    const exec::ExecutorResources resources{*member.pool, *member.arena.arena,
                                            exec::testing::shared_step_pool(), *member.weights,
                                            member.kv.binding};
    exec::ExecutorOptions options = exec::testing::test_options(4, GetParam());
    options.name = fmt::format("member{}", rank);
    options.collectives = group;
    return exec::Executor::create(all_reduce_factory(config_.max_blocks_per_sequence), resources,
                                  std::move(options));
  }

  // Member `rank`'s logits row for `token` in float64: its head times the sum of the tables.
  std::vector<double> expected_row(int rank, int32_t token) const {
    const std::vector<float> head = members_[static_cast<size_t>(rank)].weights->values("head");
    std::vector<double> summed(kHidden, 0.0);
    for (const Member& member : members_) {
      const std::vector<float> table = member.weights->values("table");
      for (int64_t c = 0; c < kHidden; ++c) summed[c] += table[token * kHidden + c];
    }
    std::vector<double> row(kVocab, 0.0);
    for (int64_t v = 0; v < kVocab; ++v) {
      for (int64_t c = 0; c < kHidden; ++c) row[v] += head[v * kHidden + c] * summed[c];
    }
    return row;
  }

  TestModelConfig config_;
  std::vector<Member> members_;
};

TEST_P(GroupStepCollectivesTest, EveryMemberComputesWithTheSumOverTheGroup) {
  Result<testing::Members> group = make_in_process_group(kMembers, std::chrono::seconds(20));
  ASSERT_TRUE(group.ok()) << group.status().to_string();
  // Both members run the same steps (same generator seed), as tensor-parallel ranks do.
  testing::run_on_ranks(kMembers, [&](int rank) {
    GroupStepCollectives collectives(*(*group)[static_cast<size_t>(rank)]);
    Result<std::unique_ptr<exec::Executor>> executor = make_executor(rank, &collectives);
    ASSERT_TRUE(executor.ok()) << executor.status().to_string();
    StepGenerator generator(exec::testing::GeneratorConfig::for_model(config_, /*max_sequences=*/4),
                            7);
    for (int step_index = 0; step_index < 6; ++step_index) {
      const std::vector<int32_t> prefill =
          step_index < 2 ? std::vector<int32_t>{5, 3} : std::vector<int32_t>{};
      const exec::testing::OwnedStep step = generator.step(step_index < 2 ? 0 : 2, prefill);
      Result<ir::StepOutput> output = (*executor)->execute(step.view());
      ASSERT_TRUE(output.ok()) << output.status().to_string();
      ASSERT_EQ(output->num_rows, static_cast<int32_t>(step.logit_indices.size()));
      for (int32_t row = 0; row < output->num_rows; ++row) {
        const int32_t token = step.token_ids[static_cast<size_t>(step.logit_indices[row])];
        const std::vector<double> expected = expected_row(rank, token);
        for (int64_t v = 0; v < kVocab; ++v) {
          const double got = output->logits[static_cast<size_t>(row * kVocab + v)];
          ASSERT_NEAR(got, expected[v], 1e-4 * (1.0 + std::abs(expected[v])))
              << "member " << rank << " step " << step_index << " row " << row << " column " << v;
        }
      }
    }
  });
}

TEST_P(GroupStepCollectivesTest, ALostMemberFailsTheStepWithItsError) {
  Result<testing::Members> group = make_in_process_group(kMembers, std::chrono::seconds(20));
  ASSERT_TRUE(group.ok()) << group.status().to_string();
  GroupStepCollectives collectives(*(*group)[0]);
  Result<std::unique_ptr<exec::Executor>> executor = make_executor(0, &collectives);
  ASSERT_TRUE(executor.ok()) << executor.status().to_string();
  (*group)[1].reset();  // member 1 is gone: the group breaks
  StepGenerator generator(exec::testing::GeneratorConfig::for_model(config_, 4), 7);
  const std::vector<int32_t> prefill{4};
  const exec::testing::OwnedStep step = generator.step(0, prefill);
  // The step fails with the group's error, naming the operation and the member that left, now
  // and at the next step (the group stays broken) rather than returning stale results.
  for (int attempt = 0; attempt < 2; ++attempt) {
    Result<ir::StepOutput> output = (*executor)->execute(step.view());
    ASSERT_FALSE(output.ok());
    EXPECT_EQ(output.status().code(), StatusCode::kFailedPrecondition)
        << output.status().to_string();
    EXPECT_NE(output.status().message().find("all_reduce_sum"), std::string::npos)
        << output.status().to_string();
    EXPECT_NE(output.status().message().find("rank 1 left the group"), std::string::npos)
        << output.status().to_string();
  }
}

TEST_P(GroupStepCollectivesTest, ACollectiveOpWithoutAGroupIsRefused) {
  Result<std::unique_ptr<exec::Executor>> executor = make_executor(0, nullptr);
  ASSERT_FALSE(executor.ok());
  EXPECT_EQ(executor.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(executor.status().message().find("ExecutorOptions::collectives"), std::string::npos)
      << executor.status().to_string();
}

INSTANTIATE_TEST_SUITE_P(Modes, GroupStepCollectivesTest,
                         ::testing::Values(exec::ExecutionMode::kEager,
                                           exec::ExecutionMode::kGraph),
                         [](const auto& info) {
                           return info.param == exec::ExecutionMode::kEager ? "Eager" : "Graph";
                         });

}  // namespace
}  // namespace folio::dist
