// A paged-attention test step: a paged KV cache, the persistent metadata buffers the engine
// writes before each step (fixed addresses, sized for the largest step), the step's queries,
// and an independent double-precision reference that rebuilds each sequence's dense K and V.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "folio/base/thread_pool.h"
#include "folio/kernels/cpu/paged_attention.h"
#include "kernel_test_util.h"

namespace folio::kernels::testing {

// One sequence of a step: `context_length` tokens in the cache after this step, the last
// `query_length` of which are this step's query tokens (1 for decode, all for a whole prefill,
// fewer for a chunk of a longer prefill).
struct SequenceSpec {
  int32_t context_length;
  int32_t query_length;
};

struct AttentionShape {
  int32_t num_heads = 8;
  int32_t num_kv_heads = 8;
  int32_t head_dim = 64;
  int32_t block_size = 16;
  DType dtype = DType::kF32;
  int32_t extra_query_columns = 0;  // query rows longer than num_heads * head_dim (fused QKV)
  int32_t sliding_window = 0;
  float scale = 0.0f;
  float logit_soft_cap = 0.0f;  // > 0: scores soft-capped (Gemma 2)
};

class AttentionHarness {
 public:
  static constexpr int32_t kLayer = 1;  // of 2: the other layer holds NaN

  // num_tokens: the padded step size, fixed for the harness's lifetime (like a captured bucket).
  AttentionHarness(const AttentionShape& shape, int32_t max_sequences,
                   int32_t max_blocks_per_sequence, int32_t num_tokens, int workspace_threads);

  // Writes a new step into the same buffers: random K/V for every sequence in freshly shuffled,
  // non-contiguous blocks, random queries (padding rows too), metadata. Requires: the query
  // lengths sum to at most num_tokens, every context fits max_blocks_per_sequence.
  void load_step(std::mt19937& rng, const std::vector<SequenceSpec>& sequences);

  // Arguments writing to `output` (f32 [num_tokens, num_heads * head_dim]).
  cpu::PagedAttentionArguments arguments(float* output);
  // A KV-parallel member's arguments: the cache holds positions [begin, end) of every sequence
  // (end 0: to the end), its block tables are the step's rows shifted by begin / block_size
  // (entry 0 is the block of position begin), and it writes the log-sum-exp to `lse` (f32
  // [num_tokens, num_heads]). Requires: begin a multiple of the block size.
  cpu::PagedAttentionArguments member_arguments(float* output, float* lse, int64_t begin,
                                                int64_t end);
  // A NaN-filled output buffer of the right size.
  std::vector<float> make_output() const;
  // softmax(scale * q K^T) V per (token, head) in double; zero rows for padding tokens.
  std::vector<double> reference() const;

  int32_t num_tokens() const { return num_tokens_; }
  const AttentionShape& shape() const { return shape_; }

 private:
  AttentionShape shape_;
  int32_t max_sequences_;
  int32_t max_blocks_per_sequence_;
  int32_t num_tokens_;
  int workspace_threads_;
  TestKvCache cache_;

  // Persistent step buffers (their addresses never change).
  std::vector<int32_t> num_sequences_;  // [1]
  std::vector<int32_t> query_start_;    // [max_sequences + 1]
  std::vector<int32_t> seq_lens_;       // [max_sequences]
  std::vector<int32_t> block_tables_;   // [max_sequences, max_blocks_per_sequence]
  // A KV-parallel member's view of block_tables_ (member_arguments), same shape.
  std::vector<int32_t> member_block_tables_;
  std::vector<int32_t> positions_;  // [num_tokens]
  std::vector<float> query_;        // [num_tokens, query_row_stride]
  std::vector<std::byte> workspace_;

  // The current step, for the reference.
  std::vector<SequenceSpec> sequences_;
  std::vector<std::vector<float>> dense_keys_;    // per sequence [context, kv_heads * head_dim]
  std::vector<std::vector<float>> dense_values_;  // as stored (f16-rounded for an f16 cache)

  int64_t query_row_stride() const;
};

// Tolerances against the double reference. Values are in [-1, 1]; the output is a convex
// combination of V rows, so an absolute bound fits. f32 rounding in the dot products, the
// polynomial exp and the accumulation stay below 4e-7 (measured); the f16 cache's rounding is
// already in the reference (it reads the stored values), so both cache types share the bound.
inline constexpr double kAttentionAbsoluteTolerance = 2e-6;
inline constexpr double kAttentionRelativeTolerance = 2e-6;

// A random step of at most max_tokens tokens: decodes, chunks of longer prefills (context
// longer than the query) and a whole prefill, in random order.
std::vector<SequenceSpec> random_batch(std::mt19937& rng, int32_t max_context, int32_t max_tokens);

// Runs the harness's step eagerly on `pool` into a fresh (NaN-filled) output.
std::vector<float> run_attention_eager(ThreadPool& pool, AttentionHarness& harness);

void expect_matches_reference(const std::vector<float>& output, const AttentionHarness& harness,
                              const std::string& what);

}  // namespace folio::kernels::testing
