// Paged attention tiles up to 16 consecutive step tokens of one sequence so that they share
// K/V loads. A query's output must not depend on that: every token of a prompt gets the same
// bits whether the prompt runs as one whole prefill, as chunks of odd sizes that start
// anywhere inside a tile and share their tiles with other sequences and with padding, or as
// single-token decodes; on every SIMD path, with GQA, both cache types, a sliding window and a
// soft cap. The whole prefill itself is checked against the double reference.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "attention_test_util.h"
#include "folio/base/check.h"
#include "folio/base/thread_pool.h"
#include "folio/device/host_stream.h"
#include "folio/kernels/cpu/paged_attention.h"
#include "kernel_test_util.h"

namespace folio::kernels::testing {
namespace {

// Prompt positions [begin, end), run as one sequence of a step whose context ends at `end`.
struct Chunk {
  int32_t begin;
  int32_t end;
};

// Runs one step made of `chunks`, each a sequence of its own that reads the harness's loaded
// prompt (sequence 0: the same cached rows, block table and queries), padded to `num_tokens`
// with NaN queries. Returns the step's output, f32 [num_tokens, num_heads * head_dim].
std::vector<float> run_chunks(ThreadPool& pool, AttentionHarness& harness,
                              const std::vector<Chunk>& chunks, int32_t num_tokens) {
  std::vector<float> unused = harness.make_output();
  cpu::PagedAttentionArguments arguments = harness.arguments(unused.data());
  const int64_t stride = arguments.query_row_stride;
  const int32_t max_blocks = arguments.max_blocks_per_sequence;
  auto num_sequences = static_cast<int32_t>(chunks.size());
  std::vector<int32_t> query_start{0}, seq_lens, block_tables, positions;
  std::vector<float> query;
  for (const Chunk& chunk : chunks) {
    for (int32_t position = chunk.begin; position < chunk.end; ++position) {
      positions.push_back(position);
      query.insert(query.end(), arguments.query + position * stride,
                   arguments.query + (position + 1) * stride);
    }
    query_start.push_back(query_start.back() + chunk.end - chunk.begin);
    seq_lens.push_back(chunk.end);
    block_tables.insert(block_tables.end(), arguments.block_tables,
                        arguments.block_tables + max_blocks);
  }
  FOLIO_CHECK(query_start.back() <= num_tokens, "chunks overflow the step");
  positions.resize(num_tokens, 0);
  query.resize(num_tokens * stride, std::nanf(""));
  std::vector<float> output(num_tokens * int64_t{arguments.num_heads} * arguments.cache.head_dim,
                            std::nanf(""));
  arguments.query = query.data();
  arguments.output = output.data();
  arguments.num_tokens = num_tokens;
  arguments.max_sequences = num_sequences;
  arguments.num_sequences = &num_sequences;
  arguments.query_start = query_start.data();
  arguments.seq_lens = seq_lens.data();
  arguments.block_tables = block_tables.data();
  arguments.positions = positions.data();
  device::HostStream stream(pool);
  cpu::paged_attention(stream, arguments);
  return output;
}

// Every chunk token's output row equals the whole prefill's row of its position, bit for bit,
// and the padding rows are zero.
void expect_rows_equal_whole_prefill(const std::vector<float>& output,
                                     const std::vector<float>& whole,
                                     const std::vector<Chunk>& chunks, int64_t row_size,
                                     const std::string& what) {
  int64_t token = 0;
  for (const Chunk& chunk : chunks) {
    for (int32_t position = chunk.begin; position < chunk.end; ++position, ++token) {
      EXPECT_EQ(std::memcmp(output.data() + token * row_size, whole.data() + position * row_size,
                            row_size * sizeof(float)),
                0)
          << what << ": position " << position << " (step token " << token << ")";
    }
  }
  for (auto i = token * row_size; i < static_cast<int64_t>(output.size()); ++i) {
    ASSERT_EQ(output[i], 0.0f) << what << ": padding token " << i / row_size;
  }
}

// Splits of a 53-token prompt (tiles are 16 tokens: 53 leaves a partial tile). Each entry is
// one step; its chunks are that step's sequences, in step order.
const std::vector<std::vector<Chunk>>& steps_of_prompt() {
  static const std::vector<std::vector<Chunk>> steps = {
      {{0, 7}, {7, 30}, {30, 53}},             // a chunked prefill, chunks across tile edges
      {{0, 1}, {40, 53}, {1, 40}},             // out of order, a 1-token chunk first
      {{52, 53}, {17, 18}, {0, 1}, {33, 34}},  // decodes of single tokens
      {{5, 22}},                               // one chunk, then padding to the end
      {{3, 4}, {11, 27}, {0, 3}, {48, 53}},    // odd sizes: 1, 16 (straddling), 3, 5
  };
  return steps;
}

constexpr int32_t kPromptLength = 53;

void expect_splits_match_whole_prefill(const AttentionShape& shape, uint32_t seed,
                                       const std::string& what) {
  const int32_t max_blocks = (kPromptLength + shape.block_size - 1) / shape.block_size;
  AttentionHarness harness(shape, /*max_sequences=*/1, max_blocks, /*num_tokens=*/kPromptLength,
                           /*workspace_threads=*/3);
  std::mt19937 rng(seed);
  harness.load_step(rng, {{kPromptLength, kPromptLength}});
  ThreadPool pool(3);
  const std::vector<float> whole = run_attention_eager(pool, harness);
  expect_matches_reference(whole, harness, what + ", whole prefill");
  const int64_t row_size = int64_t{shape.num_heads} * shape.head_dim;
  for (size_t i = 0; i < steps_of_prompt().size(); ++i) {
    const std::vector<Chunk>& chunks = steps_of_prompt()[i];
    for (int32_t padding : {0, 5, 13}) {
      int32_t tokens = padding;
      for (const Chunk& chunk : chunks) tokens += chunk.end - chunk.begin;
      const std::string step = what + ", step " + std::to_string(i) + " + " +
                               std::to_string(padding) + " padding tokens";
      expect_rows_equal_whole_prefill(run_chunks(pool, harness, chunks, tokens), whole, chunks,
                                      row_size, step);
    }
  }
}

using Config = std::tuple<SimdPath, int /*gqa ratio*/, DType>;

class PagedAttentionTilingTest : public ::testing::TestWithParam<Config> {};

TEST_P(PagedAttentionTilingTest, ChunksAndDecodesEqualWholePrefillBitForBit) {
  const auto [path, ratio, dtype] = GetParam();
  ScopedSimdPath scoped(path);
  AttentionShape shape;
  shape.num_heads = 8;
  shape.num_kv_heads = 8 / ratio;
  shape.dtype = dtype;
  // A partial vector on every path with GQA; blocks of 8 put two blocks under one tile.
  shape.head_dim = ratio == 1 ? 64 : 40;
  shape.block_size = ratio == 1 ? 16 : 8;
  expect_splits_match_whole_prefill(shape, 17u * ratio + static_cast<uint32_t>(dtype), "splits");
}

std::string config_name(const ::testing::TestParamInfo<Config>& info) {
  const auto [path, ratio, dtype] = info.param;
  return std::string(cpu::simd_path_name(path)) + "_gqa" + std::to_string(ratio) + "_" +
         std::string(dtype_name(dtype));
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttentionTilingTest,
                         ::testing::Combine(::testing::ValuesIn(supported_simd_paths()),
                                            ::testing::Values(1, 4),
                                            ::testing::Values(DType::kF32, DType::kF16)),
                         config_name);

// A window shorter than a tile gives the tile's tokens different first keys (and blocks that
// only some of them see); the soft cap runs on each token's own part of a block.
TEST(PagedAttentionTilingOptionsTest, SlidingWindowAndSoftCapSplitsEqualWholePrefill) {
  for (SimdPath path : supported_simd_paths()) {
    ScopedSimdPath scoped(path);
    AttentionShape shape;
    shape.num_kv_heads = 2;
    shape.block_size = 8;
    shape.sliding_window = 11;
    shape.logit_soft_cap = 0.5f;
    shape.scale = 0.5f;
    expect_splits_match_whole_prefill(shape, 5, std::string(cpu::simd_path_name(path)));
  }
}

}  // namespace
}  // namespace folio::kernels::testing
