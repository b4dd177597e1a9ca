// A script of engine steps for pipeline tests (issue 15): two sequences in a KV cache of 6
// blocks of 16 tokens (sequence s owns blocks 2s and 2s + 1; blocks 4 and 5 are the padding
// blocks), run through prefills, mixed steps (a prefill chunk beside a decode) and decodes, 26
// tokens per sequence (crossing into the second block), asking for the logits of the last token
// of every segment: 16 rows in all. Every step reads what earlier steps wrote into the cache.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "folio/ir/step_batch.h"

namespace folio::testing {

struct PipelineStepScript {
  static constexpr int32_t kBlockSize = 16;
  static constexpr int32_t kMaxBlocksPerSequence = 2;
  static constexpr int64_t kNumBlocks = 6;
  static constexpr int64_t kFirstDummyBlock = 4;
  static constexpr int32_t kNumDummyBlocks = 2;
  static constexpr int32_t kMaxSequences = 2;
  static constexpr int32_t kTotalLogitRows = 16;

  // (sequence, tokens) per segment of each step.
  static const std::vector<std::vector<std::pair<int32_t, int32_t>>>& steps() {
    static const std::vector<std::vector<std::pair<int32_t, int32_t>>> script = {
        {{0, 7}, {1, 3}}, {{0, 1}, {1, 1}}, {{0, 9}, {1, 1}}, {{0, 1}, {1, 12}}, {{0, 1}, {1, 1}},
        {{0, 1}, {1, 1}}, {{0, 5}, {1, 6}}, {{1, 1}},         {{0, 1}},
    };
    return script;
  }
};

// The arrays of one step of the script.
struct PipelineStepArrays {
  std::vector<int32_t> token_ids, positions, slots, query_start{0}, seq_lens, block_tables,
      logit_indices;

  // Appends `count` tokens of sequence `sequence` after its `cached` earlier ones, asking for
  // the logits of the last; token ids are a function of `first_token` below `vocab`.
  void add_segment(int32_t sequence, int32_t cached, int32_t count, int32_t first_token,
                   int32_t vocab) {
    constexpr int32_t kBlock = PipelineStepScript::kBlockSize;
    for (int32_t i = 0; i < count; ++i) {
      const int32_t position = cached + i;
      token_ids.push_back((first_token + 37 * i) % vocab);
      positions.push_back(position);
      slots.push_back((2 * sequence + position / kBlock) * kBlock + position % kBlock);
    }
    query_start.push_back(query_start.back() + count);
    seq_lens.push_back(cached + count);
    block_tables.push_back(2 * sequence);
    block_tables.push_back(2 * sequence + 1);
    logit_indices.push_back(query_start.back() - 1);
  }

  ir::StepBatch batch() const {
    return ir::StepBatch{token_ids,
                         positions,
                         slots,
                         query_start,
                         seq_lens,
                         block_tables,
                         logit_indices,
                         {},
                         PipelineStepScript::kMaxBlocksPerSequence,
                         {}};
  }
};

// Builds the script's steps one at a time, keeping each sequence's length.
class PipelineStepMaker {
 public:
  explicit PipelineStepMaker(int32_t vocab) : vocab_(vocab) {}

  // The arrays of step `index` of the script (steps must be made in order).
  PipelineStepArrays make(size_t index) {
    PipelineStepArrays arrays;
    for (const auto& [sequence, count] : PipelineStepScript::steps()[index]) {
      arrays.add_segment(sequence, cached_[sequence], count,
                         static_cast<int32_t>(index * 11 + static_cast<size_t>(sequence) * 5 + 1),
                         vocab_);
      cached_[sequence] += count;
    }
    return arrays;
  }

 private:
  int32_t vocab_;
  int32_t cached_[2] = {0, 0};
};

}  // namespace folio::testing
