// Pipeline parallelism over loopback, against one process, in the same run: a generated model
// (8 layers, hidden 512, 8 heads of 64 over 4 KV heads, FFN 1536, vocabulary 4096, f16
// weights, f16 KV) run
//   BM_PipelineStep/local: whole, by one PipelineStage in this process (no gRPC);
//   BM_PipelineStep/chained: as layers [0, 4) and [4, 8) by two PipelineStages in this process,
//                          the residual stream handed over in memory (what stages cost without
//                          the wire);
//   BM_PipelineStep/pp2:   the same two stages on two WorkerServices in this process, relayed
//                          by a PipelineStepRunner over loopback gRPC.
// Argument 0: tokens per step: 1 (one decode token of a sequence with 63 tokens cached) or 64
// (a 64-token prefill chunk). Both run captured programs (replayed after the first step). The
// counters give the time per token and, for pp2, the bytes on the wire per token (both
// directions, serialized messages). The workers share this process's cores, so pp2 pays the
// whole model's compute plus two gRPC round trips per step: what the pipeline adds.
#include <benchmark/benchmark.h>

#include <fstream>
#include <memory>
#include <vector>

#include "bench_model.h"
#include "folio/base/check.h"
#include "folio/base/log.h"
#include "folio/base/random.h"
#include "folio/dist/pipeline_step_runner.h"
#include "folio/dist/worker_service.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/model/llama_model.h"
#include "testing/collective_groups.h"

namespace folio::dist {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kContext = 128;
constexpr int32_t kBlocksPerSequence = kContext / kBlockSize;
constexpr int32_t kThreads = 2;

struct PipelineBench {
  // An 8-layer f16 model (bench_model.h), its directory and identity.
  folio::testing::RandomModelFile model_file;
  const std::string& path = model_file.path;
  const ModelIdentity& identity = model_file.identity;
  const folio::testing::TemporaryDirectory& directory = model_file.directory;
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<PipelineStage> whole;
  std::unique_ptr<PipelineStage> first_half;
  std::unique_ptr<PipelineStage> second_half;
  std::vector<std::unique_ptr<WorkerService>> services;
  std::unique_ptr<PipelineStepRunner> runner;

  PipelineBench() : model_file(bench_model_shape(kContext), 7, "bench-model.gguf") {
    log::set_log_level("warn").ignore();
    model = model::LlamaModel::open(path).value();
    whole = PipelineStage::create(*model, spec(0, 8), kThreads).value();
    first_half = PipelineStage::create(*model, spec(0, 4), kThreads).value();
    second_half = PipelineStage::create(*model, spec(4, 8), kThreads).value();
    std::vector<std::unique_ptr<WorkerClient>> clients;
    for (int i = 0; i < 2; ++i) {
      WorkerServiceOptions options;
      options.threads = kThreads;
      options.model = identity;
      options.model_path = path;
      services.push_back(WorkerService::start(options).value());
      clients.push_back(WorkerClient::connect(services.back()->address(), identity).value());
    }
    runner = PipelineStepRunner::create(std::move(clients), {spec(0, 4), spec(4, 8)}, identity.hash)
                 .value();
  }

  static PipelineStageSpec spec(int64_t first, int64_t end) {
    PipelineStageSpec spec;
    spec.first_layer = first;
    spec.end_layer = end;
    spec.num_kv_blocks = kBlocksPerSequence + 4;  // one sequence, then the padding blocks
    spec.block_size = kBlockSize;
    spec.max_blocks_per_sequence = kBlocksPerSequence;
    spec.kv_dtype = DType::kF16;
    spec.first_dummy_block = kBlocksPerSequence;
    spec.num_dummy_blocks = 4;
    spec.bucket_ladder = {1, 2, 4, 8, 16, 32, 64};
    spec.max_sequences = 1;
    spec.pool_bytes = int64_t{64} << 20;
    return spec;
  }
};

PipelineBench& bench() {
  static PipelineBench instance;
  return instance;
}

// One sequence: `tokens` query tokens ending at position 63 (the cache before them is whatever
// earlier iterations left, which changes the values, not the work).
struct StepArrays {
  std::vector<int32_t> token_ids, positions, slots, query_start, seq_lens, block_tables, logits;
  explicit StepArrays(int32_t tokens) {
    const int32_t first = 64 - tokens;
    for (int32_t i = 0; i < tokens; ++i) {
      token_ids.push_back((i * 131 + 7) % 4096);
      positions.push_back(first + i);
      slots.push_back(first + i);  // block b of the table is block b
    }
    query_start = {0, tokens};
    seq_lens = {64};
    for (int32_t b = 0; b < kBlocksPerSequence; ++b) block_tables.push_back(b);
    logits = {tokens - 1};
  }
  ir::StepBatch batch() const {
    return ir::StepBatch{token_ids,    positions, slots, query_start,        seq_lens,
                         block_tables, logits,    {},    kBlocksPerSequence, {}};
  }
};

enum class Mode { kLocal, kChained, kPipelined };

Result<ir::StepOutput> run_step(PipelineBench& setup, Mode mode, const ir::StepBatch& step) {
  switch (mode) {
    case Mode::kLocal:
      return setup.whole->run(step, {});
    case Mode::kChained: {
      FOLIO_ASSIGN_OR_RETURN(const ir::StepOutput first, setup.first_half->run(step, {}));
      return setup.second_half->run(step, first.hidden);
    }
    case Mode::kPipelined:
      return setup.runner->run(step);
  }
  return internal_error("unknown mode");
}

void BM_PipelineStep(benchmark::State& state, Mode mode) {
  const bool pipelined = mode == Mode::kPipelined;
  const auto tokens = static_cast<int32_t>(state.range(0));
  const StepArrays arrays(tokens);
  const ir::StepBatch step = arrays.batch();
  PipelineBench& setup = bench();
  const PipelineTraffic before = setup.runner->traffic();
  for (auto _ : state) {
    Result<ir::StepOutput> output = run_step(setup, mode, step);
    FOLIO_CHECK(output.ok(), "{}", output.status());
    benchmark::DoNotOptimize(output->logits.data());
  }
  const auto processed = static_cast<double>(state.iterations()) * tokens;
  // Seconds per token (printed with SI prefixes: 1.5m is 1.5 ms).
  state.counters["seconds_per_token"] =
      benchmark::Counter(processed, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  if (pipelined) {
    const PipelineTraffic& after = setup.runner->traffic();
    const auto bytes = static_cast<double>((after.request_bytes - before.request_bytes) +
                                           (after.reply_bytes - before.reply_bytes));
    state.counters["wire_bytes_per_token"] = bytes / processed;
  }
}

void BM_PipelineStepLocal(benchmark::State& state) {
  BM_PipelineStep(state, Mode::kLocal);
}
void BM_PipelineStepChained(benchmark::State& state) {
  BM_PipelineStep(state, Mode::kChained);
}
void BM_PipelineStepPp2(benchmark::State& state) {
  BM_PipelineStep(state, Mode::kPipelined);
}

BENCHMARK(BM_PipelineStepLocal)->Arg(1)->Arg(64)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PipelineStepChained)->Arg(1)->Arg(64)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PipelineStepPp2)->Arg(1)->Arg(64)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace folio::dist
