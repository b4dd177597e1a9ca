// Paged attention on the CPU: decode (batch 1/8/32 at contexts 128/1024) and a 256-token
// prefill, for a Llama-3-8B layer (32 query heads, 8 kv heads, head_dim 128, blocks of 16),
// with f16 and f32 caches, on each SIMD path; and the shipped "base" preset's layer (12 heads,
// 12 kv heads, head_dim 64): a 512-token prefill and a batch-1 decode at context 512. Reports
// tokens/s and the KV bytes read per second.
//
// Baseline, measured in the same run: BM_KvReadBaseline streams the same number of KV bytes
// once (a vectorized sum of squares over a contiguous buffer, same threads), the memory-bound
// floor for decode attention; compare attention's bytes_per_second against it as a ratio.
// Another in-run ratio is across SIMD paths (portable / avx2 / avx512) for the same shape.
//
// Not a test: nothing here asserts.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "folio/base/check.h"
#include "folio/base/thread_pool.h"
#include "folio/device/host_stream.h"
#include "folio/kernels/cpu/paged_attention.h"
#include "folio/kernels/cpu/vector_ops.h"
#include "folio/tensor/half.h"

namespace folio::kernels::cpu {
namespace {

constexpr int32_t kBlockSize = 16;

struct LayerShape {
  int32_t heads;
  int32_t kv_heads;
  int32_t head_dim;
};
constexpr LayerShape kLlama3Layer{.heads = 32, .kv_heads = 8, .head_dim = 128};
constexpr LayerShape kBaseLayer{.heads = 12, .kv_heads = 12, .head_dim = 64};
constexpr int32_t kKvHeads = kLlama3Layer.kv_heads, kHeadDim = kLlama3Layer.head_dim;

ThreadPool& pool() {
  static ThreadPool instance(ThreadPool::default_num_threads());
  return instance;
}

// One layer's cache and a step of `batch` sequences, each with `query_length` query tokens
// at the end of a `context`-token context.
class AttentionStep {
 public:
  AttentionStep(const LayerShape& shape, int32_t batch, int32_t context, int32_t query_length,
                DType dtype)
      : batch_(batch) {
    const int32_t blocks_per_sequence = (context + kBlockSize - 1) / kBlockSize;
    const int64_t num_blocks = int64_t{batch} * blocks_per_sequence;
    const int64_t block_bytes =
        PagedKvLayout::compute_block_bytes(1, kBlockSize, shape.kv_heads, shape.head_dim, dtype);
    storage_.resize(static_cast<size_t>(num_blocks * block_bytes));
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (size_t i = 0; i + 4 <= storage_.size(); i += 4) {  // f32 values, or pairs of f16s
      const float value = uniform(rng);
      if (dtype == DType::kF16) {
        const uint16_t half[2] = {f32_to_f16(value), f32_to_f16(-value)};
        std::memcpy(&storage_[i], half, 4);
      } else {
        std::memcpy(&storage_[i], &value, 4);
      }
    }
    // One page holds everything; blocks handed out in shuffled order.
    layout_ = PagedKvLayout{.base = storage_.data(),
                            .page_bytes = num_blocks * block_bytes,
                            .blocks_per_page = static_cast<int32_t>(num_blocks),
                            .block_bytes = block_bytes,
                            .block_size = kBlockSize,
                            .num_layers = 1,
                            .num_kv_heads = shape.kv_heads,
                            .head_dim = shape.head_dim,
                            .dtype = dtype};
    block_tables_.resize(num_blocks);
    std::iota(block_tables_.begin(), block_tables_.end(), 0);
    std::shuffle(block_tables_.begin(), block_tables_.end(), rng);
    num_tokens_ = batch * query_length;
    for (int32_t s = 0; s <= batch; ++s) query_start_.push_back(s * query_length);
    seq_lens_.assign(batch, context);
    for (int32_t s = 0; s < batch; ++s) {
      for (int32_t i = 0; i < query_length; ++i) positions_.push_back(context - query_length + i);
    }
    query_.resize(int64_t{num_tokens_} * shape.heads * shape.head_dim);
    for (float& value : query_) value = uniform(rng);
    output_.resize(query_.size());
    workspace_.resize(paged_attention_workspace_bytes(layout_, pool().num_threads()));
    arguments_ = PagedAttentionArguments{.query = query_.data(),
                                         .output = output_.data(),
                                         .query_row_stride = int64_t{shape.heads} * shape.head_dim,
                                         .cache = layout_,
                                         .layer = 0,
                                         .num_tokens = num_tokens_,
                                         .num_heads = shape.heads,
                                         .max_sequences = batch,
                                         .max_blocks_per_sequence = blocks_per_sequence,
                                         .num_sequences = &batch_,
                                         .query_start = query_start_.data(),
                                         .seq_lens = seq_lens_.data(),
                                         .block_tables = block_tables_.data(),
                                         .positions = positions_.data(),
                                         .workspace = workspace_.data(),
                                         .workspace_threads = pool().num_threads()};
  }

  const PagedAttentionArguments& arguments() const { return arguments_; }
  int32_t num_tokens() const { return num_tokens_; }
  // K and V bytes a decode step reads (each query token reads its whole context once).
  int64_t kv_bytes() const { return static_cast<int64_t>(storage_.size()); }

 private:
  std::vector<std::byte> storage_;
  PagedKvLayout layout_;
  int32_t batch_ = 0;
  int32_t num_tokens_ = 0;
  std::vector<int32_t> block_tables_, query_start_, seq_lens_, positions_;
  std::vector<float> query_, output_;
  std::vector<std::byte> workspace_;
  PagedAttentionArguments arguments_{};
};

void run_attention(benchmark::State& state, const LayerShape& shape, SimdPath path, int32_t batch,
                   int32_t context, int32_t query_length, DType dtype) {
  if (!simd_path_supported(path)) {
    state.SkipWithError("SIMD path not supported on this CPU");
    return;
  }
  const SimdPath previous = active_simd_path();
  set_simd_path_for_testing(path);
  AttentionStep step(shape, batch, context, query_length, dtype);
  device::HostStream stream(pool());
  for (auto _ : state) {
    paged_attention(stream, step.arguments());
    benchmark::ClobberMemory();
  }
  set_simd_path_for_testing(previous);
  state.counters["tokens_per_second"] = benchmark::Counter(
      static_cast<double>(step.num_tokens()) * state.iterations(), benchmark::Counter::kIsRate);
  if (query_length == 1) state.SetBytesProcessed(step.kv_bytes() * state.iterations());
  state.counters["threads"] = pool().num_threads();
}

// Arguments: path, batch, context, dtype (0 = f32, 1 = f16).
void BM_PagedAttentionDecode(benchmark::State& state) {
  run_attention(state, kLlama3Layer, static_cast<SimdPath>(state.range(0)),
                static_cast<int32_t>(state.range(1)), static_cast<int32_t>(state.range(2)), 1,
                state.range(3) == 1 ? DType::kF16 : DType::kF32);
}

// Arguments: path, dtype. One sequence, 256 query tokens, causal over itself.
void BM_PagedAttentionPrefill(benchmark::State& state) {
  run_attention(state, kLlama3Layer, static_cast<SimdPath>(state.range(0)), 1, 256, 256,
                state.range(1) == 1 ? DType::kF16 : DType::kF32);
}

// Arguments: path, dtype. The base preset's layer: one 512-token prompt, causal over itself
// (what `folio bench --prompt-len 512` runs per layer).
void BM_PagedAttentionPrefillBase(benchmark::State& state) {
  run_attention(state, kBaseLayer, static_cast<SimdPath>(state.range(0)), 1, 512, 512,
                state.range(1) == 1 ? DType::kF16 : DType::kF32);
}

// Arguments: path, dtype. The base preset's layer: batch-1 decode at context 512.
void BM_PagedAttentionDecodeBase(benchmark::State& state) {
  run_attention(state, kBaseLayer, static_cast<SimdPath>(state.range(0)), 1, 512, 1,
                state.range(1) == 1 ? DType::kF16 : DType::kF32);
}

// Arguments: batch, context, dtype. Streams the bytes a decode step's K/V occupy, split over
// the pool like attention, with the best SIMD path.
void BM_KvReadBaseline(benchmark::State& state) {
  const int64_t element_bytes = state.range(2) == 1 ? 2 : 4;
  const int64_t bytes = state.range(0) * state.range(1) * 2 * kKvHeads * kHeadDim * element_bytes;
  std::vector<float> buffer(static_cast<size_t>(bytes / 4), 0.5f);
  const VectorOps& ops = vector_ops_for(best_simd_path());
  const int64_t num_tasks = pool().num_threads();
  std::vector<float> partial(num_tasks);
  for (auto _ : state) {
    pool().parallel_for(num_tasks, [&](int64_t task, int) {
      const int64_t chunk = (static_cast<int64_t>(buffer.size()) + num_tasks - 1) / num_tasks;
      const int64_t begin = task * chunk;
      const int64_t end = std::min<int64_t>(buffer.size(), begin + chunk);
      partial[task] = ops.sum_squares(buffer.data() + begin, end - begin);
    });
    benchmark::DoNotOptimize(partial.data());
  }
  state.SetBytesProcessed(bytes * state.iterations());
}

void decode_arguments(benchmark::internal::Benchmark* benchmark) {
  for (int64_t path : {0, 1, 2}) {
    for (int64_t dtype : {1, 0}) {
      for (int64_t batch : {1, 8, 32}) {
        for (int64_t context : {128, 1024}) benchmark->Args({path, batch, context, dtype});
      }
    }
  }
}

BENCHMARK(BM_PagedAttentionDecode)
    ->Apply(decode_arguments)
    ->ArgNames({"path", "batch", "context", "f16"})
    ->UseRealTime();
BENCHMARK(BM_PagedAttentionPrefill)
    ->ArgsProduct({{0, 1, 2}, {1, 0}})
    ->ArgNames({"path", "f16"})
    ->UseRealTime();
BENCHMARK(BM_PagedAttentionPrefillBase)
    ->ArgsProduct({{0, 1, 2}, {1, 0}})
    ->ArgNames({"path", "f16"})
    ->UseRealTime();
BENCHMARK(BM_PagedAttentionDecodeBase)
    ->ArgsProduct({{0, 1, 2}, {1, 0}})
    ->ArgNames({"path", "f16"})
    ->UseRealTime();
BENCHMARK(BM_KvReadBaseline)
    ->ArgsProduct({{1, 8, 32}, {128, 1024}, {1, 0}})
    ->ArgNames({"batch", "context", "f16"})
    ->UseRealTime();

}  // namespace
}  // namespace folio::kernels::cpu

BENCHMARK_MAIN();
