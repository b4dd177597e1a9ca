// The kernel benchmarks' --simd flag: --simd=portable|avx2 runs the kernels at a lower SIMD
// level than the CPU's best, so every path can be measured on one machine.
#pragma once

#include <string_view>

#include <benchmark/benchmark.h>

#include "folio/kernels/cpu/simd_level.h"

namespace folio::kernels::cpu {

// Applies `argument` when it is the --simd flag and returns whether it was.
inline bool take_simd_flag(std::string_view argument) {
  if (argument == "--simd=portable") {
    set_active_simd_level(SimdLevel::kPortable);
    return true;
  }
  if (argument == "--simd=avx2") {
    set_active_simd_level(SimdLevel::kAvx2);
    return true;
  }
  return false;
}

// A kernel benchmark's main: removes the --simd flag from argv, then registers the benchmarks
// and runs the ones Google Benchmark's own flags select.
inline int run_kernel_benchmarks(int argc, char** argv, void (*register_benchmarks)()) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (!take_simd_flag(argv[i])) argv[kept++] = argv[i];
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace folio::kernels::cpu
