#include "attention_test_util.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "folio/base/check.h"
#include "folio/device/host_stream.h"
#include "folio/tensor/half.h"

namespace folio::kernels::testing {

AttentionHarness::AttentionHarness(const AttentionShape& shape, int32_t max_sequences,
                                   int32_t max_blocks_per_sequence, int32_t num_tokens,
                                   int workspace_threads)
    : shape_(shape),
      max_sequences_(max_sequences),
      max_blocks_per_sequence_(max_blocks_per_sequence),
      num_tokens_(num_tokens),
      workspace_threads_(workspace_threads),
      // Block 0 stays unused (the engine's dummy block); every sequence can have a full table.
      cache_(/*num_layers=*/2, shape.block_size, shape.num_kv_heads, shape.head_dim, shape.dtype,
             int64_t{max_sequences} * max_blocks_per_sequence + 1, /*blocks_per_page=*/3),
      num_sequences_(1, 0),
      query_start_(max_sequences + 1, 0),
      seq_lens_(max_sequences, 0),
      block_tables_(int64_t{max_sequences} * max_blocks_per_sequence, -1),
      positions_(num_tokens, 0),
      query_(num_tokens * query_row_stride(), 0.0f),
      workspace_(cpu::paged_attention_workspace_bytes(cache_.layout(), workspace_threads)) {}

int64_t AttentionHarness::query_row_stride() const {
  return int64_t{shape_.num_heads} * shape_.head_dim + shape_.extra_query_columns;
}

void AttentionHarness::load_step(std::mt19937& rng, const std::vector<SequenceSpec>& sequences) {
  const int32_t block_size = shape_.block_size;
  const int64_t row = int64_t{shape_.num_kv_heads} * shape_.head_dim;
  sequences_ = sequences;
  dense_keys_.assign(sequences.size(), {});
  dense_values_.assign(sequences.size(), {});

  std::vector<int32_t> free_blocks(cache_.num_blocks() - 1);
  std::iota(free_blocks.begin(), free_blocks.end(), 1);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  size_t next_free = 0;

  // Stale values beyond the live sequences: a kernel that reads them fails loudly.
  std::fill(query_start_.begin(), query_start_.end(), -7);
  std::fill(seq_lens_.begin(), seq_lens_.end(), 1 << 30);
  std::fill(block_tables_.begin(), block_tables_.end(), -1);
  std::fill(positions_.begin(), positions_.end(), 0);
  // Copied in, not assigned: the buffer's address must stay the one a captured launch holds.
  const std::vector<float> query = random_floats(rng, query_.size(), -2.0f, 2.0f);
  std::copy(query.begin(), query.end(), query_.begin());

  FOLIO_CHECK(static_cast<int32_t>(sequences.size()) <= max_sequences_, "too many sequences");
  num_sequences_[0] = static_cast<int32_t>(sequences.size());
  int32_t token = 0;
  query_start_[0] = 0;
  for (size_t s = 0; s < sequences.size(); ++s) {
    const SequenceSpec spec = sequences[s];
    const int32_t num_blocks = (spec.context_length + block_size - 1) / block_size;
    FOLIO_CHECK(num_blocks <= max_blocks_per_sequence_ && spec.query_length <= spec.context_length,
                "bad sequence spec");
    int32_t* table = block_tables_.data() + s * max_blocks_per_sequence_;
    for (int32_t b = 0; b < num_blocks; ++b) table[b] = free_blocks[next_free++];

    dense_keys_[s] = random_floats(rng, spec.context_length * row);
    dense_values_[s] = random_floats(rng, spec.context_length * row);
    for (int32_t position = 0; position < spec.context_length; ++position) {
      const int64_t slot =
          int64_t{table[position / block_size]} * block_size + position % block_size;
      float* key = dense_keys_[s].data() + position * row;
      float* value = dense_values_[s].data() + position * row;
      cache_.store_row(kLayer, 0, slot, key);
      cache_.store_row(kLayer, 1, slot, value);
      if (shape_.dtype == DType::kF16) {  // the reference sees what the cache holds
        for (int64_t i = 0; i < row; ++i) {
          key[i] = f16_to_f32(f32_to_f16(key[i]));
          value[i] = f16_to_f32(f32_to_f16(value[i]));
        }
      }
    }
    seq_lens_[s] = spec.context_length;
    for (int32_t i = 0; i < spec.query_length; ++i) {
      positions_[token++] = spec.context_length - spec.query_length + i;
    }
    query_start_[s + 1] = token;
  }
  FOLIO_CHECK(token <= num_tokens_, "step has {} tokens, harness {}", token, num_tokens_);
}

cpu::PagedAttentionArguments AttentionHarness::arguments(float* output) {
  return cpu::PagedAttentionArguments{
      .query = query_.data(),
      .output = output,
      .query_row_stride = query_row_stride(),
      .cache = cache_.layout(),
      .layer = kLayer,
      .num_tokens = num_tokens_,
      .num_heads = shape_.num_heads,
      .max_sequences = max_sequences_,
      .max_blocks_per_sequence = max_blocks_per_sequence_,
      .sliding_window = shape_.sliding_window,
      .scale = shape_.scale,
      .logit_soft_cap = shape_.logit_soft_cap,
      .num_sequences = num_sequences_.data(),
      .query_start = query_start_.data(),
      .seq_lens = seq_lens_.data(),
      .block_tables = block_tables_.data(),
      .positions = positions_.data(),
      .workspace = workspace_.data(),
      .workspace_threads = workspace_threads_,
      .kv_range_begin = 0,
      .kv_range_end = 0,
      .lse = nullptr,
  };
}

cpu::PagedAttentionArguments AttentionHarness::member_arguments(float* output, float* lse,
                                                                int64_t begin, int64_t end) {
  FOLIO_CHECK(begin % shape_.block_size == 0, "range begins at {}", begin);
  const int64_t shift = begin / shape_.block_size;
  member_block_tables_.assign(block_tables_.size(), -1);
  for (int64_t s = 0; s < max_sequences_; ++s) {
    const int32_t* row = block_tables_.data() + s * max_blocks_per_sequence_;
    int32_t* member_row = member_block_tables_.data() + s * max_blocks_per_sequence_;
    for (int64_t b = shift; b < max_blocks_per_sequence_; ++b) member_row[b - shift] = row[b];
  }
  cpu::PagedAttentionArguments result = arguments(output);
  result.block_tables = member_block_tables_.data();
  result.kv_range_begin = begin;
  result.kv_range_end = end;
  result.lse = lse;
  return result;
}

std::vector<float> AttentionHarness::make_output() const {
  return std::vector<float>(int64_t{num_tokens_} * shape_.num_heads * shape_.head_dim,
                            std::numeric_limits<float>::quiet_NaN());
}

std::vector<double> AttentionHarness::reference() const {
  const int32_t heads = shape_.num_heads;
  const int32_t head_dim = shape_.head_dim;
  const int32_t group = heads / shape_.num_kv_heads;
  const int64_t row = int64_t{shape_.num_kv_heads} * head_dim;
  const double scale = shape_.scale > 0 ? shape_.scale : 1.0 / std::sqrt(double{1.0 * head_dim});
  std::vector<double> expected(int64_t{num_tokens_} * heads * head_dim, 0.0);
  int64_t token = 0;
  for (size_t s = 0; s < sequences_.size(); ++s) {
    const SequenceSpec spec = sequences_[s];
    for (int32_t i = 0; i < spec.query_length; ++i, ++token) {
      const int64_t position = spec.context_length - spec.query_length + i;
      const int64_t first = shape_.sliding_window > 0
                                ? std::max<int64_t>(0, position + 1 - shape_.sliding_window)
                                : 0;
      for (int32_t h = 0; h < heads; ++h) {
        const float* q = query_.data() + token * query_row_stride() + int64_t{h} * head_dim;
        const int64_t kv_offset = int64_t{h / group} * head_dim;
        std::vector<double> scores;
        double best = -1e300;
        for (int64_t j = first; j <= position; ++j) {
          double dot = 0;
          for (int32_t d = 0; d < head_dim; ++d) {
            dot += double{q[d]} * dense_keys_[s][j * row + kv_offset + d];
          }
          double score = dot * scale;
          if (shape_.logit_soft_cap > 0) {
            score = shape_.logit_soft_cap * std::tanh(score / shape_.logit_soft_cap);
          }
          scores.push_back(score);
          best = std::max(best, scores.back());
        }
        double total = 0;
        for (double& score : scores) total += (score = std::exp(score - best));
        double* out = expected.data() + (token * heads + h) * head_dim;
        for (size_t k = 0; k < scores.size(); ++k) {
          const float* v = dense_values_[s].data() + (first + k) * row + kv_offset;
          for (int32_t d = 0; d < head_dim; ++d) out[d] += scores[k] / total * v[d];
        }
      }
    }
  }
  return expected;
}

std::vector<SequenceSpec> random_batch(std::mt19937& rng, int32_t max_context, int32_t max_tokens) {
  std::uniform_int_distribution<int32_t> context(1, max_context);
  std::vector<SequenceSpec> batch;
  int32_t tokens = 0;
  const auto add = [&](SequenceSpec spec) {
    if (tokens + spec.query_length > max_tokens) return;
    batch.push_back(spec);
    tokens += spec.query_length;
  };
  for (int i = 0; i < 4; ++i) add({context(rng), 1});  // decodes
  for (int i = 0; i < 2; ++i) {                        // chunked prefill: context > query
    const int32_t length = std::max(2, context(rng));
    add({length, std::uniform_int_distribution<int32_t>(1, std::min(length - 1, 12))(rng)});
  }
  const int32_t prompt = std::uniform_int_distribution<int32_t>(1, 20)(rng);
  add({prompt, prompt});  // a whole prefill
  std::shuffle(batch.begin(), batch.end(), rng);
  return batch;
}

std::vector<float> run_attention_eager(ThreadPool& pool, AttentionHarness& harness) {
  device::HostStream stream(pool);
  std::vector<float> output = harness.make_output();
  cpu::paged_attention(stream, harness.arguments(output.data()));
  return output;
}

void expect_matches_reference(const std::vector<float>& output, const AttentionHarness& harness,
                              const std::string& what) {
  expect_near_all(output, harness.reference(), kAttentionAbsoluteTolerance,
                  kAttentionRelativeTolerance, what);
}

}  // namespace folio::kernels::testing
