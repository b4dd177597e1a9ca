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

// Step tokens per work item: consecutive tokens of one sequence share each K/V row loaded (in
// prefill every query of a tile reads the same keys), and 16 of them bring K/V reads from L2
// down to a sixteenth per query.
constexpr int32_t kTileTokens = 16;
// Query heads of one kv group processed in one pass over the K/V rows (8 covers every Llama,
// Mistral and Qwen2 ratio; larger groups take several passes).
constexpr int32_t kMaxHeadsPerPass = 8;
// Queries (tokens x heads) of one pass: bounds the per-thread scratch, which stays in L1.
constexpr int32_t kMaxQueriesPerPass = std::max(kTileTokens, kMaxHeadsPerPass);

int64_t aligned(int64_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// A thread's scratch: f32 scores [kMaxQueriesPerPass, block_size], then f32 queries and f32
// accumulators, each [kMaxQueriesPerPass, head_dim].
int64_t scores_bytes(const PagedKvLayout& cache) {
  return aligned(int64_t{kMaxQueriesPerPass} * cache.block_size * int64_t{sizeof(float)});
}
int64_t rows_bytes(const PagedKvLayout& cache) {
  return aligned(int64_t{kMaxQueriesPerPass} * cache.head_dim * int64_t{sizeof(float)});
}
int64_t workspace_bytes_per_thread(const PagedKvLayout& cache) {
  return scores_bytes(cache) + 2 * rows_bytes(cache);
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

// One pass over a sequence's K/V rows: step tokens [first_token, first_token + num_tokens) of
// sequence `sequence`, query heads [first_head, first_head + num_heads) of kv head `kv_head`.
// Its queries are numbered token-major: query i * num_heads + h is token first_token + i, head
// first_head + h.
struct QueryTile {
  int64_t first_token;
  int32_t num_tokens;
  int32_t first_head;
  int32_t num_heads;
  int32_t kv_head;
  int32_t sequence;
};

// A thread's slice of the workspace.
struct Scratch {
  float* scores;        // f32 [kMaxQueriesPerPass, block_size]
  float* queries;       // f32 [kMaxQueriesPerPass, head_dim]: the tile's queries, contiguous
  float* accumulators;  // f32 [kMaxQueriesPerPass, head_dim]: unnormalized outputs
};

// scores[q * block_size + t] = scale * q . k_t for `count` consecutive key rows.
void block_scores(const VectorOps& ops, const PagedKvLayout& cache, const std::byte* keys,
                  const float* queries, int32_t num_queries, int64_t count, float scale,
                  float* scores) {
  if (cache.dtype == DType::kF16) {
    ops.key_scores_f16(scores, cache.block_size, queries, cache.head_dim, num_queries,
                       reinterpret_cast<const uint16_t*>(keys), cache.token_stride(), count,
                       cache.head_dim, scale);
  } else {
    ops.key_scores_f32(scores, cache.block_size, queries, cache.head_dim, num_queries,
                       reinterpret_cast<const float*>(keys), cache.token_stride(), count,
                       cache.head_dim, scale);
  }
}

// accumulators[q] += sum_t weights[q * block_size + t] * v_t.
void block_accumulate(const VectorOps& ops, const PagedKvLayout& cache, const std::byte* values,
                      float* accumulators, const float* weights, int32_t num_queries,
                      int64_t count) {
  if (cache.dtype == DType::kF16) {
    ops.accumulate_values_f16(accumulators, cache.head_dim, weights, cache.block_size, num_queries,
                              reinterpret_cast<const uint16_t*>(values), cache.token_stride(),
                              count, cache.head_dim);
  } else {
    ops.accumulate_values_f32(accumulators, cache.head_dim, weights, cache.block_size, num_queries,
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
  // The positions this cache holds (all of them, unless it is a KV-parallel member's).
  const int64_t range_begin = arguments.kv_range_begin;
  const int64_t range_end =
      arguments.kv_range_end > 0 ? arguments.kv_range_end : std::numeric_limits<int64_t>::max();
  const int64_t held = std::min(context_length, range_end) - range_begin;
  FOLIO_CHECK(
      context_length >= 0 && held <= int64_t{arguments.max_blocks_per_sequence} * block_size,
      "paged_attention: sequence {} has context length {} ({} of them from position "
      "{} in this cache), its block table holds {} blocks of {}",
      sequence, context_length, std::max<int64_t>(held, 0), range_begin,
      arguments.max_blocks_per_sequence, block_size);
  const int64_t begin = arguments.sliding_window > 0
                            ? std::max<int64_t>(0, position + 1 - arguments.sliding_window)
                            : 0;
  return {std::max(begin, range_begin), std::min({position + 1, context_length, range_end})};
}

// One query's online-softmax state: the running maximum m and running sum l.
struct SoftmaxState {
  float running_max = -std::numeric_limits<float>::infinity();
  float running_sum = 0.0f;
};

// One query's online-softmax step over its `count` scores of a block: soft cap, block maximum,
// rescale of l and of the accumulator by exp(m_old - m_new) when the maximum grows, then the
// scores become the weights exp(s - m) and l grows by their sum.
void softmax_step(const VectorOps& ops, float soft_cap, float* scores, int64_t count,
                  float* accumulator, int64_t head_dim, SoftmaxState& state) {
  if (soft_cap > 0.0f) soft_cap_scores(soft_cap, scores, count);
  const float block_max = ops.maximum(scores, count);
  if (block_max > state.running_max) {
    if (state.running_max != -std::numeric_limits<float>::infinity()) {
      const float correction = std::exp(state.running_max - block_max);
      state.running_sum *= correction;
      ops.scale(accumulator, correction, head_dim);
    }
    state.running_max = block_max;
  }
  state.running_sum += ops.exp_shifted_sum(scores, scores, 1.0f, state.running_max, count);
}

// Online softmax over the visible keys, block by block, for every query of `tile`. The tile's
// queries share each block's K/V loads (one key_scores call over the union of what they see,
// one accumulate call per run of tokens that see the same part of the block), but each query's
// arithmetic is exactly what it would be alone: its scores are the same dot-product chains,
// and its softmax steps and accumulation run over the same blocks, the same key ranges and in
// the same order. Outputs therefore do not depend on the tiling, the partition or the thread.
void attend_tile(const PagedAttentionArguments& arguments, const VectorOps& ops, float scale,
                 const QueryTile& tile, const Scratch& scratch) {
  const PagedKvLayout& cache = arguments.cache;
  const int64_t block_size = cache.block_size;
  const int64_t head_dim = cache.head_dim;
  const int32_t num_queries = tile.num_tokens * tile.num_heads;
  FOLIO_DCHECK(tile.num_tokens <= kTileTokens && num_queries <= kMaxQueriesPerPass,
               "tile of {} tokens x {} heads", tile.num_tokens, tile.num_heads);
  KeyRange keys[kTileTokens];
  KeyRange all{std::numeric_limits<int64_t>::max(), 0};  // the union of the non-empty ranges
  for (int32_t i = 0; i < tile.num_tokens; ++i) {
    const int64_t token = tile.first_token + i;
    keys[i] = visible_keys(arguments, token, tile.sequence);
    if (keys[i].begin < keys[i].end) {
      all = {std::min(all.begin, keys[i].begin), std::max(all.end, keys[i].end)};
    }
    const float* row = arguments.query + token * arguments.query_row_stride;
    std::memcpy(scratch.queries + int64_t{i} * tile.num_heads * head_dim,
                row + int64_t{tile.first_head} * head_dim,
                static_cast<size_t>(tile.num_heads * head_dim) * sizeof(float));
  }
  std::fill(scratch.accumulators, scratch.accumulators + num_queries * head_dim, 0.0f);
  SoftmaxState states[kMaxQueriesPerPass];

  const int32_t* block_table =
      arguments.block_tables + int64_t{tile.sequence} * arguments.max_blocks_per_sequence;
  // Entry 0 of the row is the block of position kv_range_begin (0 unless KV-parallel).
  const int64_t first_logical = arguments.kv_range_begin / block_size;
  const int64_t head_offset = int64_t{tile.kv_head} * head_dim * cache.element_bytes();
  for (int64_t logical = all.begin / block_size; logical * block_size < all.end; ++logical) {
    const int64_t block_begin = logical * block_size;
    const int64_t first = std::max(all.begin, block_begin);
    const int64_t last = std::min(all.end, block_begin + block_size);
    const int64_t physical = block_table[logical - first_logical];
    FOLIO_DCHECK(physical >= 0, "logical block {} maps to {}", logical, physical);
    const auto slot = [&](int64_t position) {
      return physical * block_size + (position - block_begin);
    };
    block_scores(ops, cache, cache.key_pointer(arguments.layer, slot(first)) + head_offset,
                 scratch.queries, num_queries, last - first, scale, scratch.scores);
    // The part of this block each token sees, and runs of tokens that see the same part.
    for (int32_t i = 0; i < tile.num_tokens;) {
      const int64_t begin = std::max(keys[i].begin, block_begin);
      const int64_t end = std::min(keys[i].end, block_begin + block_size);
      int32_t run_end = i + 1;
      while (run_end < tile.num_tokens && std::max(keys[run_end].begin, block_begin) == begin &&
             std::min(keys[run_end].end, block_begin + block_size) == end) {
        ++run_end;
      }
      if (begin < end) {
        const int32_t run_first_query = i * tile.num_heads;
        const int32_t run_queries = (run_end - i) * tile.num_heads;
        float* run_scores = scratch.scores + run_first_query * block_size + (begin - first);
        float* run_accumulators = scratch.accumulators + run_first_query * head_dim;
        for (int32_t q = 0; q < run_queries; ++q) {
          softmax_step(ops, arguments.logit_soft_cap, run_scores + q * block_size, end - begin,
                       run_accumulators + q * head_dim, head_dim, states[run_first_query + q]);
        }
        block_accumulate(ops, cache,
                         cache.value_pointer(arguments.layer, slot(begin)) + head_offset,
                         run_accumulators, run_scores, run_queries, end - begin);
      }
      i = run_end;
    }
  }

  const int32_t num_heads = arguments.num_heads;
  for (int32_t q = 0; q < num_queries; ++q) {
    const int32_t i = q / tile.num_heads;
    float* accumulator = scratch.accumulators + int64_t{q} * head_dim;
    // A query that sees nothing (inconsistent metadata, or a KV-parallel member's range after
    // its position) keeps its zero output; its log-sum-exp is -inf, a neutral partial.
    const bool sees_keys = keys[i].begin < keys[i].end;
    if (sees_keys) ops.scale(accumulator, 1.0f / states[q].running_sum, head_dim);
    const int64_t head = tile.first_head + q % tile.num_heads;
    if (arguments.lse != nullptr) {
      arguments.lse[(tile.first_token + i) * num_heads + head] =
          sees_keys ? states[q].running_max + std::log(states[q].running_sum)
                    : -std::numeric_limits<float>::infinity();
    }
    std::memcpy(arguments.output + ((tile.first_token + i) * num_heads + head) * head_dim,
                accumulator, static_cast<size_t>(head_dim) * sizeof(float));
  }
}

// Heads [first_head, first_head + num_heads) of kv head `kv_head` for the step tokens
// [tile_begin, tile_end): the tokens are split where sequences (or padding) begin, and each
// piece is attended in passes of at most kMaxQueriesPerPass queries.
struct TileHeads {
  int64_t tile_begin;
  int64_t tile_end;
  int32_t first_head;
  int32_t num_heads;
  int32_t kv_head;
};

void attend_tile_heads(const PagedAttentionArguments& arguments, const VectorOps& ops, float scale,
                       const TileHeads& work, int32_t num_sequences, int64_t num_real_tokens,
                       const Scratch& scratch) {
  const int64_t head_dim = arguments.cache.head_dim;
  for (int64_t token = work.tile_begin; token < work.tile_end;) {
    if (token >= num_real_tokens) {  // padding from here on
      for (; token < work.tile_end; ++token) {
        float* row = arguments.output + (token * arguments.num_heads + work.first_head) * head_dim;
        std::fill(row, row + work.num_heads * head_dim, 0.0f);
        if (arguments.lse != nullptr) {
          float* lse = arguments.lse + token * arguments.num_heads + work.first_head;
          std::fill(lse, lse + work.num_heads, -std::numeric_limits<float>::infinity());
        }
      }
      break;
    }
    const int32_t sequence = find_sequence(arguments.query_start, num_sequences, token);
    const int64_t piece_end =
        std::min<int64_t>({work.tile_end, arguments.query_start[sequence + 1], num_real_tokens});
    const auto num_tokens = static_cast<int32_t>(piece_end - token);
    const int32_t heads_per_pass =
        std::clamp(kMaxQueriesPerPass / num_tokens, int32_t{1}, kMaxHeadsPerPass);
    for (int32_t head = work.first_head; head < work.first_head + work.num_heads;
         head += heads_per_pass) {
      const QueryTile tile{
          .first_token = token,
          .num_tokens = num_tokens,
          .first_head = head,
          .num_heads = std::min(heads_per_pass, work.first_head + work.num_heads - head),
          .kv_head = work.kv_head,
          .sequence = sequence};
      attend_tile(arguments, ops, scale, tile, scratch);
    }
    token = piece_end;
  }
}

int64_t num_tiles(int32_t num_tokens) {
  return (int64_t{num_tokens} + kTileTokens - 1) / kTileTokens;
}

// The tile of the index-th item of a kv head: 0, tiles - 1, 1, tiles - 2, ... In a causal
// prefill a tile's work grows with its position, so consecutive pairs of items cost about the
// same and any contiguous slice of items gets its share of the work.
int64_t interleaved_tile(int64_t index, int64_t tiles) {
  return index % 2 == 0 ? index / 2 : tiles - 1 - index / 2;
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
  const PagedKvLayout& cache = arguments.cache;
  const float scale = arguments.scale > 0.0f ? arguments.scale
                                             : 1.0f / std::sqrt(static_cast<float>(cache.head_dim));
  std::byte* slice = arguments.workspace + thread_index * workspace_bytes_per_thread(cache);
  const Scratch scratch{
      .scores = reinterpret_cast<float*>(slice),
      .queries = reinterpret_cast<float*>(slice + scores_bytes(cache)),
      .accumulators = reinterpret_cast<float*>(slice + scores_bytes(cache) + rows_bytes(cache))};

  // Item (kv_head * tiles + index) * group_size + head_in_group, tile interleaved_tile(index): a
  // slice covers consecutive heads of one kv group on one tile, then another tile of the same
  // kv head; kv heads are the outer order and tiles interleave early and late ones, so the
  // HostStream's equal slices get about equal shares of a causal prefill's work (later tokens
  // see more keys) rather than the early or the late tokens.
  const int32_t group_size = arguments.num_heads / cache.num_kv_heads;
  const int64_t tiles = num_tiles(arguments.num_tokens);
  for (int64_t item = begin; item < end;) {
    const auto head_in_group = static_cast<int32_t>(item % group_size);
    const int64_t group_item = item / group_size;
    const int64_t tile = interleaved_tile(group_item % tiles, tiles);
    const auto kv_head = static_cast<int32_t>(group_item / tiles);
    const auto num_heads =
        static_cast<int32_t>(std::min<int64_t>(group_size - head_in_group, end - item));
    item += num_heads;
    const TileHeads work{
        .tile_begin = tile * kTileTokens,
        .tile_end = std::min<int64_t>(arguments.num_tokens, (tile + 1) * kTileTokens),
        .first_head = kv_head * group_size + head_in_group,
        .num_heads = num_heads,
        .kv_head = kv_head};
    attend_tile_heads(arguments, ops, scale, work, num_sequences, num_real_tokens, scratch);
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
      arguments.kv_range_begin >= 0 && arguments.kv_range_begin % cache.block_size == 0 &&
          (arguments.kv_range_end == 0 || arguments.kv_range_end > arguments.kv_range_begin),
      "paged_attention: KV range [{}, {}) with blocks of {}", arguments.kv_range_begin,
      arguments.kv_range_end, cache.block_size);
  FOLIO_CHECK(
      arguments.workspace != nullptr && arguments.workspace_threads >= stream.pool().num_threads(),
      "paged_attention: workspace for {} threads, the stream's pool has {}",
      arguments.workspace_threads, stream.pool().num_threads());
  stream.launch(make_vector_kernel<PagedAttentionArguments, &paged_attention_items>(
      "paged_attention", arguments, num_tiles(arguments.num_tokens) * arguments.num_heads, 1));
}

}  // namespace folio::kernels::cpu
