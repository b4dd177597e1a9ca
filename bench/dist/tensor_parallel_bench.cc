// Tensor parallelism against one process, in the same run (issue 15, slice 4): the generated
// model of pipeline_bench.cc (8 layers, hidden 512, 8 heads of 64 over 4 KV heads, FFN 1536,
// vocabulary 4096, f16 weights, f16 KV) run
//   BM_TensorParallelStep/local:      whole, by one PipelineStage of 2 threads (no group);
//   BM_TensorParallelStep/in_process: as two ranks of 1 thread each, in this process, over the
//                                     in-process group (what the split costs without a wire);
//   BM_TensorParallelStep/gloo:       the same two ranks over a gloo group on loopback (members
//                                     as threads of this process);
//   BM_TensorParallelStep/tp2:        two ranks on two WorkerServices in this process, driven by
//                                     a TensorParallelStepRunner over gRPC, ranks over gloo.
// Argument 0: tokens per step: 1 (a decode token after 63 cached) or 64 (a prefill chunk).
// Counters: seconds per token, seconds in collectives per token (rank 0's, waiting for the
// other rank included), and for tp2 the coordinator's gRPC bytes per token. The all-reduces
// reduce 2 x 8 layers x 512 f32 = 32 KiB per token, which in a ring of two each rank sends
// whole once. Ranks run on threads started per step (in_process, gloo): the cost of starting a
// thread is in their figures, as it is in the runner's.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include "bench_model.h"
#include "folio/base/check.h"
#include "folio/base/log.h"
#include "folio/base/random.h"
#include "folio/dist/gloo_collectives.h"
#include "folio/dist/in_process_collectives.h"
#include "folio/dist/tensor_parallel_step_runner.h"
#include "folio/dist/worker_service.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/model/llama_model.h"
#include "testing/collective_groups.h"

namespace folio::dist {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kContext = 128;
constexpr int32_t kBlocksPerSequence = kContext / kBlockSize;

PipelineStageSpec whole_spec(int64_t rank, int64_t ranks) {
  PipelineStageSpec spec;
  spec.first_layer = 0;
  spec.end_layer = 8;
  spec.num_kv_blocks = kBlocksPerSequence + 4;
  spec.block_size = kBlockSize;
  spec.max_blocks_per_sequence = kBlocksPerSequence;
  spec.kv_dtype = DType::kF16;
  spec.first_dummy_block = kBlocksPerSequence;
  spec.num_dummy_blocks = 4;
  spec.bucket_ladder = {1, 2, 4, 8, 16, 32, 64};
  spec.max_sequences = 1;
  spec.pool_bytes = int64_t{64} << 20;
  spec.tensor_rank = rank;
  spec.tensor_ranks = ranks;
  return spec;
}

struct TensorParallelBench {
  // An 8-layer f16 model (bench_model.h), its directory and identity.
  folio::testing::RandomModelFile model_file;
  const std::string& path = model_file.path;
  const ModelIdentity& identity = model_file.identity;
  const folio::testing::TemporaryDirectory& directory = model_file.directory;
  std::unique_ptr<model::LlamaModel> packed;    // one process, as the engine loads it
  std::unique_ptr<model::LlamaModel> unpacked;  // what ranks slice
  std::unique_ptr<PipelineStage> whole;
  std::vector<std::unique_ptr<PipelineStage>> in_process;
  std::vector<std::unique_ptr<PipelineStage>> gloo;
  std::vector<std::unique_ptr<WorkerService>> services;
  std::unique_ptr<TensorParallelStepRunner> runner;

  TensorParallelBench() : model_file(bench_model_shape(kContext), 7, "bench-model.gguf") {
    log::set_log_level("warn").ignore();
    packed = model::LlamaModel::open(path).value();
    unpacked = model::LlamaModel::open(path, {.pack_q8_0_panels = false}).value();
    whole = PipelineStage::create(*packed, whole_spec(0, 1), 2).value();

    std::vector<std::unique_ptr<Collectives>> members =
        make_in_process_group(2, std::chrono::seconds(30)).value();
    for (int64_t r = 0; r < 2; ++r) {
      in_process.push_back(PipelineStage::create(*unpacked, whole_spec(r, 2), 1,
                                                 std::move(members[static_cast<size_t>(r)]))
                               .value());
    }
    const std::string store = directory.path() + "/gloo";
    std::filesystem::create_directory(store);
    std::vector<std::unique_ptr<Collectives>> gloo_members(2);
    std::vector<std::thread> joining;
    for (int r = 0; r < 2; ++r) {
      joining.emplace_back([&, r] {
        gloo_members[static_cast<size_t>(r)] =
            connect_gloo_group(GlooGroupOptions{.rank = r,
                                                .size = 2,
                                                .store_directory = store,
                                                .store_address = {},
                                                .group_id = "bench",
                                                .epoch = 1,
                                                .host = "127.0.0.1",
                                                .timeout = std::chrono::seconds(30)})
                .value();
      });
    }
    for (std::thread& thread : joining) thread.join();
    for (int64_t r = 0; r < 2; ++r) {
      gloo.push_back(PipelineStage::create(*unpacked, whole_spec(r, 2), 1,
                                           std::move(gloo_members[static_cast<size_t>(r)]))
                         .value());
    }

    std::vector<std::unique_ptr<WorkerClient>> clients;
    for (int i = 0; i < 2; ++i) {
      WorkerServiceOptions options;
      options.threads = 1;
      options.model = identity;
      options.model_path = path;
      services.push_back(WorkerService::start(options).value());
      clients.push_back(WorkerClient::connect(services.back()->address(), identity).value());
    }
    PipelineStageSpec spec = whole_spec(0, 1);
    spec.collective_store = directory.path() + "/tp2";
    std::filesystem::create_directory(spec.collective_store);
    runner = TensorParallelStepRunner::create(std::move(clients), spec, identity.hash).value();
  }
};

TensorParallelBench& bench() {
  static TensorParallelBench instance;
  return instance;
}

struct StepArrays {
  std::vector<int32_t> token_ids, positions, slots, query_start, seq_lens, block_tables, logits;
  explicit StepArrays(int32_t tokens) {
    const int32_t first = 64 - tokens;
    for (int32_t i = 0; i < tokens; ++i) {
      token_ids.push_back((i * 131 + 7) % 4096);
      positions.push_back(first + i);
      slots.push_back(first + i);
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

enum class Mode { kLocal, kInProcess, kGloo, kWorkers };

// Both ranks at once, rank 1 on a thread of its own.
void run_ranks(std::vector<std::unique_ptr<PipelineStage>>& ranks, const ir::StepBatch& step) {
  Status other;
  std::thread rank1([&] { other = ranks[1]->run(step, {}).status(); });
  const Status own = ranks[0]->run(step, {}).status();
  rank1.join();
  FOLIO_CHECK(own.ok() && other.ok(), "{} / {}", own, other);
}

void BM_TensorParallelStep(benchmark::State& state, Mode mode) {
  const auto tokens = static_cast<int32_t>(state.range(0));
  const StepArrays arrays(tokens);
  const ir::StepBatch step = arrays.batch();
  TensorParallelBench& setup = bench();
  auto communication_ns = [&]() -> int64_t {
    switch (mode) {
      case Mode::kLocal:
        return 0;
      case Mode::kInProcess:
        return setup.in_process[0]->communication().nanoseconds;
      case Mode::kGloo:
        return setup.gloo[0]->communication().nanoseconds;
      case Mode::kWorkers:
        return setup.runner->traffic().communication_ns;
    }
    return 0;
  };
  const int64_t communication_before = communication_ns();
  const TensorParallelTraffic traffic_before = setup.runner->traffic();
  for (auto _ : state) {
    switch (mode) {
      case Mode::kLocal:
        FOLIO_CHECK(setup.whole->run(step, {}).ok());
        break;
      case Mode::kInProcess:
        run_ranks(setup.in_process, step);
        break;
      case Mode::kGloo:
        run_ranks(setup.gloo, step);
        break;
      case Mode::kWorkers: {
        Result<ir::StepOutput> output = setup.runner->run(step);
        FOLIO_CHECK(output.ok(), "{}", output.status());
        break;
      }
    }
  }
  const auto processed = static_cast<double>(state.iterations()) * tokens;
  state.counters["seconds_per_token"] =
      benchmark::Counter(processed, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["collective_seconds_per_token"] =
      static_cast<double>(communication_ns() - communication_before) * 1e-9 / processed;
  if (mode == Mode::kWorkers) {
    const TensorParallelTraffic& after = setup.runner->traffic();
    state.counters["grpc_bytes_per_token"] =
        static_cast<double>(after.request_bytes - traffic_before.request_bytes + after.reply_bytes -
                            traffic_before.reply_bytes) /
        processed;
  }
}

void BM_TensorParallelStepLocal(benchmark::State& state) {
  BM_TensorParallelStep(state, Mode::kLocal);
}
void BM_TensorParallelStepInProcess(benchmark::State& state) {
  BM_TensorParallelStep(state, Mode::kInProcess);
}
void BM_TensorParallelStepGloo(benchmark::State& state) {
  BM_TensorParallelStep(state, Mode::kGloo);
}
void BM_TensorParallelStepTp2(benchmark::State& state) {
  BM_TensorParallelStep(state, Mode::kWorkers);
}

BENCHMARK(BM_TensorParallelStepLocal)
    ->Arg(1)
    ->Arg(64)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TensorParallelStepInProcess)
    ->Arg(1)
    ->Arg(64)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TensorParallelStepGloo)->Arg(1)->Arg(64)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TensorParallelStepTp2)->Arg(1)->Arg(64)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace folio::dist
