// Engine throughput benchmarks over any StepRunner: closed-loop load at a fixed concurrency
// (each finished request is replaced at once until the iteration's requests are done), greedy,
// EOS ignored, so every request generates exactly its max_tokens.
//
// A RunnerFactory says how to build a runner over a KV layout; register_engine_benchmarks()
// registers, per factory:
//   engine_throughput/<name>/graphs:<0|1>/concurrency:<1|8|32|64>   tokens_per_second
//   engine_batching_gain/<name>/graphs:<0|1>   gain = tokens/s at 32 / tokens/s at 1, both
//                                              measured in the same iteration
//   engine_graph_gain/<name>                   tokens/s at 32 with graphs / without (only for
//                                              factories with a graph mode)
// Every throughput benchmark also reports engine_us_per_token: wall time outside
// StepRunner::run (scheduling, step layout, sampling, detokenizing, bookkeeping) per generated
// token, measured by timing the runner in the same run. The toy factory (engine_bench.cc) makes
// that the interesting number; the real model's factory is wired where the model and executor
// layers are available.
#pragma once

#include <benchmark/benchmark.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "folio/engine/engine.h"
#include "folio/kv/block_copier.h"
#include "folio/kv/block_manager.h"
#include "folio/kv/fixed_page_source.h"

namespace folio::engine::bench {

struct RunnerFactory {
  std::string name;
  ir::KvCacheGeometry geometry;
  int32_t vocab_size = 0;
  bool has_graph_mode = false;  // whether `graphs` changes anything
  // Builds a runner whose attention reads the KV cache at `layout`.
  std::function<Result<std::unique_ptr<StepRunner>>(const kv::KvLayoutNumbers& layout, bool graphs)>
      make;
};

struct LoadShape {
  int32_t prompt_tokens = 64;
  int32_t max_tokens = 64;
  int32_t requests_per_slot = 3;  // requests per iteration = concurrency * this (at least 8)
};

// Forwards to a runner and adds up the wall time spent in it.
class TimedRunner final : public StepRunner {
 public:
  explicit TimedRunner(std::unique_ptr<StepRunner> inner) : inner_(std::move(inner)) {}
  Result<ir::StepOutput> run(const ir::StepBatch& step) override {
    const auto start = std::chrono::steady_clock::now();
    Result<ir::StepOutput> output = inner_->run(step);
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return output;
  }
  int32_t vocab_size() const override { return inner_->vocab_size(); }
  bool supports_adapter(int64_t adapter_id) const override {
    return inner_->supports_adapter(adapter_id);
  }
  double seconds() const { return seconds_; }

 private:
  std::unique_ptr<StepRunner> inner_;
  double seconds_ = 0.0;
};

// One engine with a KV cache big enough for `concurrency` requests of `shape` at once.
class BenchEngine {
 public:
  BenchEngine(const RunnerFactory& factory, bool graphs, int32_t concurrency,
              const LoadShape& shape)
      : shape_(shape), concurrency_(concurrency) {
    kv::BlockManagerOptions kv_options;
    kv_options.geometry = factory.geometry;
    kv_options.max_context_tokens = shape.prompt_tokens + shape.max_tokens + 1;
    kv_options.watermark = 0.01;
    const int64_t block_bytes = factory.geometry.block_bytes();
    const int64_t blocks_per_sequence =
        (kv_options.max_context_tokens + factory.geometry.block_size - 1) /
        factory.geometry.block_size;
    const int64_t blocks = blocks_per_sequence * concurrency * 2 + 16;
    const int32_t blocks_per_page = 16;
    source_ = std::make_unique<kv::FixedPageSource>(
        block_bytes * blocks_per_page, static_cast<int32_t>(blocks / blocks_per_page + 1));
    manager_ = std::move(kv::BlockManager::create(kv_options, *source_, copier_).value());
    runner_ =
        std::make_unique<TimedRunner>(std::move(factory.make(manager_->layout(), graphs).value()));
    EngineOptions options;
    options.scheduler.max_num_sequences = std::max(concurrency, 1);
    options.scheduler.max_num_batched_tokens = std::max(512, concurrency);
    EngineParts parts;
    parts.block_manager = manager_.get();
    parts.runner = runner_.get();
    engine_ = std::move(Engine::create(options, parts).value());
  }

  // Runs one closed-loop batch of requests to the end; returns the tokens generated.
  int64_t run_batch(uint64_t seed) {
    const int32_t total = std::max(8, concurrency_ * shape_.requests_per_slot);
    int32_t submitted = 0;
    int64_t generated = 0;
    std::function<void()> submit_one = [&] {
      Request request;
      for (int32_t index = 0; index < shape_.prompt_tokens; ++index) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        request.prompt.push_back(static_cast<int32_t>((seed >> 33) % 1000));
      }
      request.max_tokens = shape_.max_tokens;
      request.ignore_eos = true;
      request.sampling.temperature = 0.0f;
      request.on_finish = [&](const Completion& completion) {
        generated += completion.num_generated_tokens;
        if (submitted < total) submit_one();
      };
      ++submitted;
      (void)engine_->submit(std::move(request)).value();
    };
    for (int32_t slot = 0; slot < concurrency_ && submitted < total; ++slot) submit_one();
    engine_->run_until_idle();
    return generated;
  }

  double runner_seconds() const { return runner_->seconds(); }

 private:
  LoadShape shape_;
  int32_t concurrency_;
  std::unique_ptr<kv::FixedPageSource> source_;
  kv::HostKvBlockCopier copier_;
  std::unique_ptr<kv::BlockManager> manager_;
  std::unique_ptr<TimedRunner> runner_;
  std::unique_ptr<Engine> engine_;
};

inline void register_engine_benchmarks(const RunnerFactory& factory, LoadShape shape = {}) {
  std::vector<bool> graph_modes = {false};
  if (factory.has_graph_mode) graph_modes.push_back(true);
  for (bool graphs : graph_modes) {
    const std::string suffix = factory.name + "/graphs:" + (graphs ? "1" : "0");
    for (int32_t concurrency : {1, 8, 32, 64}) {
      benchmark::RegisterBenchmark(
          ("engine_throughput/" + suffix + "/concurrency:" + std::to_string(concurrency)).c_str(),
          [=](benchmark::State& state) {
            BenchEngine engine(factory, graphs, concurrency, shape);
            int64_t tokens = 0;
            uint64_t seed = 1;
            double seconds = 0.0;
            for (auto _ : state) {
              const auto start = std::chrono::steady_clock::now();
              tokens += engine.run_batch(seed++);
              seconds +=
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            }
            state.counters["tokens_per_second"] =
                benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
            state.counters["engine_us_per_token"] =
                (seconds - engine.runner_seconds()) * 1e6 / static_cast<double>(tokens);
          })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    benchmark::RegisterBenchmark(
        ("engine_batching_gain/" + suffix).c_str(),
        [=](benchmark::State& state) {
          BenchEngine single(factory, graphs, 1, shape);
          BenchEngine batched(factory, graphs, 32, shape);
          double single_seconds = 0.0;
          double batched_seconds = 0.0;
          int64_t single_tokens = 0;
          int64_t batched_tokens = 0;
          uint64_t seed = 1;
          for (auto _ : state) {
            auto start = std::chrono::steady_clock::now();
            single_tokens += single.run_batch(seed);
            auto middle = std::chrono::steady_clock::now();
            batched_tokens += batched.run_batch(seed++);
            auto end = std::chrono::steady_clock::now();
            single_seconds += std::chrono::duration<double>(middle - start).count();
            batched_seconds += std::chrono::duration<double>(end - middle).count();
          }
          state.counters["gain"] = (static_cast<double>(batched_tokens) / batched_seconds) /
                                   (static_cast<double>(single_tokens) / single_seconds);
        })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  if (factory.has_graph_mode) {
    benchmark::RegisterBenchmark(
        ("engine_graph_gain/" + factory.name).c_str(),
        [=](benchmark::State& state) {
          BenchEngine eager(factory, false, 32, shape);
          BenchEngine graphs(factory, true, 32, shape);
          double eager_seconds = 0.0;
          double graph_seconds = 0.0;
          int64_t eager_tokens = 0;
          int64_t graph_tokens = 0;
          uint64_t seed = 1;
          for (auto _ : state) {
            auto start = std::chrono::steady_clock::now();
            eager_tokens += eager.run_batch(seed);
            auto middle = std::chrono::steady_clock::now();
            graph_tokens += graphs.run_batch(seed++);
            auto end = std::chrono::steady_clock::now();
            eager_seconds += std::chrono::duration<double>(middle - start).count();
            graph_seconds += std::chrono::duration<double>(end - middle).count();
          }
          state.counters["gain"] = (static_cast<double>(graph_tokens) / graph_seconds) /
                                   (static_cast<double>(eager_tokens) / eager_seconds);
        })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
}

}  // namespace folio::engine::bench
