// Matmul benchmarks on the weight shapes of two generated Llama-style models, against the
// machine's read bandwidth measured in the same run.
//
// - read_bandwidth/threads:T: a streaming sum over a 2 GiB buffer (far larger than the
//   last-level cache; base/read_bandwidth.h), split over T threads of the pool. The baseline
//   of the roofline.
// - decode/<model>/<dtype>/batch:M/threads:T: every weight matrix of one forward pass (all
//   layers' q, k, v, o, gate, up, down and the 32,000-row LM head) multiplied by M rows of x,
//   i.e. one decode step of M sequences. Counters: tokens/s (M per step), GB/s of weight bytes
//   streamed (each weight is read once per step) and roofline = GB/s / read bandwidth
//   (measured at the start of the same benchmark, best of three passes), and GFLOP/s
//   (2 M N K per matrix).
// - decode_cold/base/<dtype>/batch:1/threads:T: the same, cycling through copies of the
//   weights (>= 1 GiB in all) so that no step finds its weights in the last-level cache.
//   The block types Folio does not quantize itself (q4_1 ... iq4_xs) have random block bytes
//   and run on the base model only, cold at batch 1 and warm at batch 32.
// - prefill/<model>/<dtype>/tokens:M/threads:T: the same matrices for a prompt of M tokens.
//   Counters: tokens/s and GFLOP/s (2 M N K per matrix).
// - sgemm_threshold/f32/K:<K>/rows:M: one 2048 x K f32 matrix at M rows around kSgemmMinRows;
//   with K >= kSgemmMinInputFeatures the kernel hands over to sgemm there, below it never does.
//
// Matmuls only: attention, norms and activations are not part of these figures.
#include <benchmark/benchmark.h>

#include "simd_flag.h"

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "folio/base/read_bandwidth.h"
#include "folio/base/thread_pool.h"
#include "folio/device/host_stream.h"
#include "folio/kernels/cpu/matmul.h"
#include "folio/kernels/cpu/q8_0_panels.h"
#include "folio/kernels/cpu/simd_level.h"
#include "folio/tensor/half.h"
#include "folio/tensor/quantize.h"

// GCC 12 warns inside its own AVX-512 intrinsics in target-attribute functions (bug 105593).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace folio::kernels::cpu {
namespace {

constexpr int64_t kBandwidthBufferBytes = int64_t{2} << 30;

// The block types of GGUF files that Folio reads but does not quantize itself.
constexpr DType kBlockDtypes[] = {DType::kQ4_1,   DType::kQ5_0,  DType::kQ5_1, DType::kQ2_K,
                                  DType::kQ3_K,   DType::kQ4_K,  DType::kQ5_K, DType::kQ6_K,
                                  DType::kIQ4_NL, DType::kIQ4_XS};

// ---------------------------------------------------------------------------------------------
// Memory

// --huge_pages: back every buffer with transparent huge pages (madvise), as weights loaded
// into 2 MiB pages would be; by default buffers use the 4 KiB pages an mmapped file gets.
bool use_huge_pages = false;

// 2 MiB aligned, zero-initialized (so pages are touched once, before any timing).
class AlignedBuffer {
 public:
  static constexpr int64_t kAlignment = int64_t{2} << 20;

  explicit AlignedBuffer(int64_t bytes)
      : bytes_(bytes),
        data_(static_cast<std::byte*>(std::aligned_alloc(kAlignment, rounded(bytes)))) {
    if (use_huge_pages) madvise(data_, rounded(bytes), MADV_HUGEPAGE);
    std::fill(data_, data_ + bytes, std::byte{0});
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  std::byte* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  static int64_t rounded(int64_t bytes) {
    return (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }

  int64_t bytes_;
  std::byte* data_;
};

ThreadPool& pool_with(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& pool = pools[threads];
  if (!pool) pool = std::make_unique<ThreadPool>(threads);
  return *pool;
}

// Made on first use (allocating and touching 2 GiB takes a while), read by every roofline.
ReadBandwidthBuffer& bandwidth_buffer() {
  static ReadBandwidthBuffer buffer(pool_with(2), kBandwidthBufferBytes);
  return buffer;
}

// Best of three passes: the roofline is what the memory system can deliver.
double measure_read_bandwidth(int threads) {
  double best = 0.0;
  for (int pass = 0; pass < 3; ++pass)
    best = std::max(best, bandwidth_buffer().read_pass(pool_with(threads)));
  return best;
}

void read_bandwidth(benchmark::State& state, int threads) {
  ThreadPool& pool = pool_with(threads);
  ReadBandwidthBuffer& buffer = bandwidth_buffer();
  for (auto _ : state) benchmark::DoNotOptimize(buffer.read_pass(pool));
  state.SetBytesProcessed(state.iterations() * buffer.bytes());
}

// ---------------------------------------------------------------------------------------------
// Models

struct ModelShape {
  const char* name;
  int64_t hidden;
  int64_t layers;
  int64_t heads;
  int64_t kv_heads;
  int64_t ffn;
  int64_t vocab;
  int64_t context;  // not used by matmuls; the shape's definition
};

constexpr ModelShape kTiny{"tiny", 288, 6, 6, 6, 768, 32000, 256};
constexpr ModelShape kBase{"base", 768, 12, 12, 4, 2048, 32000, 2048};

struct Linear {
  int64_t output_features;
  int64_t input_features;
};

// Every matrix of one forward pass, in order: per layer q, k, v, o, gate, up, down; then the
// untied LM head.
std::vector<Linear> forward_pass_matrices(const ModelShape& model) {
  const int64_t kv_dim = model.kv_heads * (model.hidden / model.heads);
  std::vector<Linear> matrices;
  for (int64_t layer = 0; layer < model.layers; ++layer) {
    matrices.push_back({model.hidden, model.hidden});
    matrices.push_back({kv_dim, model.hidden});
    matrices.push_back({kv_dim, model.hidden});
    matrices.push_back({model.hidden, model.hidden});
    matrices.push_back({model.ffn, model.hidden});
    matrices.push_back({model.ffn, model.hidden});
    matrices.push_back({model.hidden, model.ffn});
  }
  matrices.push_back({model.vocab, model.hidden});
  return matrices;
}

// One model's weights in one dtype, each matrix in its own buffer (so a forward pass streams
// distinct memory, as a real model does), filled with random values quantized to the dtype.
struct ModelWeights {
  DType dtype;
  std::vector<Linear> matrices;
  std::vector<std::unique_ptr<AlignedBuffer>> buffers;
  int64_t total_bytes = 0;
  int64_t total_parameters = 0;
};

const ModelWeights& weights_for(const ModelShape& model, DType dtype) {
  static std::map<std::string, std::unique_ptr<ModelWeights>> cache;
  auto& weights = cache[std::string(model.name) + "/" + std::string(dtype_name(dtype))];
  if (weights) return *weights;
  weights = std::make_unique<ModelWeights>();
  weights->dtype = dtype;
  weights->matrices = forward_pass_matrices(model);
  uint32_t state = 12345;
  std::vector<float> row;
  // q8_0 panels: the q8_0 weights (same values), packed as the model packs them at load.
  const bool panels = dtype == DType::kQ8_0Panels;
  const DType stored = panels ? DType::kQ8_0 : dtype;
  for (const Linear& linear : weights->matrices) {
    const int64_t stride = row_bytes(stored, linear.input_features);
    auto buffer = std::make_unique<AlignedBuffer>(linear.output_features * stride);
    row.resize(linear.input_features);
    for (int64_t n = 0; n < linear.output_features; ++n) {
      for (float& value : row) {
        state = state * 1664525u + 1013904223u;  // LCG: fast, and quality does not matter here
        value = static_cast<float>(static_cast<int32_t>(state)) * (1.0f / 2147483648.0f) * 0.05f;
      }
      quantize_row(stored, row.data(), buffer->data() + n * stride, linear.input_features);
    }
    if (panels) {
      const int64_t rows = linear.output_features;
      auto packed = std::make_unique<AlignedBuffer>(q8_0_panels_bytes(rows, linear.input_features));
      pack_q8_0_panels(buffer->data(), rows, linear.input_features, 0,
                       (rows + kQ8_0PanelRows - 1) / kQ8_0PanelRows, packed->data());
      buffer = std::move(packed);
    }
    weights->total_bytes += buffer->bytes();
    weights->total_parameters += linear.output_features * linear.input_features;
    weights->buffers.push_back(std::move(buffer));
  }
  return *weights;
}

// Copies of a model's weights (the first is weights_for's) whose total is at least
// kColdWeightBytes: a pass that cycles through them finds nothing of the next pass's weights
// in the last-level cache.
constexpr int64_t kColdWeightBytes = int64_t{1} << 30;

const std::vector<const ModelWeights*>& cold_copies(const ModelShape& model, DType dtype) {
  static std::map<std::string, std::vector<std::unique_ptr<ModelWeights>>> cache;
  static std::map<std::string, std::vector<const ModelWeights*>> views;
  const std::string key = std::string(model.name) + "/" + std::string(dtype_name(dtype));
  auto& view = views[key];
  if (!view.empty()) return view;
  const ModelWeights& first = weights_for(model, dtype);
  view.push_back(&first);
  auto& copies = cache[key];
  while (static_cast<int64_t>(view.size()) * first.total_bytes < kColdWeightBytes) {
    auto copy = std::make_unique<ModelWeights>();
    copy->dtype = dtype;
    copy->matrices = first.matrices;
    copy->total_bytes = first.total_bytes;
    copy->total_parameters = first.total_parameters;
    for (const auto& buffer : first.buffers) {
      copy->buffers.push_back(std::make_unique<AlignedBuffer>(buffer->bytes()));
      std::copy(buffer->data(), buffer->data() + buffer->bytes(), copy->buffers.back()->data());
    }
    view.push_back(copy.get());
    copies.push_back(std::move(copy));
  }
  return view;
}

// Inputs, outputs and workspace for a forward pass of `rows` rows.
struct Activations {
  AlignedBuffer input;
  AlignedBuffer output;
  AlignedBuffer workspace;

  Activations(const ModelShape& model, DType dtype, int64_t rows, int threads)
      : input(rows * std::max(model.hidden, model.ffn) * 4),
        output(rows * std::max({model.vocab, model.ffn, model.hidden}) * 4),
        workspace(std::max<int64_t>(
            64, matmul_workspace_bytes(dtype, rows, std::max(model.hidden, model.ffn), threads))) {
    auto* values = reinterpret_cast<float*>(input.data());
    for (int64_t i = 0; i < input.bytes() / 4; ++i)
      values[i] = static_cast<float>(i % 17) * 0.1f - 0.8f;
  }
};

void run_forward_matmuls(device::HostStream& stream, const ModelWeights& weights,
                         Activations& activations, int64_t rows) {
  for (size_t i = 0; i < weights.matrices.size(); ++i) {
    MatmulArguments arguments;
    arguments.input = reinterpret_cast<const float*>(activations.input.data());
    arguments.weight = weights.buffers[i]->data();
    arguments.output = reinterpret_cast<float*>(activations.output.data());
    arguments.workspace = activations.workspace.data();
    arguments.workspace_bytes = activations.workspace.bytes();
    arguments.num_rows = rows;
    arguments.input_features = weights.matrices[i].input_features;
    arguments.output_features = weights.matrices[i].output_features;
    arguments.weight_dtype = weights.dtype;
    matmul(stream, arguments);
  }
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// `cold`: each step uses the next of cold_copies(), so the weights come from DRAM as they do
// for a model much larger than the cache; otherwise every step reuses one copy, and a model
// that fits in the last-level cache partly streams from it.
void decode(benchmark::State& state, const ModelShape& model, DType dtype, int64_t batch,
            int threads, bool cold) {
  const std::vector<const ModelWeights*> copies =
      cold ? cold_copies(model, dtype)
           : std::vector<const ModelWeights*>{&weights_for(model, dtype)};
  const int64_t weight_bytes = copies.front()->total_bytes;
  Activations activations(model, dtype, batch, threads);
  device::HostStream stream(pool_with(threads));
  for (const ModelWeights* weights : copies) {
    run_forward_matmuls(stream, *weights, activations, batch);  // warm up code and threads
  }
  const double bandwidth = measure_read_bandwidth(threads);
  size_t next = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    run_forward_matmuls(stream, *copies[next], activations, batch);
    next = (next + 1) % copies.size();
  }
  const double seconds = seconds_since(start);
  const double steps = static_cast<double>(state.iterations());
  const double streamed = steps * static_cast<double>(weight_bytes) / seconds;
  state.counters["tokens/s"] = steps * static_cast<double>(batch) / seconds;
  state.counters["GFLOP/s"] = steps * 2.0 * static_cast<double>(batch) *
                              static_cast<double>(copies.front()->total_parameters) / seconds / 1e9;
  state.counters["weight_GB/s"] = streamed / 1e9;
  state.counters["read_GB/s"] = bandwidth / 1e9;
  state.counters["roofline"] = streamed / bandwidth;
  state.counters["weight_MB"] = static_cast<double>(weight_bytes) / 1e6;
}

void prefill(benchmark::State& state, const ModelShape& model, DType dtype, int64_t tokens,
             int threads) {
  const ModelWeights& weights = weights_for(model, dtype);
  Activations activations(model, dtype, tokens, threads);
  device::HostStream stream(pool_with(threads));
  run_forward_matmuls(stream, weights, activations, tokens);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) run_forward_matmuls(stream, weights, activations, tokens);
  const double seconds = seconds_since(start);
  const double steps = static_cast<double>(state.iterations());
  state.counters["tokens/s"] = steps * static_cast<double>(tokens) / seconds;
  state.counters["GFLOP/s"] = steps * 2.0 * static_cast<double>(tokens) *
                              static_cast<double>(weights.total_parameters) / seconds / 1e9;
}

// The compute ceiling: one 512 x 512 weight (at most 1 MiB, so it stays in the L2 cache)
// multiplied over and over. Reported as the weight bytes per second the kernel could consume
// if memory were free; decode can reach its roofline only when this is well above the read
// bandwidth.
void cached_weight(benchmark::State& state, DType dtype, int64_t batch, int threads) {
  constexpr int64_t kFeatures = 512;
  const int64_t stride = row_bytes(dtype, kFeatures);
  AlignedBuffer weight(kFeatures * stride);
  std::vector<float> row(kFeatures);
  for (int64_t n = 0; n < kFeatures; ++n) {
    for (int64_t k = 0; k < kFeatures; ++k)
      row[k] = static_cast<float>((n * 7 + k * 3) % 23) * 0.01f - 0.1f;
    quantize_row(dtype, row.data(), weight.data() + n * stride, kFeatures);
  }
  AlignedBuffer input(batch * kFeatures * 4);
  AlignedBuffer output(batch * kFeatures * 4);
  AlignedBuffer workspace(
      std::max<int64_t>(64, matmul_workspace_bytes(dtype, batch, kFeatures, threads)));
  MatmulArguments arguments;
  arguments.input = reinterpret_cast<const float*>(input.data());
  arguments.weight = weight.data();
  arguments.output = reinterpret_cast<float*>(output.data());
  arguments.workspace = workspace.data();
  arguments.workspace_bytes = workspace.bytes();
  arguments.num_rows = batch;
  arguments.input_features = kFeatures;
  arguments.output_features = kFeatures;
  arguments.weight_dtype = dtype;
  device::HostStream stream(pool_with(threads));
  matmul(stream, arguments);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) matmul(stream, arguments);
  const double seconds = seconds_since(start);
  const double steps = static_cast<double>(state.iterations());
  state.counters["weight_GB/s"] = steps * static_cast<double>(weight.bytes()) / seconds / 1e9;
  state.counters["GMAC/s"] =
      steps * static_cast<double>(batch * kFeatures * kFeatures) / seconds / 1e9;
}

// One 2048 x `input_features` f32 matrix at `rows` rows: Folio's kernel, or sgemm from
// kSgemmMinRows rows when input_features >= kSgemmMinInputFeatures.
void sgemm_threshold(benchmark::State& state, int64_t input_features, int64_t rows, int threads) {
  const int64_t output_features = 2048;
  AlignedBuffer weight(output_features * input_features * 4);
  AlignedBuffer input(rows * input_features * 4);
  AlignedBuffer output(rows * output_features * 4);
  MatmulArguments arguments;
  arguments.input = reinterpret_cast<const float*>(input.data());
  arguments.weight = weight.data();
  arguments.output = reinterpret_cast<float*>(output.data());
  arguments.num_rows = rows;
  arguments.input_features = input_features;
  arguments.output_features = output_features;
  device::HostStream stream(pool_with(threads));
  matmul(stream, arguments);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) matmul(stream, arguments);
  const double seconds = seconds_since(start);
  state.counters["GFLOP/s"] = static_cast<double>(state.iterations()) * 2.0 *
                              static_cast<double>(rows) * output_features * input_features /
                              seconds / 1e9;
}

void register_benchmarks() {
  for (int threads : {1, 2}) {
    benchmark::RegisterBenchmark(("read_bandwidth/threads:" + std::to_string(threads)).c_str(),
                                 read_bandwidth, threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (const ModelShape* model : {&kTiny, &kBase}) {
    for (DType dtype : {DType::kF32, DType::kF16, DType::kQ8_0, DType::kQ8_0Panels}) {
      if (dtype == DType::kQ8_0Panels && !q8_0_panels_supported()) continue;
      for (int threads : {1, 2}) {
        const std::string suffix = "/threads:" + std::to_string(threads);
        const std::string prefix = std::string(model->name) + "/" + std::string(dtype_name(dtype));
        for (int64_t batch : {1, 4, 32}) {
          benchmark::RegisterBenchmark(
              ("decode/" + prefix + "/batch:" + std::to_string(batch) + suffix).c_str(), decode,
              *model, dtype, batch, threads, false)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
        if (model == &kBase) {
          benchmark::RegisterBenchmark(("decode_cold/" + prefix + "/batch:1" + suffix).c_str(),
                                       decode, *model, dtype, int64_t{1}, threads, true)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
        for (int64_t tokens : {128, 256}) {
          benchmark::RegisterBenchmark(
              ("prefill/" + prefix + "/tokens:" + std::to_string(tokens) + suffix).c_str(), prefill,
              *model, dtype, tokens, threads)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
      }
    }
  }
  // The block types of GGUF files on the base model (the k-quants need K a multiple of 256,
  // which tiny's 288 is not): cold batch-1 decode against the roofline, and batch 32.
  for (DType dtype : kBlockDtypes) {
    for (int threads : {1, 2}) {
      const std::string suffix = "/threads:" + std::to_string(threads);
      const std::string prefix = "base/" + std::string(dtype_name(dtype));
      benchmark::RegisterBenchmark(("decode_cold/" + prefix + "/batch:1" + suffix).c_str(), decode,
                                   kBase, dtype, int64_t{1}, threads, true)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("decode/" + prefix + "/batch:32" + suffix).c_str(), decode,
                                   kBase, dtype, int64_t{32}, threads, false)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    for (int64_t batch : {1, 4, 32}) {
      benchmark::RegisterBenchmark(("cached_weight/" + std::string(dtype_name(dtype)) +
                                    "/batch:" + std::to_string(batch) + "/threads:1")
                                       .c_str(),
                                   cached_weight, dtype, batch, 1)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (DType dtype : kBlockDtypes) {
    for (int64_t batch : {1, 32}) {
      benchmark::RegisterBenchmark(("cached_weight/" + std::string(dtype_name(dtype)) +
                                    "/batch:" + std::to_string(batch) + "/threads:1")
                                       .c_str(),
                                   cached_weight, dtype, batch, 1)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (int64_t input_features : {int64_t{2048}, kSgemmMinInputFeatures, int64_t{4096}}) {
    for (int64_t rows : {kSgemmMinRows / 2, kSgemmMinRows - 1, kSgemmMinRows, 2 * kSgemmMinRows}) {
      benchmark::RegisterBenchmark(("sgemm_threshold/f32/K:" + std::to_string(input_features) +
                                    "/rows:" + std::to_string(rows) + "/threads:1")
                                       .c_str(),
                                   sgemm_threshold, input_features, rows, 1)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace
}  // namespace folio::kernels::cpu

// Folio's own flags, removed from argv before Google Benchmark parses the rest:
//   --huge_pages         buffers in transparent huge pages
//   --simd=portable|avx2 run the kernels at a lower SIMD level than the CPU's best
int main(int argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    if (argument == "--huge_pages") {
      folio::kernels::cpu::use_huge_pages = true;
    } else if (!folio::kernels::cpu::take_simd_flag(argument)) {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  folio::kernels::cpu::register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
