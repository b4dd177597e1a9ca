#include "folio/kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "folio/base/check.h"
#include "folio/kernels/cpu/vector_ops.h"

namespace folio::kernels::cpu {
namespace {

constexpr int64_t kWorkspaceAlignment = 64;

int64_t workspace_bytes_per_thread(const PagedKvLayout& cache) {
  const int64_t bytes = int64_t{cache.block_size} * static_cast<int64_t>(sizeof(float));
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

// scores[0, count) = scale * q . k for `count` consecutive key rows of one kv head.
void block_scores(const VectorOps& ops, const PagedKvLayout& cache, const std::byte* keys,
                  const float* query, int64_t count, float scale, float* scores) {
  if (cache.dtype == DType::kF16) {
    ops.key_scores_f16(scores, query, reinterpret_cast<const uint16_t*>(keys), cache.token_stride(),
                       count, cache.head_dim, scale);
  } else {
    ops.key_scores_f32(scores, query, reinterpret_cast<const float*>(keys), cache.token_stride(),
                       count, cache.head_dim, scale);
  }
}

void block_accumulate(const VectorOps& ops, const PagedKvLayout& cache, const std::byte* values,
                      const float* weights, int64_t count, float* output) {
  if (cache.dtype == DType::kF16) {
    ops.accumulate_values_f16(output, weights, reinterpret_cast<const uint16_t*>(values),
                              cache.token_stride(), count, cache.head_dim);
  } else {
    ops.accumulate_values_f32(output, weights, reinterpret_cast<const float*>(values),
                              cache.token_stride(), count, cache.head_dim);
  }
}

// One (token, head) item: output = softmax(scale * q K^T) V over the token's visible keys.
void attend(const PagedAttentionArguments& arguments, const VectorOps& ops, float scale,
            int64_t token, int32_t head, int32_t sequence, float* scores) {
  const PagedKvLayout& cache = arguments.cache;
  const int64_t block_size = cache.block_size;
  float* output = arguments.output + (token * arguments.num_heads + head) * cache.head_dim;
  std::fill(output, output + cache.head_dim, 0.0f);

  const int64_t position = arguments.positions[token];
  const int64_t context_length = arguments.context_lengths[sequence];
  FOLIO_CHECK(context_length >= 0 &&
                  context_length <= int64_t{arguments.max_blocks_per_sequence} * block_size,
              "paged_attention: sequence {} has context length {}, its block table holds {} "
              "blocks of {}",
              sequence, context_length, arguments.max_blocks_per_sequence, block_size);
  const int64_t key_end = std::min(position + 1, context_length);
  const int64_t key_begin = arguments.sliding_window > 0
                                ? std::max<int64_t>(0, position + 1 - arguments.sliding_window)
                                : 0;
  if (key_end <= key_begin) return;  // nothing visible (inconsistent metadata): zero output

  const int32_t kv_head = head / (arguments.num_heads / cache.num_kv_heads);
  const int64_t head_offset = int64_t{kv_head} * cache.head_dim * cache.element_bytes();
  const float* query =
      arguments.query + token * arguments.query_row_stride + int64_t{head} * cache.head_dim;
  const int32_t* block_table =
      arguments.block_tables + int64_t{sequence} * arguments.max_blocks_per_sequence;

  float running_max = -std::numeric_limits<float>::infinity();
  float running_sum = 0.0f;
  for (int64_t logical = key_begin / block_size; logical * block_size < key_end; ++logical) {
    const int64_t first = std::max(key_begin, logical * block_size);
    const int64_t count = std::min(key_end, (logical + 1) * block_size) - first;
    const int64_t physical = block_table[logical];
    FOLIO_DCHECK(physical >= 0, "sequence {} block {} maps to {}", sequence, logical, physical);
    const int64_t slot = physical * block_size + (first - logical * block_size);
    block_scores(ops, cache, cache.key_pointer(arguments.layer, slot) + head_offset, query, count,
                 scale, scores);
    const float block_max = ops.maximum(scores, count);
    if (block_max > running_max) {
      if (running_max != -std::numeric_limits<float>::infinity()) {
        const float correction = std::exp(running_max - block_max);
        running_sum *= correction;
        ops.scale(output, correction, cache.head_dim);
      }
      running_max = block_max;
    }
    running_sum += ops.exp_shifted_sum(scores, scores, 1.0f, running_max, count);
    block_accumulate(ops, cache, cache.value_pointer(arguments.layer, slot) + head_offset, scores,
                     count, output);
  }
  ops.scale(output, 1.0f / running_sum, cache.head_dim);
}

}  // namespace

int64_t paged_attention_workspace_bytes(const PagedKvLayout& cache, int num_threads) {
  return workspace_bytes_per_thread(cache) * num_threads;
}

void paged_attention_body(const PagedAttentionArguments& arguments, int64_t begin, int64_t end,
                          int thread_index) {
  FOLIO_CHECK(thread_index < arguments.workspace_threads,
              "paged_attention: thread {} but the workspace is sized for {} threads", thread_index,
              arguments.workspace_threads);
  const VectorOps& ops = vector_ops();
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

  int64_t previous_token = -1;
  int32_t sequence = 0;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t token = item / arguments.num_heads;
    const auto head = static_cast<int32_t>(item % arguments.num_heads);
    if (token >= num_real_tokens) {  // padding
      float* output = arguments.output + item * head_dim;
      std::fill(output, output + head_dim, 0.0f);
      continue;
    }
    if (token != previous_token) {
      sequence = find_sequence(arguments.query_start, num_sequences, token);
      previous_token = token;
    }
    attend(arguments, ops, scale, token, head, sequence, scores);
  }
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
  FOLIO_CHECK(arguments.query_row_stride >= int64_t{arguments.num_heads} * cache.head_dim,
              "paged_attention: query row stride {} shorter than {} heads of {}",
              arguments.query_row_stride, arguments.num_heads, cache.head_dim);
  FOLIO_CHECK(
      arguments.workspace != nullptr && arguments.workspace_threads >= stream.pool().num_threads(),
      "paged_attention: workspace for {} threads, the stream's pool has {}",
      arguments.workspace_threads, stream.pool().num_threads());
  stream.launch(device::HostKernel::make<PagedAttentionArguments, &paged_attention_body>(
      "paged_attention", arguments, int64_t{arguments.num_tokens} * arguments.num_heads, 1));
}

}  // namespace folio::kernels::cpu
