// The KV-parallel script both KV-parallel worker tests run (kv_parallel_service_test.cc over
// WorkerServices of the test process, kv_parallel_process_test.cc over `folio worker`
// processes): steps from a kv::KvParallelCache (testing/kv_parallel_group.h: a 64-token sequence
// over two members of 32 positions, prefill chunks of 20 crossing their boundary, then greedy
// decodes to the context limit, beside a short sequence member 0 holds) through a
// KvParallelStepRunner, checked against one process whose cache holds every position.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "folio/dist/kv_parallel_step_runner.h"
#include "testing/kv_parallel_group.h"

namespace folio::dist::testing {

using namespace std::chrono_literals;
using folio::testing::KvParallelGroup;
using folio::testing::KvParallelGroupOptions;
using folio::testing::KvpStepArrays;
using folio::testing::ScriptSequence;
using ::testing::HasSubstr;

inline int32_t argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

inline KvParallelGroupOptions group_options(exec::ExecutionMode mode) {
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
inline PipelineStageSpec member_spec(KvParallelGroup& group, const std::string& store,
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
inline void run_script(KvParallelGroup& group, KvParallelStepRunner& runner, ScriptStats& stats) {
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
inline void expect_member_count_refused(KvParallelStepRunner& runner, KvParallelGroup& group) {
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

inline void PrintTo(const ProcessCase& test, std::ostream* out) {
  *out << test.name;
}

}  // namespace folio::dist::testing
