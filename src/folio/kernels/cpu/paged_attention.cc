#include "folio/kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "folio/base/check.h"
#include "folio/kernels/cpu/vector_launch.h"
#include "folio/kernels/cpu/vector_ops.h"

namespace folio::kernels::cpu {
namespace {

constexpr int64_t kWorkspaceAlignment = 64;

// Query heads of one kv group processed in one pass over the K/V rows (8 covers every Llama,
// Mistral and Qwen2 ratio; larger groups take several passes).
constexpr int32_t kMaxHeadsPerPass = 8;

int64_t workspace_bytes_per_thread(const PagedKvLayout& cache) {
  const int64_t bytes =
      int64_t{kMaxHeadsPerPass} * cache.block_size * static_cast<int64_t>(sizeof(float));
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// The sequence owning step token `token`: the largest s with query_start[s] <= token (empty
// sequences share their start with the next one, which is the owner).
// Requires: num_sequences >= 1, query_start[0] <= token < query_start[num_sequences].
int32_t find_sequence(const int32_t* query_start, int32_t num_sequences, int64_t token) {
  int32_t low = 0;
  int32_t high = num_sequences - 1;
  while (low < high) {
    const int32_t middle = low + (high - low + 1) / 2;
    if (query_start[middle] <= token) {
      low = middle;
    } else {
      high = middle - 1;
    }
  }
  return low;
}

// A run of query heads of one token that share a kv head: heads [first_head, first_head +
// num_heads), whose queries and outputs are consecutive rows of head_dim values.
struct HeadRun {
  const float* queries;  // f32 [num_heads, head_dim]
  float* outputs;        // f32 [num_heads, head_dim]
  int32_t num_heads;
  int32_t kv_head;
};

// scores[h * block_size + t] = scale * q_h . k_t for `count` consecutive key rows.
void block_scores(const VectorOps& ops, const PagedKvLayout& cache, const std::byte* keys,
                  const HeadRun& run, int64_t count, float scale, float* scores) {
  if (cache.dtype == DType::kF16) {
    ops.key_scores_f16(scores, cache.block_size, run.queries, cache.head_dim, run.num_heads,
                       reinterpret_cast<const uint16_t*>(keys), cache.token_stride(), count,
                       cache.head_dim, scale);
  } else {
    ops.key_scores_f32(scores, cache.block_size, run.queries, cache.head_dim, run.num_heads,
                       reinterpret_cast<const float*>(keys), cache.token_stride(), count,
                       cache.head_dim, scale);
  }
}

// outputs[h] += sum_t weights[h * block_size + t] * v_t.
void block_accumulate(const VectorOps& ops, const PagedKvLayout& cache, const std::byte* values,
                      const HeadRun& run, int64_t count, const float* weights) {
  if (cache.dtype == DType::kF16) {
    ops.accumulate_values_f16(run.outputs, cache.head_dim, weights, cache.block_size, run.num_heads,
                              reinterpret_cast<const uint16_t*>(values), cache.token_stride(),
                              count, cache.head_dim);
  } else {
    ops.accumulate_values_f32(run.outputs, cache.head_dim, weights, cache.block_size, run.num_heads,
                              reinterpret_cast<const float*>(values), cache.token_stride(), count,
                              cache.head_dim);
  }
}

// scores[t] = cap * tanh(scores[t] / cap) for t < count (portable code on every SIMD level).
void soft_cap_scores(float cap, float* scores, int64_t count) {
  const float inverse = 1.0f / cap;
  for (int64_t t = 0; t < count; ++t) scores[t] = cap * std::tanh(scores[t] * inverse);
}

// The visible key positions [begin, end) of a query token.
struct KeyRange {
  int64_t begin;
  int64_t end;
};

KeyRange visible_keys(const PagedAttentionArguments& arguments, int64_t token, int32_t sequence) {
  const int64_t block_size = arguments.cache.block_size;
  const int64_t position = arguments.positions[token];
  const int64_t context_length = arguments.seq_lens[sequence];
  FOLIO_CHECK(context_length >= 0 &&
                  context_length <= int64_t{arguments.max_blocks_per_sequence} * block_size,
              "paged_attention: sequence {} has context length {}, its block table holds {} "
              "blocks of {}",
              sequence, context_length, arguments.max_blocks_per_sequence, block_size);
  const int64_t begin = arguments.sliding_window > 0
                            ? std::max<int64_t>(0, position + 1 - arguments.sliding_window)
                            : 0;
  return {begin, std::min(position + 1, context_length)};
}

// Online softmax over the visible keys, block by block, for every head of `run`. Each head's
// arithmetic is the same whatever run it is part of (VectorOps' tiles are per-element chains),
// so outputs do not depend on how items were split between threads.
void attend(const PagedAttentionArguments& arguments, const VectorOps& ops, float scale,
            const HeadRun& run, KeyRange keys, const int32_t* block_table, float* scores) {
  const PagedKvLayout& cache = arguments.cache;
  const int64_t block_size = cache.block_size;
  const int64_t head_dim = cache.head_dim;
  std::fill(run.outputs, run.outputs + run.num_heads * head_dim, 0.0f);
  if (keys.end <= keys.begin) return;  // nothing visible (inconsistent metadata): zero output

  const int64_t head_offset = int64_t{run.kv_head} * head_dim * cache.element_bytes();
  float running_max[kMaxHeadsPerPass];
  float running_sum[kMaxHeadsPerPass];
  std::fill(running_max, running_max + run.num_heads, -std::numeric_limits<float>::infinity());
  std::fill(running_sum, running_sum + run.num_heads, 0.0f);
  for (int64_t logical = keys.begin / block_size; logical * block_size < keys.end; ++logical) {
    const int64_t first = std::max(keys.begin, logical * block_size);
    const int64_t count = std::min(keys.end, (logical + 1) * block_size) - first;
    const int64_t physical = block_table[logical];
    FOLIO_DCHECK(physical >= 0, "logical block {} maps to {}", logical, physical);
    const int64_t slot = physical * block_size + (first - logical * block_size);
    block_scores(ops, cache, cache.key_pointer(arguments.layer, slot) + head_offset, run, count,
                 scale, scores);
    for (int32_t h = 0; h < run.num_heads; ++h) {
      float* head_scores = scores + h * block_size;
      if (arguments.logit_soft_cap > 0.0f)
        soft_cap_scores(arguments.logit_soft_cap, head_scores, count);
      const float block_max = ops.maximum(head_scores, count);
      if (block_max > running_max[h]) {
        if (running_max[h] != -std::numeric_limits<float>::infinity()) {
          const float correction = std::exp(running_max[h] - block_max);
          running_sum[h] *= correction;
          ops.scale(run.outputs + h * head_dim, correction, head_dim);
        }
        running_max[h] = block_max;
      }
      running_sum[h] += ops.exp_shifted_sum(head_scores, head_scores, 1.0f, running_max[h], count);
    }
    block_accumulate(ops, cache, cache.value_pointer(arguments.layer, slot) + head_offset, run,
                     count, scores);
  }
  for (int32_t h = 0; h < run.num_heads; ++h) {
    ops.scale(run.outputs + h * head_dim, 1.0f / running_sum[h], head_dim);
  }
}

void paged_attention_items(const PagedAttentionArguments& arguments, const VectorOps& ops,
                           int64_t begin, int64_t end, int thread_index) {
  FOLIO_CHECK(thread_index < arguments.workspace_threads,
              "paged_attention: thread {} but the workspace is sized for {} threads", thread_index,
              arguments.workspace_threads);
  const int32_t num_sequences = *arguments.num_sequences;
  FOLIO_CHECK(num_sequences >= 0 && num_sequences <= arguments.max_sequences,
              "paged_attention: {} sequences, room for {}", num_sequences, arguments.max_sequences);
  const int64_t num_real_tokens = arguments.query_start[num_sequences];
  FOLIO_CHECK(arguments.query_start[0] == 0 && num_real_tokens <= arguments.num_tokens,
              "paged_attention: query_start spans [{}, {}) in a step of {} tokens",
              arguments.query_start[0], num_real_tokens, arguments.num_tokens);
  const int64_t head_dim = arguments.cache.head_dim;
  const float scale =
      arguments.scale > 0.0f ? arguments.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  auto* scores = reinterpret_cast<float*>(
      arguments.workspace + thread_index * workspace_bytes_per_thread(arguments.cache));

  const int32_t group_size = arguments.num_heads / arguments.cache.num_kv_heads;
  int64_t previous_token = -1;
  int32_t sequence = 0;
  for (int64_t item = begin; item < end;) {
    const int64_t token = item / arguments.num_heads;
    const auto head = static_cast<int32_t>(item % arguments.num_heads);
    // The heads from here to the end of this kv group, the pass size or the range.
    const auto num_heads = static_cast<int32_t>(
        std::min<int64_t>({group_size - head % group_size, kMaxHeadsPerPass, end - item}));
    const HeadRun run{
        .queries = arguments.query + token * arguments.query_row_stride + head * head_dim,
        .outputs = arguments.output + item * head_dim,
        .num_heads = num_heads,
        .kv_head = head / group_size};
    item += num_heads;
    if (token >= num_real_tokens) {  // padding
      std::fill(run.outputs, run.outputs + num_heads * head_dim, 0.0f);
      continue;
    }
    if (token != previous_token) {
      sequence = find_sequence(arguments.query_start, num_sequences, token);
      previous_token = token;
    }
    const int32_t* block_table =
        arguments.block_tables + int64_t{sequence} * arguments.max_blocks_per_sequence;
    attend(arguments, ops, scale, run, visible_keys(arguments, token, sequence), block_table,
           scores);
  }
}

}  // namespace

int64_t paged_attention_workspace_bytes(const PagedKvLayout& cache, int num_threads) {
  return workspace_bytes_per_thread(cache) * num_threads;
}

void paged_attention_body(const PagedAttentionArguments& arguments, int64_t begin, int64_t end,
                          int thread_index) {
  paged_attention_items(arguments, vector_ops(), begin, end, thread_index);
}

void paged_attention(device::HostStream& stream, const PagedAttentionArguments& arguments) {
  const PagedKvLayout& cache = arguments.cache;
  const Status valid = cache.validate();
  FOLIO_CHECK(valid.ok(), "paged_attention: {}", valid);
  FOLIO_CHECK(arguments.num_heads > 0 && arguments.num_heads % cache.num_kv_heads == 0,
              "paged_attention: {} query heads is not a multiple of {} kv heads",
              arguments.num_heads, cache.num_kv_heads);
  FOLIO_CHECK(arguments.layer >= 0 && arguments.layer < cache.num_layers,
              "paged_attention: layer {} of {}", arguments.layer, cache.num_layers);
  FOLIO_CHECK(arguments.num_tokens >= 0 && arguments.max_sequences >= 0 &&
                  arguments.max_blocks_per_sequence >= 0 && arguments.sliding_window >= 0,
              "paged_attention: negative size");
  FOLIO_CHECK(arguments.logit_soft_cap >= 0.0f && std::isfinite(arguments.logit_soft_cap),
              "paged_attention: logit soft cap {}", arguments.logit_soft_cap);
  FOLIO_CHECK(arguments.query_row_stride >= int64_t{arguments.num_heads} * cache.head_dim,
              "paged_attention: query row stride {} shorter than {} heads of {}",
              arguments.query_row_stride, arguments.num_heads, cache.head_dim);
  FOLIO_CHECK(
      arguments.workspace != nullptr && arguments.workspace_threads >= stream.pool().num_threads(),
      "paged_attention: workspace for {} threads, the stream's pool has {}",
      arguments.workspace_threads, stream.pool().num_threads());
  stream.launch(make_vector_kernel<PagedAttentionArguments, &paged_attention_items>(
      "paged_attention", arguments, int64_t{arguments.num_tokens} * arguments.num_heads, 1));
}

}  // namespace folio::kernels::cpu
