// KV-parallel groups (issue 15, slice 6; dist.md "KV-parallel groups"): a sequence longer than
// one member's KV capacity, spread over two members by token range (kv::KvParallelCache, one
// block manager per member), each member an executor on its own thread running the same steps
// over its own cache, partial attention merged by log-sum-exp through the in-process group
// (testing/kv_parallel_group.h). Every step's logits must agree with one process whose cache
// holds the whole sequence within 1e-4 of the row's largest magnitude (only the attention's
// summation order differs), the greedy tokens must be equal, and the members' logits must be
// bit-identical (they merge the same gathered bytes in the same order). Eager and
// captured/replayed graphs; f32 and f16 caches; two and three members.
#include <algorithm>
#include <cmath>
#include <map>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "testing/kv_parallel_group.h"

namespace folio::dist {
namespace {

using folio::testing::KvParallelGroup;
using folio::testing::KvParallelGroupOptions;
using folio::testing::KvpStepArrays;
using folio::testing::ScriptSequence;

int32_t argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

struct KvParallelCase {
  const char* name;
  DType kv_dtype;
  exec::ExecutionMode mode;
  int32_t num_members;
};

// gtest prints the case by its name (its bytes otherwise).
void PrintTo(const KvParallelCase& test, std::ostream* out) {
  *out << test.name;
}

struct ScriptStats {
  double worst_relative = 0.0;  // of a logits row, relative to its largest magnitude
  int32_t decode_rows = 0;
};

// Runs `sequences` step by step (chunks of at most 20 tokens, greedy decodes) through the whole
// process and the group until each reaches its stop length; every step's logits rows must agree
// (within 1e-4 relative, the same argmax) and the members' logits must be bit-identical.
void run_script(KvParallelGroup& group, std::vector<ScriptSequence>& sequences,
                const std::map<kv::SeqId, int32_t>& stop_length, ScriptStats& stats) {
  const int32_t num_members = group.options().num_members;
  for (int step = 0; step < 100; ++step) {
    const std::vector<kv::StepSegment> segments = KvParallelGroup::plan_step(sequences, 20);
    if (segments.empty()) return;  // every sequence reached its stop length
    Result<KvpStepArrays> reference = group.arrays(sequences, segments, -1);
    ASSERT_TRUE(reference.ok()) << reference.status();
    Result<ir::StepOutput> expected = group.whole().executor().execute(reference->batch());
    ASSERT_TRUE(expected.ok()) << expected.status();
    std::vector<KvpStepArrays> member_arrays;
    for (int32_t g = 0; g < num_members; ++g) {
      Result<KvpStepArrays> arrays = group.arrays(sequences, segments, g);
      ASSERT_TRUE(arrays.ok()) << arrays.status();
      member_arrays.push_back(std::move(arrays).value());
    }
    std::vector<std::vector<float>> member_logits;
    Result<std::vector<float>> actual = group.run_members(member_arrays, &member_logits);
    ASSERT_TRUE(actual.ok()) << "step " << step << ": " << actual.status();
    ASSERT_EQ(actual->size(), expected->logits.size());
    for (int32_t g = 1; g < num_members; ++g) {
      EXPECT_TRUE(member_logits[static_cast<size_t>(g)] == *actual)
          << "member " << g << "'s logits differ from member 0's at step " << step;
    }

    const int64_t vocab = expected->vocab_size;
    std::vector<int32_t> next_tokens;
    for (int32_t row = 0; row < expected->num_rows; ++row) {
      const std::span<const float> want = expected->logits.subspan(row * vocab, vocab);
      const std::span<const float> got =
          std::span<const float>(*actual).subspan(row * vocab, vocab);
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
    // A sequence stops growing at its stop length (its last token is never run).
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
  FAIL() << "the script did not finish in 100 steps";
}

class KvParallelTest : public ::testing::TestWithParam<KvParallelCase> {};

TEST_P(KvParallelTest, LongSequenceOverMembersEqualsOneProcess) {
  const KvParallelCase& test = GetParam();
  KvParallelGroupOptions options;
  options.shape.num_layers = 2;
  options.kv_dtype = test.kv_dtype;
  options.mode = test.mode;
  options.num_members = test.num_members;
  // Each member holds 32 tokens of a sequence, in 8 blocks of its own (a page of 12 blocks less
  // the 4 padding blocks): the long sequence's 32 x members tokens fit no single member.
  Result<std::unique_ptr<KvParallelGroup>> created = KvParallelGroup::create(options);
  ASSERT_TRUE(created.ok()) << created.status();
  KvParallelGroup& group = **created;
  const int32_t context = group.context();

  // A prompt longer than one member's range (crossing into the last member with the decodes),
  // and a short one that stays in member 0 and stops at 20 tokens.
  std::vector<ScriptSequence> sequences(2);
  sequences[0].id = kv::SeqId(1);
  sequences[1].id = kv::SeqId(2);
  const int32_t prompt = context - 19;
  for (int32_t i = 0; i < prompt; ++i) sequences[0].tokens.push_back((i * 37 + 11) % 500);
  for (int32_t i = 0; i < 9; ++i) sequences[1].tokens.push_back((i * 53 + 7) % 500);
  // No member can take the long sequence alone.
  const Result<kv::AllocateOutcome> alone =
      group.member(0).manager().allocate(kv::SeqId(99), sequences[0].tokens);
  EXPECT_TRUE(!alone.ok() || alone->admission != kv::Admission::kAdmitted);
  for (const ScriptSequence& sequence : sequences) {
    const Result<int32_t> cached = group.allocate(sequence);
    ASSERT_TRUE(cached.ok()) << cached.status();
    EXPECT_EQ(*cached, 0);
  }
  EXPECT_EQ(*group.cache().num_groups_spanned(kv::SeqId(1)),
            (prompt + options.tokens_per_member - 1) / options.tokens_per_member);

  ScriptStats stats;
  run_script(group, sequences, {{kv::SeqId(1), context}, {kv::SeqId(2), 20}}, stats);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(static_cast<int32_t>(sequences[0].tokens.size()), context);
  EXPECT_EQ(sequences[1].tokens.size(), 20u);
  EXPECT_GT(stats.decode_rows, 15);

  // A new request whose 50-token prompt is the long sequence's start: the prefix cache serves
  // its 6 full blocks across the members (chained keys: member 1's first block after member
  // 0's last), as one process serves them; then it decodes to the context limit reading them.
  std::vector<ScriptSequence> again(1);
  again[0].id = kv::SeqId(3);
  again[0].tokens.assign(sequences[0].tokens.begin(), sequences[0].tokens.begin() + 50);
  Result<int32_t> cached = group.allocate(again[0]);
  ASSERT_TRUE(cached.ok()) << cached.status();
  EXPECT_EQ(*cached, 48);
  again[0].num_computed = *cached;
  run_script(group, again, {{kv::SeqId(3), context}}, stats);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(static_cast<int32_t>(again[0].tokens.size()), context);
  // Where the long sequence generated from position 50 on (a prompt of at most 50 tokens), the
  // same greedy continuation from the same 50 tokens.
  if (prompt <= 50) {
    EXPECT_EQ(again[0].tokens, sequences[0].tokens);
  }
  RecordProperty("worst_relative_logit_difference", std::to_string(stats.worst_relative));
}

// Step collectives whose exchanges fail, as a member whose peer is gone sees them.
class FailingStepCollectives final : public exec::StepCollectives {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  Status all_reduce_sum(std::span<float> /*values*/) override { return failure(); }
  Status all_gather(std::span<const float> /*input*/, std::span<float> /*output*/) override {
    ++calls_;
    return failure();
  }
  int calls() const { return calls_; }

 private:
  static Status failure() { return unavailable("rank 0: all_gather: peer 1 is gone"); }
  int calls_ = 0;
};

// A failed exchange fails the step (Executor::execute returns it, naming the merge), eagerly and
// from a replayed program; an executor whose graphs merge refuses to exist without collectives.
TEST(KvParallelFailureTest, FailedExchangeFailsTheStep) {
  for (const exec::ExecutionMode mode :
       {exec::ExecutionMode::kEager, exec::ExecutionMode::kGraph}) {
    KvParallelGroupOptions options;
    options.mode = mode;
    Result<std::unique_ptr<KvParallelGroup>> created = KvParallelGroup::create(options);
    ASSERT_TRUE(created.ok()) << created.status();
    KvParallelGroup& group = **created;
    FailingStepCollectives failing;
    folio::testing::KvpWorker member(options);
    Status status = member.init(options, group.model(), group.vm(), group.page_pool(),
                                options.tokens_per_member, 1, 0, options.tokens_per_member,
                                &failing, "failing");
    ASSERT_TRUE(status.ok()) << status;
    folio::testing::KvpWorker without(options);
    status = without.init(options, group.model(), group.vm(), group.page_pool(),
                          options.tokens_per_member, 1, 0, options.tokens_per_member, nullptr,
                          "without");
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("ExecutorOptions::collectives"), std::string_view::npos)
        << status;

    std::vector<int32_t> tokens(10);
    for (int32_t i = 0; i < 10; ++i) tokens[static_cast<size_t>(i)] = i + 3;
    ASSERT_TRUE(member.manager().allocate(kv::SeqId(1), tokens).ok());
    KvpStepArrays arrays;
    arrays.token_ids = tokens;
    for (int32_t i = 0; i < 10; ++i) arrays.positions.push_back(i);
    arrays.slot_mapping.resize(10);
    const std::vector<kv::StepSegment> segments = {{kv::SeqId(1), 0, 10}};
    ASSERT_TRUE(member.manager().fill_slot_mapping(segments, arrays.slot_mapping).ok());
    arrays.query_start = {0, 10};
    arrays.seq_lens = {10};
    arrays.logit_indices = {9};
    arrays.max_blocks_per_sequence = member.max_blocks_per_sequence();
    arrays.block_tables.resize(static_cast<size_t>(arrays.max_blocks_per_sequence));
    const std::vector<kv::SeqId> seqs = {kv::SeqId(1)};
    ASSERT_TRUE(member.manager()
                    .fill_block_tables(seqs, arrays.max_blocks_per_sequence, arrays.block_tables)
                    .ok());
    for (int attempt = 0; attempt < 2; ++attempt) {  // the second replays the captured program
      Result<ir::StepOutput> output = member.executor().execute(arrays.batch());
      EXPECT_EQ(output.status().code(), StatusCode::kUnavailable) << output.status();
      EXPECT_NE(output.status().message().find("KV-parallel attention merge"),
                std::string_view::npos)
          << output.status();
    }
    // One exchange per step: after the first failure the step's later ones are skipped (the
    // group is broken anyway).
    EXPECT_EQ(failing.calls(), 2);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, KvParallelTest,
    ::testing::Values(KvParallelCase{"f32_eager_kvp2", DType::kF32, exec::ExecutionMode::kEager, 2},
                      KvParallelCase{"f32_graph_kvp2", DType::kF32, exec::ExecutionMode::kGraph, 2},
                      KvParallelCase{"f16_graph_kvp2", DType::kF16, exec::ExecutionMode::kGraph, 2},
                      KvParallelCase{"f32_graph_kvp3", DType::kF32, exec::ExecutionMode::kGraph,
                                     3}),
    [](const ::testing::TestParamInfo<KvParallelCase>& info) { return info.param.name; });

}  // namespace
}  // namespace folio::dist
