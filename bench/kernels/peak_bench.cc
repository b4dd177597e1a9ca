// The machine's peak arithmetic throughput, the denominator of "fraction of peak" for batched
// decode (scripts/bench-scaling.sh runs it, scripts/plot-bench.py divides by it):
//
// - peak/f32_fma/threads:T: fused multiply-adds on f32 vectors of the active SIMD level
//   (vfmadd...ps on zmm for avx512, ymm for avx2). Counter GFLOP/s, 2 per lane per FMA.
// - peak/int8_dot/threads:T: int8 dot products as the q8_0 matmul takes them: AVX-512 VNNI
//   vpdpbusd (64 unsigned x signed byte products summed by 4 into 16 int32 lanes, one
//   instruction) for avx512, AVX2 vpmaddubsw + vpmaddwd + vpaddd (32 products, three
//   instructions) for avx2. Counter GOPS, 2 per byte product (a multiply and an add), so the
//   figure compares with the f32 GFLOP/s of the same dot product.
//
// T threads of the pool share 32 x T equal tasks (claimed dynamically, so a worker slow to
// wake does not leave the other idle); each task is a loop of register-resident independent
// accumulator chains (peak_body.inc), enough to cover the instructions' latency: FMA and VNNI
// have 4-5 cycles of latency on up to 2 ports, so 16 zmm chains; AVX2 has 16 ymm registers, so
// 12 chains plus the operands. The time is wall clock over the whole parallel pass.
//
// Counter cpu_busy: the process's CPU time over wall time x T, i.e. the share of its T cores the
// pass got; below 1 on a shared machine under load (the pool's idle spinning counts as busy).
//
// The level is the CPU's best unless --simd=avx2 lowers it; the portable level has no vector
// peak and reports an error instead. The label names the instruction measured.
#include <benchmark/benchmark.h>

#include "simd_flag.h"

#include <immintrin.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "folio/base/thread_pool.h"
#include "folio/kernels/cpu/simd_level.h"
#include "folio/kernels/cpu/simd_target.h"

// GCC 12 warns inside its own AVX-512 intrinsics in target-specific functions (bug 105593).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace folio::kernels::cpu {
namespace {

// Steps of one task: 16 chains x 2^16 steps, about 0.15 ms of one core's two FMA ports at
// 3.5 GHz; 32 tasks per thread make a pass of about 5 ms, long next to the pool's wake-up.
constexpr int64_t kStepsPerTask = int64_t{1} << 16;
constexpr int kTasksPerThread = 32;

}  // namespace
}  // namespace folio::kernels::cpu

// ---------------------------------------------------------------------------------------------
// AVX-512 (F + VNNI), the kernels' kAvx512 target set.

FOLIO_SIMD_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")

namespace folio::kernels::cpu {
namespace {
namespace peak_avx512 {

#include "folio/kernels/cpu/simd_avx512.inc"

using Simd = SimdAvx512;

struct Int8Dot {
  using Vector = __m512i;
  static constexpr int64_t kProductsPerStep = 64;
  static Vector zero() { return _mm512_setzero_si512(); }
  static Vector broadcast_byte(uint8_t value) { return _mm512_set1_epi8(static_cast<char>(value)); }
  static Vector accumulate(Vector accumulator, Vector unsigned_bytes, Vector signed_bytes) {
    return _mm512_dpbusd_epi32(accumulator, unsigned_bytes, signed_bytes);
  }
  static Vector add(Vector a, Vector b) { return _mm512_add_epi32(a, b); }
  static int32_t reduce_add(Vector value) { return _mm512_reduce_add_epi32(value); }
};

#include "peak_body.inc"

constexpr int kFmaChains = 16;
constexpr int kInt8Chains = 16;

float fma_task(float scale, float offset) {
  return fma_chains<kFmaChains>(kStepsPerTask, scale, offset);
}
int32_t int8_task(uint8_t unsigned_byte, int8_t signed_byte) {
  return int8_dot_chains<kInt8Chains>(kStepsPerTask, unsigned_byte, signed_byte);
}
constexpr double kFmaFlopsPerTask = 2.0 * kFmaChains * Simd::kWidth * kStepsPerTask;
constexpr double kInt8OpsPerTask = 2.0 * kInt8Chains * Int8Dot::kProductsPerStep * kStepsPerTask;

}  // namespace peak_avx512
}  // namespace
}  // namespace folio::kernels::cpu

FOLIO_SIMD_TARGET_END

// ---------------------------------------------------------------------------------------------
// AVX2 (+ FMA + F16C), the kernels' kAvx2 target set.

FOLIO_SIMD_TARGET_BEGIN("avx2,fma,f16c")

namespace folio::kernels::cpu {
namespace {
namespace peak_avx2 {

#include "folio/kernels/cpu/simd_avx2.inc"

using Simd = SimdAvx2;

struct Int8Dot {
  using Vector = __m256i;
  static constexpr int64_t kProductsPerStep = 32;
  static Vector zero() { return _mm256_setzero_si256(); }
  static Vector broadcast_byte(uint8_t value) { return _mm256_set1_epi8(static_cast<char>(value)); }
  // maddubs: unsigned x signed byte pairs summed to int16 (saturating); madd with ones: int16
  // pairs summed to int32; then the accumulating add, the only step on the chain.
  static Vector accumulate(Vector accumulator, Vector unsigned_bytes, Vector signed_bytes) {
    const __m256i pairs = _mm256_maddubs_epi16(unsigned_bytes, signed_bytes);
    return _mm256_add_epi32(accumulator, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
  static Vector add(Vector a, Vector b) { return _mm256_add_epi32(a, b); }
  static int32_t reduce_add(Vector value) {
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), value);
    int32_t total = 0;
    for (int32_t lane : lanes) total += lane;
    return total;
  }
};

#include "peak_body.inc"

constexpr int kFmaChains = 12;
constexpr int kInt8Chains = 12;

float fma_task(float scale, float offset) {
  return fma_chains<kFmaChains>(kStepsPerTask, scale, offset);
}
int32_t int8_task(uint8_t unsigned_byte, int8_t signed_byte) {
  return int8_dot_chains<kInt8Chains>(kStepsPerTask, unsigned_byte, signed_byte);
}
constexpr double kFmaFlopsPerTask = 2.0 * kFmaChains * Simd::kWidth * kStepsPerTask;
constexpr double kInt8OpsPerTask = 2.0 * kInt8Chains * Int8Dot::kProductsPerStep * kStepsPerTask;

}  // namespace peak_avx2
}  // namespace
}  // namespace folio::kernels::cpu

FOLIO_SIMD_TARGET_END

// ---------------------------------------------------------------------------------------------
// Benchmarks

namespace folio::kernels::cpu {
namespace {

ThreadPool& pool_with(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& pool = pools[threads];
  if (!pool) pool = std::make_unique<ThreadPool>(threads);
  return *pool;
}

// CPU time of every thread of this process (the pool's workers included).
double process_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

enum class Unit { kFma, kInt8Dot };

struct Peak {
  double ops_per_task;
  const char* counter;
  const char* instruction;
};

// What one task of `unit` at `level` computes; instruction is null at the portable level, which
// has no vector peak.
Peak peak_of(Unit unit, SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return unit == Unit::kFma
                 ? Peak{peak_avx512::kFmaFlopsPerTask, "GFLOP/s", "avx512 vfmadd zmm"}
                 : Peak{peak_avx512::kInt8OpsPerTask, "GOPS", "avx512_vnni vpdpbusd zmm"};
    case SimdLevel::kAvx2:
      return unit == Unit::kFma
                 ? Peak{peak_avx2::kFmaFlopsPerTask, "GFLOP/s", "avx2 vfmadd ymm"}
                 : Peak{peak_avx2::kInt8OpsPerTask, "GOPS", "avx2 vpmaddubsw+vpmaddwd ymm"};
    case SimdLevel::kPortable:
      return Peak{0.0, "", nullptr};
  }
  return Peak{0.0, "", nullptr};
}

// One task's result, folded into a double so the benchmark can keep it alive.
double run_task(Unit unit, SimdLevel level, int64_t task) {
  // Inputs the compiler cannot see: a scale just below 1 and a small offset, bytes that vary
  // with the task.
  const float scale = 0.999f - static_cast<float>(task % 7) * 1e-4f;
  const uint8_t unsigned_byte = static_cast<uint8_t>(3 + task % 5);
  const int8_t signed_byte = static_cast<int8_t>(-2 - task % 3);
  switch (level) {
    case SimdLevel::kAvx512:
      return unit == Unit::kFma ? peak_avx512::fma_task(scale, 1e-3f)
                                : peak_avx512::int8_task(unsigned_byte, signed_byte);
    case SimdLevel::kAvx2:
      return unit == Unit::kFma ? peak_avx2::fma_task(scale, 1e-3f)
                                : peak_avx2::int8_task(unsigned_byte, signed_byte);
    case SimdLevel::kPortable:
      return 0.0;
  }
  return 0.0;
}

void peak(benchmark::State& state, Unit unit, int threads) {
  const SimdLevel level = active_simd_level();
  const Peak figure = peak_of(unit, level);
  if (figure.instruction == nullptr) {
    state.SkipWithError("no vector peak at the portable SIMD level");
    return;
  }
  ThreadPool& pool = pool_with(threads);
  const int64_t tasks = int64_t{kTasksPerThread} * threads;
  std::vector<double> results(static_cast<size_t>(tasks));
  double wall_seconds = 0.0;
  const double cpu_start = process_cpu_seconds();
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    pool.parallel_for(tasks, [&](int64_t task, int) {
      results[static_cast<size_t>(task)] = run_task(unit, level, task);
    });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(seconds);
    wall_seconds += seconds;
    benchmark::DoNotOptimize(results.data());
  }
  const double cpu_seconds = process_cpu_seconds() - cpu_start;
  state.counters[figure.counter] =
      benchmark::Counter(figure.ops_per_task * static_cast<double>(tasks) / 1e9,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
  // Of the T cores the pass asked for, the share it got (other processes take the rest on a
  // shared machine): the wall-clock figure divided by it estimates the unloaded peak.
  state.counters["cpu_busy"] = cpu_seconds / (wall_seconds * threads);
  state.SetLabel(figure.instruction);
}

void register_benchmarks() {
  for (int threads : {1, 2}) {
    const std::string suffix = "/threads:" + std::to_string(threads);
    benchmark::RegisterBenchmark(("peak/f32_fma" + suffix).c_str(), peak, Unit::kFma, threads)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("peak/int8_dot" + suffix).c_str(), peak, Unit::kInt8Dot, threads)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace
}  // namespace folio::kernels::cpu

// Folio's own flag, removed from argv before Google Benchmark parses the rest:
//   --simd=avx2  measure the AVX2 instructions on a CPU whose best level is AVX-512
int main(int argc, char** argv) {
  return folio::kernels::cpu::run_kernel_benchmarks(argc, argv,
                                                    folio::kernels::cpu::register_benchmarks);
}
