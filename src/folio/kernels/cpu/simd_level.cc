#include "folio/kernels/cpu/simd_level.h"

#include <atomic>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "folio/base/check.h"

namespace folio::kernels::cpu {

bool cpu_has_f16c() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (ecx & bit_F16C) != 0;
#else
  return false;
#endif
}

namespace {

SimdLevel detect() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni") && cpu_has_f16c() && __builtin_cpu_supports("fma")) {
    return SimdLevel::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c()) {
    return SimdLevel::kAvx2;
  }
#endif
  return SimdLevel::kPortable;
}

// Relaxed: the level is a standalone setting that publishes no other data.
std::atomic<SimdLevel>& active_level() {
  static std::atomic<SimdLevel> level{detected_simd_level()};
  return level;
}

}  // namespace

std::string_view simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kPortable:
      return "portable";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "invalid";
}

SimdLevel detected_simd_level() {
  static const SimdLevel level = detect();
  return level;
}

std::vector<SimdLevel> supported_simd_levels() {
  std::vector<SimdLevel> levels;
  for (SimdLevel level : {SimdLevel::kPortable, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (level <= detected_simd_level()) levels.push_back(level);
  }
  return levels;
}

SimdLevel active_simd_level() {
  return active_level().load(std::memory_order_relaxed);
}

void set_active_simd_level(SimdLevel level) {
  FOLIO_CHECK(level <= detected_simd_level(),
              "SIMD level {} is not supported by this CPU (best: {})", simd_level_name(level),
              simd_level_name(detected_simd_level()));
  active_level().store(level, std::memory_order_relaxed);
}

}  // namespace folio::kernels::cpu
