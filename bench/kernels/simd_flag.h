// The kernel benchmarks' --simd flag: --simd=portable|avx2 runs the kernels at a lower SIMD
// level than the CPU's best, so every path can be measured on one machine.
#pragma once

#include <string_view>

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

}  // namespace folio::kernels::cpu
