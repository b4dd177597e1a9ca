// Cost of metric updates on hot paths and of rendering, each beside a baseline measured in the
// same run: a relaxed fetch_add on a plain atomic integer (the cheapest possible counter).
#include <atomic>
#include <cstdint>
#include <string>

#include <benchmark/benchmark.h>

#include "folio/base/metrics.h"

namespace folio::metrics {
namespace {

// Baseline: what a counter costs at the least.
void BM_AtomicIntegerIncrement(benchmark::State& state) {
  static std::atomic<uint64_t> value{0};
  for (auto _ : state) value.fetch_add(1, std::memory_order_relaxed);
  benchmark::DoNotOptimize(value.load());
}
BENCHMARK(BM_AtomicIntegerIncrement)->Threads(1)->Threads(2);

void BM_CounterIncrement(benchmark::State& state) {
  static Registry registry;
  static Counter* counter = registry.counter("bench_counter", "Bench.").value();
  for (auto _ : state) counter->increment();
  benchmark::DoNotOptimize(counter->value());
}
BENCHMARK(BM_CounterIncrement)->Threads(1)->Threads(2);

void BM_GaugeSet(benchmark::State& state) {
  Registry registry;
  Gauge* gauge = registry.gauge("bench_gauge", "Bench.").value();
  double value = 0;
  for (auto _ : state) gauge->set(value += 1);
  benchmark::DoNotOptimize(gauge->value());
}
BENCHMARK(BM_GaugeSet);

void BM_HistogramObserve(benchmark::State& state) {
  Registry registry;
  Histogram* histogram =
      registry.histogram("bench_histogram", "Bench.", exponential_buckets(1e-6, 2, 24)).value();
  double value = 1e-6;
  for (auto _ : state) {
    histogram->observe(value);
    value = value > 10 ? 1e-6 : value * 1.7;  // walks every bucket
  }
  benchmark::DoNotOptimize(histogram->count());
}
BENCHMARK(BM_HistogramObserve);

// Render of a registry the size a server has: state.range(0) series per type.
void BM_Render(benchmark::State& state) {
  Registry registry;
  for (int64_t i = 0; i < state.range(0); ++i) {
    const Labels labels = {{"model", "llama"}, {"adapter", std::to_string(i)}};
    registry.counter("bench_requests", "Requests.", labels).value()->increment(i);
    registry.gauge("bench_running", "Running.", labels).value()->set(i);
    registry.histogram("bench_latency", "Latency.", exponential_buckets(1e-3, 2, 12), labels)
        .value()
        ->observe(0.1);
  }
  size_t bytes = 0;
  for (auto _ : state) bytes = registry.render().size();
  state.counters["bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_Render)->Arg(10)->Arg(100);

}  // namespace
}  // namespace folio::metrics

BENCHMARK_MAIN();
