// Paged attention over the KV cache, one kernel for every kind of step: prefill (many query
// tokens per sequence, whole or chunked), decode (one query token per sequence) and steps that
// mix both, with sequences of different lengths in one batch.
//
// The step's tokens are laid out sequence after sequence: sequence s owns step tokens
// [query_start[s], query_start[s + 1]); tokens at or after query_start[*num_sequences] are
// padding (the step was padded up to a captured size) and get zero output. A query token at
// absolute position p attends causally to positions [0, p] of its own sequence (the cache
// already holds this step's keys: kv_write runs first), capped by the sequence's context
// length and, with a sliding window w > 0, to (p - w, p]. Keys of position j live in physical
// block block_tables[s][j / block_size], row j % block_size (paged_kv_layout.h).
//
// Grouped-query attention: query head h reads kv head h / (num_heads / num_kv_heads).
//
// Work partition: the step's padded tokens are cut into tiles of 16 consecutive tokens, and
// items are (kv head, tile, head of the kv group), kv-head-major: num_heads * ceil(num_tokens /
// 16) of them, fixed by the padded step size, so a captured launch stays valid whatever the
// batch looks like. A slice of items covers, per tile, some heads of one kv group; at run time
// the tile's tokens are split where sequences (found by binary search in query_start) and
// padding begin, and each piece (up to 16 tokens of one sequence) is attended in passes of at
// most 16 queries (tokens x heads; up to 8 heads of a group for a single decode token) that
// share every K/V row they load: in prefill each key is read once per 16 queries instead of
// once per query. Per query, the sequence's blocks are walked in order with a numerically
// stable online softmax: per block, scores s_j = scale * q . k_j (soft-capped when
// logit_soft_cap > 0), a running maximum m, running sum l and output accumulator o rescaled by
// exp(m_old - m_new) when the maximum grows, o += sum_j exp(s_j - m) v_j; finally o / l. A
// query's arithmetic is the same whichever queries share its pass (VectorOps' tiles compute each
// element as one fixed chain; queries of a pass that see different parts of a block, such as
// the diagonal block of a causal prefill, accumulate in separate calls), so the output is
// bit-identical for any thread count and equal between a whole prefill, a chunked one and a
// decode of the same token.
//
// KV-parallel partial attention (issue 15, slice 6; dist.md "KV-parallel groups"): a member of a
// KV-parallel group holds positions [kv_range_begin, kv_range_end) of every sequence, entry 0 of
// its block table row being the block of position kv_range_begin. A query then attends only to
// the visible keys inside that range (none: zero output), and with `lse` set the kernel also
// writes, per query token and head, the log-sum-exp of the scores it saw (max + log(sum of
// exp(s - max)), -inf for a query that saw no key, padding tokens included), so that the
// members' partial outputs merge exactly (attention_merge.h). With the defaults (0, 0, null)
// the kernel is the whole-sequence attention above.
//
// Everything that changes from step to step (num_sequences, query_start, seq_lens,
// block_tables, positions, and the query and cache contents) is read through pointers when the
// kernel runs, so a captured launch replays correctly after the engine rewrites those buffers.
// Scratch space (per thread: a block of scores, the queries and the accumulators of one pass)
// comes from the caller's workspace.
#pragma once

#include <cstddef>
#include <cstdint>

#include "folio/device/host_stream.h"
#include "folio/kernels/paged_kv_layout.h"

namespace folio::kernels::cpu {

struct PagedAttentionArguments {
  // f32 [num_tokens, query_row_stride]; head h is [h * head_dim, (h + 1) * head_dim) of a row.
  const float* query;
  float* output;  // f32 [num_tokens, num_heads * head_dim]
  int64_t query_row_stride = 0;
  PagedKvLayout cache;  // num_kv_heads, head_dim, block_size and element type come from here
  int32_t layer = 0;
  int32_t num_tokens = 0;  // the step's padded token count
  int32_t num_heads = 0;
  int32_t max_sequences = 0;
  int32_t max_blocks_per_sequence = 0;
  int32_t sliding_window = 0;  // 0: attend to the whole past
  float scale = 0.0f;          // <= 0: 1 / sqrt(head_dim)
  // > 0: each score s becomes logit_soft_cap * tanh(s / logit_soft_cap) before the softmax
  // (Gemma 2's attention logit soft-capping); 0: scores as they are.
  float logit_soft_cap = 0.0f;

  const int32_t* num_sequences;  // i32 scalar in [0, max_sequences]
  const int32_t* query_start;    // i32 [max_sequences + 1], non-decreasing, query_start[0] == 0
  const int32_t* seq_lens;       // i32 [max_sequences]: tokens cached for s after this step
  const int32_t* block_tables;   // i32 [max_sequences, max_blocks_per_sequence]
  const int32_t* positions;      // i32 [num_tokens]: absolute position of each token

  std::byte* workspace;           // paged_attention_workspace_bytes(cache, workspace_threads) bytes
  int32_t workspace_threads = 0;  // threads the workspace is sized for (>= the pool's)

  // KV-parallel member: the positions this cache holds, [kv_range_begin, kv_range_end);
  // kv_range_begin a multiple of the block size; kv_range_end 0: no upper bound.
  int64_t kv_range_begin = 0;
  int64_t kv_range_end = 0;
  float* lse = nullptr;  // f32 [num_tokens, num_heads], or null: no log-sum-exp output
};

// Bytes of workspace for a pool of `num_threads` threads (64-byte aligned slices per thread).
int64_t paged_attention_workspace_bytes(const PagedKvLayout& cache, int num_threads);

void paged_attention_body(const PagedAttentionArguments& arguments, int64_t begin, int64_t end,
                          int thread_index);

// Requires: cache.validate() is OK, num_heads a positive multiple of cache.num_kv_heads,
// 0 <= layer < num_layers, query_row_stride >= num_heads * head_dim, a workspace for at least
// the stream's thread count, 0 <= kv_range_begin (a multiple of the block size) and kv_range_end
// 0 or > kv_range_begin. Run-time values are checked when the kernel runs; a step that
// breaks the contract above (a count, length or block outside its buffer) aborts.
void paged_attention(device::HostStream& stream, const PagedAttentionArguments& arguments);

}  // namespace folio::kernels::cpu
