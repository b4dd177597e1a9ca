// The engine's own cost over a KV-parallel group against one block manager: the same
// closed-loop load (32 requests at a time of 96 prompt tokens + 32 greedy tokens) through an
// Engine whose runner returns zero logits at once, so the time is scheduling (per-member
// admission and appends through kv::KvCache), step layout (every member's slots and block
// tables) and sampling. Reports, from one iteration that runs both:
//   kv_parallel_engine_overhead/members:<P>   ratio = time over the group / time over one cache
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <vector>

#include "folio/engine/engine.h"
#include "folio/kv/block_copier.h"
#include "folio/kv/block_manager.h"
#include "folio/kv/fixed_page_source.h"
#include "folio/kv/kv_parallel_cache.h"

namespace folio::engine {
namespace {

constexpr int32_t kVocab = 256;
constexpr int32_t kBlockSize = 16;
constexpr int32_t kPromptTokens = 96;
constexpr int32_t kMaxTokens = 32;
constexpr int32_t kConcurrency = 32;
constexpr int32_t kRequests = 96;

// Zero logits for every row asked, without touching the KV cache.
class ZeroLogitsRunner final : public StepRunner {
 public:
  Result<ir::StepOutput> run(const ir::StepBatch& step) override {
    logits_.assign(static_cast<size_t>(step.num_logit_rows()) * kVocab, 0.0f);
    return ir::StepOutput{logits_, step.num_logit_rows(), kVocab, {}, 0};
  }
  int32_t vocab_size() const override { return kVocab; }

 private:
  std::vector<float> logits_;
};

// One engine over `members` caches (1: a plain block manager) of room for the whole load.
class Harness {
 public:
  explicit Harness(int32_t members) {
    const int32_t context = kPromptTokens + kMaxTokens;
    const int32_t tokens_per_member =
        (context / members + kBlockSize - 1) / kBlockSize * kBlockSize;
    kv::BlockManagerOptions options;
    options.geometry = ir::KvCacheGeometry{kBlockSize, 1, 1, 4, DType::kF32};
    options.max_context_tokens = members == 1 ? context : tokens_per_member;
    const int64_t blocks =
        int64_t{kConcurrency} * (options.max_context_tokens / kBlockSize + 1) * 2;
    for (int32_t member = 0; member < members; ++member) {
      sources_.push_back(std::make_unique<kv::FixedPageSource>(
          options.geometry.block_bytes() * 16, static_cast<int32_t>(blocks / 16 + 2)));
      managers_.push_back(
          std::move(kv::BlockManager::create(options, *sources_.back(), copier_).value()));
    }
    EngineParts parts;
    if (members == 1) {
      parts.block_manager = managers_.front().get();
    } else {
      std::vector<kv::BlockManager*> pointers;
      for (auto& manager : managers_) pointers.push_back(manager.get());
      cache_ = std::move(kv::KvParallelCache::create(pointers, tokens_per_member).value());
      parts.kv_parallel_cache = cache_.get();
    }
    parts.runner = &runner_;
    EngineOptions engine_options;
    engine_options.scheduler.max_num_sequences = kConcurrency;
    engine_options.scheduler.max_num_batched_tokens = 512;
    engine_ = std::move(Engine::create(engine_options, parts).value());
  }

  // Seconds to run the load to the end.
  double run(uint64_t seed) {
    generated_ = 0;
    int32_t submitted = 0;
    std::function<void()> submit_one = [&] {
      Request request;
      for (int32_t index = 0; index < kPromptTokens; ++index) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        request.prompt.push_back(static_cast<int32_t>((seed >> 33) % kVocab));
      }
      request.max_tokens = kMaxTokens;
      request.ignore_eos = true;
      request.sampling.temperature = 0.0f;
      request.on_finish = [&](const Completion& completion) {
        generated_ += completion.num_generated_tokens;
        if (completion.reason == FinishReason::kError) error_ = completion.error;
        if (submitted < kRequests) submit_one();
      };
      ++submitted;
      (void)engine_->submit(std::move(request)).value();
    };
    const auto start = std::chrono::steady_clock::now();
    for (int32_t slot = 0; slot < kConcurrency; ++slot) submit_one();
    engine_->run_until_idle();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  // Every request generated its max_tokens (else the timing measured refusals).
  bool complete() const { return error_.ok() && generated_ == int64_t{kRequests} * kMaxTokens; }
  const Status& error() const { return error_; }

 private:
  std::vector<std::unique_ptr<kv::FixedPageSource>> sources_;
  kv::HostKvBlockCopier copier_;
  std::vector<std::unique_ptr<kv::BlockManager>> managers_;
  std::unique_ptr<kv::KvParallelCache> cache_;
  ZeroLogitsRunner runner_;
  std::unique_ptr<Engine> engine_;
  int64_t generated_ = 0;
  Status error_;
};

void kv_parallel_engine_overhead(benchmark::State& state) {
  const auto members = static_cast<int32_t>(state.range(0));
  Harness single(1);
  Harness group(members);
  double single_seconds = 0.0;
  double group_seconds = 0.0;
  uint64_t seed = 1;
  for (auto _ : state) {
    single_seconds += single.run(seed);
    group_seconds += group.run(seed);
    ++seed;
    if (!single.complete() || !group.complete()) {
      state.SkipWithError(fmt::format("the load did not complete: {} / {}",
                                      single.error().to_string(), group.error().to_string())
                              .c_str());
      return;
    }
  }
  state.counters["ratio"] = group_seconds / single_seconds;
  state.counters["single_ms"] = 1e3 * single_seconds / static_cast<double>(state.iterations());
  state.counters["group_ms"] = 1e3 * group_seconds / static_cast<double>(state.iterations());
}
BENCHMARK(kv_parallel_engine_overhead)
    ->ArgName("members")
    ->Arg(2)
    ->Arg(4)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace folio::engine

BENCHMARK_MAIN();
