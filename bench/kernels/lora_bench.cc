// LoRA kernel benchmarks at decode batch sizes, every token with its own adapter (the worst
// case of multi-adapter serving: no two tokens share adapter weights), against the base
// projection of the same shape measured in the same benchmark.
//
// - lora/<format>/<warm|cold>/batch:B/threads:T: one lora launch over B tokens, each with a
//   distinct rank-16 adapter, K = N = 768 (a "base" model's q or o projection). `cold` cycles
//   through copies of the adapters and of the base weight (>= 256 MiB each, several times the
//   last-level cache), so every step reads its weights from DRAM as a forward pass through many
//   layers does; `warm` reuses the same B adapters and one base weight every step.
//   Counters:
//   - lora_us: time per launch;
//   - adapter_GB/s: adapter bytes read per second (B * (A + B^T) bytes per launch);
//   - base_f16_us, base_q8_0_us: the y = x W^T matmul of the same shape (768 x 768) and batch,
//     f16 and q8_0 weights, warm or cold like the adapters, timed in the same benchmark;
//   - ratio_f16, ratio_q8_0: lora_us / base_us, the adapter's overhead relative to the base
//     projection it is added to (0.25 = the update costs a quarter of the projection).
#include <benchmark/benchmark.h>

#include "simd_flag.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "folio/base/thread_pool.h"
#include "folio/device/host_stream.h"
#include "folio/kernels/cpu/lora.h"
#include "folio/kernels/cpu/matmul.h"
#include "folio/kernels/cpu/simd_level.h"
#include "folio/kernels/lora.h"
#include "folio/tensor/quantize.h"

namespace folio::kernels::cpu {
namespace {

constexpr int64_t kFeatures = 768;
constexpr int32_t kRank = 16;
// Total bytes a cold benchmark cycles through, per kind of weight: 8x the 32 MiB last-level
// cache of the machine measured.
constexpr int64_t kColdBytes = int64_t{256} << 20;

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// 64-byte aligned, zero-initialized (so pages are touched before any timing).
class AlignedBuffer {
 public:
  explicit AlignedBuffer(int64_t bytes)
      : bytes_(std::max<int64_t>(bytes, 64)),
        data_(static_cast<std::byte*>(std::aligned_alloc(64, round_up(bytes_, 64)))) {
    std::fill(data_, data_ + bytes_, std::byte{0});
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  std::byte* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  int64_t bytes_;
  std::byte* data_;
};

ThreadPool& pool_with(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& pool = pools[threads];
  if (!pool) pool = std::make_unique<ThreadPool>(threads);
  return *pool;
}

// Deterministic small values (quality does not matter for timing).
std::vector<float> pattern(int64_t count, int64_t salt) {
  std::vector<float> values(count);
  for (int64_t i = 0; i < count; ++i) {
    values[i] = static_cast<float>((i * 7 + salt * 13) % 23) * 0.004f - 0.044f;
  }
  return values;
}

// `count` adapters in one buffer, each A then B^T, 64-byte aligned; slot 0 has none, slot
// i + 1 is adapter i. The adapters are copies of one (distinct memory, same values).
struct AdapterPool {
  AdapterPool(LoraWeightFormat format, int64_t count)
      : matrix_bytes(round_up(lora_matrix_bytes(format, kRank, kFeatures), 64)),
        storage(count * 2 * matrix_bytes) {
    write_lora_matrix(format, pattern(kRank * kFeatures, 1).data(), kRank, kFeatures,
                      storage.data());
    write_lora_matrix(format, pattern(kRank * kFeatures, 2).data(), kRank, kFeatures,
                      storage.data() + matrix_bytes);
    for (int64_t adapter = 1; adapter < count; ++adapter) {
      std::memcpy(storage.data() + adapter * 2 * matrix_bytes, storage.data(), 2 * matrix_bytes);
    }
    slots.push_back(LoraSlotWeights{});
    for (int64_t adapter = 0; adapter < count; ++adapter) {
      LoraSlotWeights weights;
      weights.a = storage.data() + adapter * 2 * matrix_bytes;
      weights.b = weights.a + matrix_bytes;
      weights.rank = kRank;
      weights.scale = 0.5f;
      weights.format = format;
      slots.push_back(weights);
    }
  }

  int64_t matrix_bytes;
  AlignedBuffer storage;
  std::vector<LoraSlotWeights> slots;
};

// `count` copies of a 768 x 768 base weight in `dtype`.
struct BaseWeights {
  BaseWeights(DType dtype, int64_t count)
      : stride(round_up(row_bytes(dtype, kFeatures) * kFeatures, 64)), storage(count * stride) {
    const int64_t bytes_per_row = row_bytes(dtype, kFeatures);
    for (int64_t row = 0; row < kFeatures; ++row) {
      quantize_row(dtype, pattern(kFeatures, row).data(), storage.data() + row * bytes_per_row,
                   kFeatures);
    }
    for (int64_t copy = 1; copy < count; ++copy) {
      std::memcpy(storage.data() + copy * stride, storage.data(), stride);
    }
  }

  int64_t stride;
  AlignedBuffer storage;
};

// Pools and weights are built once per process (Google Benchmark calls a benchmark function
// several times while it sizes the iteration count).
const AdapterPool& adapter_pool(LoraWeightFormat format, int64_t count) {
  static std::map<std::pair<LoraWeightFormat, int64_t>, std::unique_ptr<AdapterPool>> pools;
  auto& pool = pools[{format, count}];
  if (!pool) pool = std::make_unique<AdapterPool>(format, count);
  return *pool;
}

const BaseWeights& base_weights(DType dtype, int64_t count) {
  static std::map<std::pair<DType, int64_t>, std::unique_ptr<BaseWeights>> weights;
  auto& entry = weights[{dtype, count}];
  if (!entry) entry = std::make_unique<BaseWeights>(dtype, count);
  return *entry;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Microseconds per base matmul of `batch` rows, cycling through `copies` weights, timed over
// at least 0.2 s after a warm-up pass.
double base_matmul_microseconds(DType dtype, int64_t batch, int threads, int64_t copies,
                                const float* input, float* output) {
  const BaseWeights& weights = base_weights(dtype, copies);
  const int64_t workspace_bytes = matmul_workspace_bytes(dtype, batch, kFeatures, threads);
  AlignedBuffer workspace(workspace_bytes);
  device::HostStream stream(pool_with(threads));
  MatmulArguments arguments;
  arguments.input = input;
  arguments.output = output;
  arguments.workspace = workspace.data();
  arguments.workspace_bytes = workspace_bytes;
  arguments.num_rows = batch;
  arguments.input_features = kFeatures;
  arguments.output_features = kFeatures;
  arguments.weight_dtype = dtype;
  auto run = [&](int64_t step) {
    arguments.weight = weights.storage.data() + (step % copies) * weights.stride;
    matmul(stream, arguments);
  };
  for (int64_t step = 0; step < copies; ++step) run(step);
  int64_t steps = 0;
  const auto start = std::chrono::steady_clock::now();
  while (steps < 100 || seconds_since(start) < 0.2) run(steps++);
  return seconds_since(start) / static_cast<double>(steps) * 1e6;
}

void lora_decode(benchmark::State& state, LoraWeightFormat format, int64_t batch, int threads,
                 bool cold) {
  const int64_t adapter_bytes = 2 * lora_matrix_bytes(format, kRank, kFeatures);
  const int64_t adapters =
      cold ? round_up(std::max(batch, kColdBytes / adapter_bytes), batch) : batch;
  const AdapterPool& pool = adapter_pool(format, adapters);
  const std::vector<float> input = pattern(batch * kFeatures, 3);
  const std::vector<float> base = pattern(batch * kFeatures, 4);
  std::vector<float> output(batch * kFeatures);
  std::vector<int32_t> token_slots(batch);
  const int64_t workspace_bytes = lora_workspace_bytes(kRank, threads);
  AlignedBuffer workspace(workspace_bytes);
  device::HostStream stream(pool_with(threads));
  LoraArguments arguments;
  arguments.input = input.data();
  arguments.base = base.data();
  arguments.output = output.data();
  arguments.token_slots = token_slots.data();
  arguments.slots = pool.slots.data();
  arguments.num_slots = static_cast<int32_t>(pool.slots.size());
  arguments.max_rank = kRank;
  arguments.workspace = workspace.data();
  arguments.workspace_bytes = workspace_bytes;
  arguments.num_rows = batch;
  arguments.input_features = kFeatures;
  arguments.output_features = kFeatures;
  // Step s gives its tokens the next `batch` adapters, all distinct.
  auto run = [&](int64_t step) {
    for (int64_t token = 0; token < batch; ++token) {
      token_slots[token] = static_cast<int32_t>(1 + (step * batch + token) % adapters);
    }
    lora(stream, arguments);
  };
  const int64_t steps_per_cycle = adapters / batch;
  for (int64_t step = 0; step < steps_per_cycle; ++step) run(step);

  const int64_t base_copies_f16 =
      cold ? kColdBytes / (kFeatures * row_bytes(DType::kF16, kFeatures)) : 1;
  const int64_t base_copies_q8 =
      cold ? kColdBytes / (kFeatures * row_bytes(DType::kQ8_0, kFeatures)) : 1;
  std::vector<float> base_output(batch * kFeatures);
  const double base_f16 = base_matmul_microseconds(DType::kF16, batch, threads, base_copies_f16,
                                                   input.data(), base_output.data());
  const double base_q8 = base_matmul_microseconds(DType::kQ8_0, batch, threads, base_copies_q8,
                                                  input.data(), base_output.data());

  int64_t step = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) run(step++);
  const double seconds = seconds_since(start);
  const double lora_microseconds = seconds / static_cast<double>(state.iterations()) * 1e6;
  state.counters["lora_us"] = lora_microseconds;
  state.counters["adapter_GB/s"] =
      static_cast<double>(state.iterations() * batch * adapter_bytes) / seconds / 1e9;
  state.counters["base_f16_us"] = base_f16;
  state.counters["base_q8_0_us"] = base_q8;
  state.counters["ratio_f16"] = lora_microseconds / base_f16;
  state.counters["ratio_q8_0"] = lora_microseconds / base_q8;
}

void register_benchmarks() {
  for (LoraWeightFormat format : {LoraWeightFormat::kF16, LoraWeightFormat::kInt8}) {
    for (bool cold : {false, true}) {
      for (int threads : {1, 2}) {
        for (int64_t batch : {1, 8, 32}) {
          const std::string name = "lora/" + std::string(lora_weight_format_name(format)) + "/" +
                                   (cold ? "cold" : "warm") + "/batch:" + std::to_string(batch) +
                                   "/threads:" + std::to_string(threads);
          benchmark::RegisterBenchmark(name.c_str(), lora_decode, format, batch, threads, cold)
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
}

}  // namespace
}  // namespace folio::kernels::cpu

// Folio's own flag, removed from argv before Google Benchmark parses the rest:
//   --simd=portable|avx2 run the kernels at a lower SIMD level than the CPU's best
int main(int argc, char** argv) {
  return folio::kernels::cpu::run_kernel_benchmarks(argc, argv,
                                                    folio::kernels::cpu::register_benchmarks);
}
