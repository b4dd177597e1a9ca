// The weight cache (issue 15, slice 5) against the model file, in the same run: the time to
// prepare the stage of layers [0, 4) of a generated model (8 layers, hidden 512, FFN 1536,
// vocabulary 4096, f16 weights: the stage's tensors are about 31 MB) on a freshly started
// WorkerService in this process, handshake included,
//   BM_PrepareStage/file:  a worker holding the model file (-m): it maps the file;
//   BM_PrepareStage/cold:  a worker without it, its cache empty: the shard is offered, all of
//                          it streamed over loopback gRPC, stored (fsync'd), then read back
//                          verified to build the stage;
//   BM_PrepareStage/warm:  the same worker started again on that cache: every entry is verified
//                          at the offer, nothing is streamed, the stage is built from the cache.
// The coordinator's manifest (hashing the stage's tensors once per layer range) is made before
// the timing and measured apart: BM_ShardManifest. Counters: bytes fetched per prepare.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "bench_model.h"
#include "folio/base/log.h"
#include "folio/base/random.h"
#include "folio/dist/pipeline_step_runner.h"
#include "folio/dist/shard_source.h"
#include "folio/dist/worker_service.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/model/llama_model_file.h"
#include "testing/collective_groups.h"

namespace folio::dist {
namespace {

struct CacheBench {
  // An 8-layer f16 model (bench_model.h), its directory and identity.
  folio::testing::RandomModelFile model_file;
  const std::string& path = model_file.path;
  const ModelIdentity& identity = model_file.identity;
  const folio::testing::TemporaryDirectory& directory = model_file.directory;
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<ShardSource> source;

  CacheBench() : model_file(bench_model_shape(128), 7, "bench-model.gguf") {
    log::set_log_level("warn").ignore();
    file = std::make_unique<gguf::GgufFile>(gguf::GgufFile::open(path).value());
    source = std::make_unique<ShardSource>(*file, identity.hash);
    FOLIO_CHECK(source->manifest(model::LlamaShard{0, 4}).ok(), "manifest");
  }

  static PipelineStageSpec spec() {
    PipelineStageSpec spec;
    spec.first_layer = 0;
    spec.end_layer = 4;
    spec.num_kv_blocks = 12;
    spec.block_size = 16;
    spec.max_blocks_per_sequence = 8;
    spec.kv_dtype = DType::kF16;
    spec.first_dummy_block = 8;
    spec.num_dummy_blocks = 4;
    spec.bucket_ladder = {1, 2, 4, 8};
    spec.max_sequences = 1;
    spec.use_graphs = false;  // the stage's capture is the same work in every mode
    spec.pool_bytes = int64_t{16} << 20;
    return spec;
  }
};

CacheBench& bench() {
  static CacheBench instance;
  return instance;
}

enum class Source { kFile, kCold, kWarm };

void BM_PrepareStage(benchmark::State& state, Source mode) {
  CacheBench& setup = bench();
  const std::string cache = setup.directory.path() + "/cache";
  int64_t fetched = 0;
  for (auto _ : state) {
    state.PauseTiming();
    if (mode == Source::kCold) std::filesystem::remove_all(cache);
    state.ResumeTiming();
    WorkerServiceOptions options;
    options.threads = 2;
    if (mode == Source::kFile) {
      options.model = setup.identity;
      options.model_path = setup.path;
    } else {
      options.cache_directory = cache;
    }
    std::unique_ptr<WorkerService> service = WorkerService::start(options).value();
    std::unique_ptr<WorkerClient> client =
        WorkerClient::connect(service->address(), setup.identity).value();
    ShardTransfer transfer;
    Result<PreparedStage> prepared =
        prepare_stage_with_weights(*client, setup.source.get(), CacheBench::spec(),
                                   setup.identity.hash, kFirstEpoch, &transfer);
    FOLIO_CHECK(prepared.ok(), "{}", prepared.status().to_string());
    fetched += transfer.bytes_fetched;
  }
  state.counters["fetched_bytes_per_prepare"] =
      static_cast<double>(fetched) / static_cast<double>(state.iterations());
}

void BM_ShardManifest(benchmark::State& state) {
  CacheBench& setup = bench();
  for (auto _ : state) {
    Result<ShardManifest> manifest =
        make_shard_manifest(*setup.file, setup.identity.hash, model::LlamaShard{0, 4});
    benchmark::DoNotOptimize(manifest);
  }
}

// Warm after cold: the cache the warm runs find is the one the last cold run filled.
BENCHMARK_CAPTURE(BM_PrepareStage, file, Source::kFile)->Iterations(8)->UseRealTime();
BENCHMARK_CAPTURE(BM_PrepareStage, cold, Source::kCold)->Iterations(8)->UseRealTime();
BENCHMARK_CAPTURE(BM_PrepareStage, warm, Source::kWarm)->Iterations(8)->UseRealTime();
BENCHMARK(BM_ShardManifest)->Iterations(8)->UseRealTime();

}  // namespace
}  // namespace folio::dist
