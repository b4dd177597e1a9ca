// Micro-benchmarks of bringing a LoRA adapter into use, per tier, against seed 001's targets
// (appendix C): load adapter hot < 100 us, warm < 1 ms, cold < 10 ms. Read here as:
// - hot: the adapter is in the pool already; a sequence acquires it, the step binds it to a
//   table slot, the sequence releases it (AdapterManager's engine-thread path);
// - warm: the same with the adapter in the warm tier (int8 on the heap, which the kernel reads
//   in place, so nothing is converted on the way);
// - cold: registered only; acquire starts the load on the loader thread (open and hash the
//   file, allocate pool pages or a heap buffer, convert to f16 or int8), wait_for_loads
//   publishes it, and a second acquire holds it. The file is in the OS page cache (it was just
//   written and registered), so this is a warm-disk read, never a device read.
// And the two parts of a cold load on their own: opening (map, hash, validate) and converting.
//
// Adapters: rank 16, f16, all seven projections of every layer, for two bases: 0 the `base`
// preset of folio make-model (hidden 768, 12 layers, ffn 2048, 4 KV heads: 5.0 MiB of f16
// weights) and 1 the shipped KJV model's shape (hidden 256, 4 layers, ffn 704: 0.6 MiB).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "folio/base/check.h"
#include "folio/device/host_virtual_memory.h"
#include "folio/exec/host_buffer.h"
#include "folio/lora/adapter_file.h"
#include "folio/lora/adapter_manager.h"
#include "folio/lora/adapter_writer.h"
#include "folio/memory/page_pool.h"

namespace folio::lora {
namespace {

constexpr int64_t kRank = 16;
constexpr int64_t kPoolPages = 128;  // 2 MiB each: room for 40 base-shape adapters

model::LlamaShape bench_shape(int64_t which) {
  model::LlamaShape shape;
  if (which == 0) {  // folio make-model --preset base
    shape.vocab_size = 32000;
    shape.hidden_size = 768;
    shape.num_layers = 12;
    shape.num_heads = 12;
    shape.num_kv_heads = 4;
    shape.ffn_size = 2048;
    shape.context_length = 2048;
  } else {  // models/demo/kjv-f16.gguf
    shape.vocab_size = 4096;
    shape.hidden_size = 256;
    shape.num_layers = 4;
    shape.num_heads = 8;
    shape.num_kv_heads = 4;
    shape.ffn_size = 704;
    shape.context_length = 256;
  }
  return shape;
}

// The adapter file of each shape, written once into a directory removed at exit.
const std::string& adapter_path(int64_t which) {
  static const std::filesystem::path directory = [] {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "folio-adapter-bench-XXXXXX").string();
    FOLIO_CHECK(mkdtemp(pattern.data()) != nullptr, "cannot make {}", pattern);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(directory, ignored);
    });
    return std::filesystem::path(pattern);
  }();
  static std::string paths[2];
  std::string& path = paths[which];
  if (path.empty()) {
    RandomAdapterOptions options;
    options.rank = kRank;
    Result<gguf::GgufWriter> writer = make_random_adapter_writer(bench_shape(which), options);
    FOLIO_CHECK(writer.ok(), "{}", writer.status());
    const std::string file = (directory / fmt::format("adapter-{}.gguf", which)).string();
    const Status written = writer->write_file(file);
    FOLIO_CHECK(written.ok(), "{}", written);
    path = file;
  }
  return path;
}

device::VirtualMemory& bench_vm() {
  static std::unique_ptr<device::VirtualMemory> vm = [] {
    Result<std::unique_ptr<device::VirtualMemory>> made = device::make_host_virtual_memory();
    FOLIO_CHECK(made.ok(), "{}", made.status());
    return std::move(*made);
  }();
  return *vm;
}

// A pool and a manager over it; `hot` false keeps every adapter out of the hot tier (a hot
// budget of one byte, smaller than any adapter), so loads go warm.
struct Fixture {
  Fixture(int64_t which, bool hot) : shape(bench_shape(which)), path(adapter_path(which)) {
    memory::PagePoolOptions pool_options;
    pool_options.name = "adapter_bench";
    pool_options.num_pages = kPoolPages;
    Result<std::unique_ptr<memory::PagePool>> made_pool =
        memory::PagePool::create(bench_vm(), pool_options);
    FOLIO_CHECK(made_pool.ok(), "{}", made_pool.status());
    pool = std::move(*made_pool);
    AdapterManagerOptions options;
    options.max_sequences = 8;
    options.hot_budget_bytes = hot ? 0 : 1;
    Result<std::unique_ptr<AdapterManager>> made = AdapterManager::create(shape, *pool, options);
    FOLIO_CHECK(made.ok(), "{}", made.status());
    manager = std::move(*made);
  }

  AdapterId add(const std::string& name) {
    Result<AdapterInfo> info = manager->register_adapter(name, path);
    FOLIO_CHECK(info.ok(), "{}", info.status());
    return info->id;
  }

  // Acquires `id` (loading it first if it is cold), which the caller releases.
  void acquire_loaded(AdapterId id) {
    for (;;) {
      Result<AdapterReadiness> readiness = manager->acquire(id);
      FOLIO_CHECK(readiness.ok(), "{}", readiness.status());
      if (*readiness == AdapterReadiness::kReady) return;
      manager->wait_for_loads();
    }
  }

  model::LlamaShape shape;
  std::string path;
  std::unique_ptr<memory::PagePool> pool;
  std::unique_ptr<AdapterManager> manager;
};

void acquire_resident(benchmark::State& state, bool hot) {
  Fixture fixture(state.range(0), hot);
  const AdapterId id = fixture.add("resident");
  fixture.acquire_loaded(id);
  fixture.manager->release(id);
  FOLIO_CHECK(fixture.manager->tier(id) == (hot ? AdapterTier::kHot : AdapterTier::kWarm),
              "adapter is {}", adapter_tier_name(fixture.manager->tier(id)));
  const int64_t ids[] = {id};
  for (auto _ : state) {
    Result<AdapterReadiness> readiness = fixture.manager->acquire(id);
    benchmark::DoNotOptimize(readiness);
    benchmark::DoNotOptimize(fixture.manager->bind_step(ids).data());
    fixture.manager->release(id);
  }
}

void BM_AcquireHot(benchmark::State& state) {
  acquire_resident(state, /*hot=*/true);
}
void BM_AcquireWarm(benchmark::State& state) {
  acquire_resident(state, /*hot=*/false);
}

// Each iteration registers the file under a new name (a new id, so cold), untimed, then times
// acquire -> load -> acquire; the adapter is unregistered and freed untimed.
void load_cold(benchmark::State& state, bool hot) {
  Fixture fixture(state.range(0), hot);
  int64_t next = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const std::string name = fmt::format("cold-{}", next++);
    const AdapterId id = fixture.add(name);
    state.ResumeTiming();
    fixture.acquire_loaded(id);
    state.PauseTiming();
    FOLIO_CHECK(fixture.manager->tier(id) == (hot ? AdapterTier::kHot : AdapterTier::kWarm),
                "loaded into {}", adapter_tier_name(fixture.manager->tier(id)));
    fixture.manager->release(id);
    FOLIO_CHECK(fixture.manager->unregister_adapter(name).ok(), "unregister {}", name);
    fixture.manager->maintain();
    state.ResumeTiming();
  }
}

void BM_LoadColdToHot(benchmark::State& state) {
  load_cold(state, /*hot=*/true);
}
void BM_LoadColdToWarm(benchmark::State& state) {
  load_cold(state, /*hot=*/false);
}

void BM_OpenAdapterFile(benchmark::State& state) {
  const model::LlamaShape shape = bench_shape(state.range(0));
  const std::string& path = adapter_path(state.range(0));
  for (auto _ : state) {
    Result<std::unique_ptr<AdapterFile>> file = AdapterFile::open(path, shape);
    FOLIO_CHECK(file.ok(), "{}", file.status());
    benchmark::DoNotOptimize(file->get());
  }
}

void BM_WriteAdapterWeights(benchmark::State& state) {
  const model::LlamaShape shape = bench_shape(state.range(0));
  const auto format = static_cast<kernels::LoraWeightFormat>(state.range(1));
  Result<std::unique_ptr<AdapterFile>> file =
      AdapterFile::open(adapter_path(state.range(0)), shape);
  FOLIO_CHECK(file.ok(), "{}", file.status());
  const int64_t bytes = adapter_weights_bytes(**file, format);
  exec::HostBuffer buffer(static_cast<size_t>(bytes));
  for (auto _ : state) {
    Result<std::vector<kernels::LoraSlotWeights>> weights = write_adapter_weights(
        **file, format, 1.0f, std::span(buffer.data(), static_cast<size_t>(bytes)));
    FOLIO_CHECK(weights.ok(), "{}", weights.status());
    benchmark::DoNotOptimize(weights->data());
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

BENCHMARK(BM_AcquireHot)->Arg(0)->Arg(1);
BENCHMARK(BM_AcquireWarm)->Arg(0)->Arg(1);
BENCHMARK(BM_LoadColdToHot)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LoadColdToWarm)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_OpenAdapterFile)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_WriteAdapterWeights)
    ->ArgsProduct({{0, 1},
                   {static_cast<int64_t>(kernels::LoraWeightFormat::kF16),
                    static_cast<int64_t>(kernels::LoraWeightFormat::kInt8)}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace folio::lora

BENCHMARK_MAIN();
