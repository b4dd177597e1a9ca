// Graph executor benchmarks on a small generated Llama-like model (random f16 weights in
// memory, 4 layers, hidden 256, 8 heads / 4 KV heads of 32, FFN 768, vocabulary 4096):
//
// - BM_DecodeStep/<mode>/<batch>: one decode step at batch 1, 8, 32, eager vs replayed.
// - BM_DecodeReplaySpeedup/<batch>: both modes interleaved in one loop; the counters give the
//   per-step times and eager / replay as a ratio measured in the same run.
// - BM_CaptureBucket/<tokens>/<phase>: capturing one bucket's program (graph building,
//   binding, planning, arena view, recording).
// - BM_LadderArenaMemory: the whole default ladder (decode and prefill) captured into one shared
//   arena vs one private arena per capture; physical bytes measured from the memfds.
//
// Not a test: nothing here asserts.
#include <benchmark/benchmark.h>

#include <time.h>

#include <chrono>

#include "exec_test_util.h"

namespace folio::exec {
namespace {

using testing::OwnedStep;
using testing::TestModelState;

testing::TestModelConfig small_model() {
  testing::TestModelConfig config;
  config.model.num_layers = 4;
  config.model.hidden_size = 256;
  config.model.num_heads = 8;  // head_dim 32
  config.model.num_kv_heads = 4;
  config.model.ffn_size = 768;
  config.model.vocab_size = 4096;
  config.model.weight_dtype = DType::kF16;
  config.num_blocks = 320;
  config.block_size = 16;
  config.max_blocks_per_sequence = 16;
  return config;
}

const TestModelState& model() {
  static const TestModelState state = TestModelState::create(small_model(), 42);
  return state;
}

int bench_threads() {
  return std::min(4, ThreadPool::default_num_threads());
}

// An executor of `mode` with `batch` sequences prefilled to 64 tokens, and the decode step it
// repeats (the same positions and slots every time, so the cache stays as it is).
struct DecodeSetup {
  ThreadPool pool{bench_threads()};
  testing::TestArena arena = testing::TestArena::create();
  testing::TestKvCache kv = model().fresh_kv();
  std::unique_ptr<Executor> executor;
  OwnedStep step;

  DecodeSetup(ExecutionMode mode, int32_t batch) {
    executor = std::move(testing::make_executor(model(), kv, pool, *arena.arena,
                                                testing::test_options(32, mode)))
                   .value();
    testing::StepGenerator generator(testing::GeneratorConfig::for_model(small_model(), 32), 7);
    for (int32_t started = 0; started < batch; started += 8) {  // prefill chunks of <= 512
      const std::vector<int32_t> prompts(static_cast<size_t>(std::min(8, batch - started)), 64);
      FOLIO_CHECK(executor->execute(generator.step(0, prompts).view()).ok());
    }
    step = generator.decode(batch);
    FOLIO_CHECK(executor->execute(step.view()).ok());  // captures the decode bucket
  }
  void run() {
    Result<ir::StepOutput> output = executor->execute(step.view());
    benchmark::DoNotOptimize(output);
  }
};

void BM_DecodeStep(benchmark::State& state) {
  const auto mode = static_cast<ExecutionMode>(state.range(0));
  DecodeSetup setup(mode, static_cast<int32_t>(state.range(1)));
  for (auto _ : state) setup.run();
  state.SetLabel(mode == ExecutionMode::kEager ? "eager" : "replay");
}
BENCHMARK(BM_DecodeStep)
    ->ArgNames({"mode", "batch"})
    ->ArgsProduct({{static_cast<int>(ExecutionMode::kEager),
                    static_cast<int>(ExecutionMode::kGraph)},
                   {1, 8, 32}})
    ->Unit(benchmark::kMicrosecond);

// Process CPU seconds: on a loaded machine wall time mostly measures waiting for a core.
double process_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

void BM_DecodeReplaySpeedup(benchmark::State& state) {
  const auto batch = static_cast<int32_t>(state.range(0));
  DecodeSetup eager(ExecutionMode::kEager, batch);
  DecodeSetup replay(ExecutionMode::kGraph, batch);
  double eager_wall = 0, replay_wall = 0, eager_cpu = 0, replay_cpu = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    const double start_cpu = process_cpu_seconds();
    eager.run();
    const auto middle = std::chrono::steady_clock::now();
    const double middle_cpu = process_cpu_seconds();
    replay.run();
    const auto end = std::chrono::steady_clock::now();
    const double end_cpu = process_cpu_seconds();
    eager_wall += std::chrono::duration<double>(middle - start).count();
    replay_wall += std::chrono::duration<double>(end - middle).count();
    eager_cpu += middle_cpu - start_cpu;
    replay_cpu += end_cpu - middle_cpu;
  }
  const double steps = static_cast<double>(state.iterations());
  state.counters["eager_cpu_us"] = eager_cpu / steps * 1e6;
  state.counters["replay_cpu_us"] = replay_cpu / steps * 1e6;
  state.counters["cpu_eager/replay"] = eager_cpu / replay_cpu;
  state.counters["wall_eager/replay"] = eager_wall / replay_wall;
}
BENCHMARK(BM_DecodeReplaySpeedup)
    ->ArgName("batch")
    ->Arg(1)
    ->Arg(8)
    ->Arg(32)
    ->Unit(benchmark::kMillisecond);

void BM_CaptureBucket(benchmark::State& state) {
  const auto tokens = static_cast<int32_t>(state.range(0));
  const std::array<ir::StepPhase, 1> phase = {static_cast<ir::StepPhase>(state.range(1))};
  ThreadPool pool(bench_threads());
  testing::TestKvCache kv = model().fresh_kv();
  ExecutorOptions options = testing::test_options(32, ExecutionMode::kGraph);
  options.bucket_ladder = {tokens};
  options.num_dummy_blocks = (tokens + 15) / 16;
  for (auto _ : state) {
    state.PauseTiming();
    auto arena = testing::TestArena::create();
    auto executor =
        std::move(testing::make_executor(model(), kv, pool, *arena.arena, options)).value();
    state.ResumeTiming();
    FOLIO_CHECK(std::move(executor->precapture(phase, 1e9)).value() == 1);
    state.PauseTiming();
    executor.reset();
    state.ResumeTiming();
  }
  state.SetLabel(ir::step_phase_name(phase[0]).data());
}
BENCHMARK(BM_CaptureBucket)
    ->ArgNames({"tokens", "phase"})
    ->ArgsProduct({{1, 8, 32, 128, 512},
                   {static_cast<int>(ir::StepPhase::kDecode),
                    static_cast<int>(ir::StepPhase::kPrefill)}})
    ->Unit(benchmark::kMillisecond);

void BM_LadderArenaMemory(benchmark::State& state) {
  ThreadPool pool(bench_threads());
  testing::TestKvCache kv = model().fresh_kv();
  const std::array<ir::StepPhase, 2> phases = {ir::StepPhase::kDecode, ir::StepPhase::kPrefill};
  ExecutorOptions options = testing::test_options(32, ExecutionMode::kGraph);
  for (auto _ : state) {
    auto shared = testing::TestArena::create(ArenaSharing::kShared);
    auto baseline = testing::TestArena::create(ArenaSharing::kPrivatePerView);
    int32_t captured = 0;
    for (MultiShapeArena* arena : {shared.arena.get(), baseline.arena.get()}) {
      auto executor = std::move(testing::make_executor(model(), kv, pool, *arena, options)).value();
      captured = std::move(executor->precapture(phases, 1e9)).value();
    }
    const double shared_bytes =
        static_cast<double>(std::move(shared.arena->measured_physical_bytes()).value());
    const double baseline_bytes =
        static_cast<double>(std::move(baseline.arena->measured_physical_bytes()).value());
    state.counters["captures"] = captured;
    state.counters["shared_MiB"] = shared_bytes / (1 << 20);
    state.counters["per_capture_MiB"] = baseline_bytes / (1 << 20);
    state.counters["per_capture/shared"] = baseline_bytes / shared_bytes;
    state.counters["virtual_MiB"] =
        static_cast<double>(shared.arena->stats().virtual_bytes) / (1 << 20);
  }
}
BENCHMARK(BM_LadderArenaMemory)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace folio::exec

BENCHMARK_MAIN();
