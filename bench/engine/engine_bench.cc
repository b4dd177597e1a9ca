// Engine throughput at concurrency 1, 8, 32 and 64 and the batching gain, with the toy model
// (toy_step_runner.h): these figures are the engine's own overhead per token (scheduling, step
// layout, sampling over a 32000-token vocabulary, bookkeeping), not model throughput. The real
// model registers its own RunnerFactory with the same harness.
#include "engine_bench_util.h"
#include "testing/toy_step_runner.h"

namespace {

folio::engine::bench::RunnerFactory toy_factory() {
  folio::engine::bench::RunnerFactory factory;
  factory.name = "toy";
  factory.geometry = {16, 1, 1, 4, folio::DType::kF32};
  factory.vocab_size = 32000;
  factory.make = [](const folio::kv::KvLayoutNumbers& layout,
                    bool) -> folio::Result<std::unique_ptr<folio::engine::StepRunner>> {
    FOLIO_ASSIGN_OR_RETURN(auto runner,
                           folio::engine::testing::ToyStepRunner::create(layout, 32000));
    return std::unique_ptr<folio::engine::StepRunner>(std::move(runner));
  };
  return factory;
}

}  // namespace

int main(int argc, char** argv) {
  folio::engine::bench::register_engine_benchmarks(toy_factory());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
