#include "folio/kernels/cpu/simd_level.h"

#include <atomic>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
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

bool detect_amx_int8() {
#if defined(__linux__) && defined(__x86_64__)
  if (detected_simd_level() != SimdLevel::kAvx512) return false;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  constexpr unsigned kAmxTile = 1u << 24;  // CPUID.(7,0).EDX
  constexpr unsigned kAmxInt8 = 1u << 25;
  if ((edx & kAmxTile) == 0 || (edx & kAmxInt8) == 0) return false;
  // Linux hands out the 8 KiB tile data state only on request; without it the first tile
  // instruction faults.
  constexpr long kRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
  constexpr long kTileData = 18;               // XFEATURE_XTILEDATA
  return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
#else
  return false;
#endif
}

// Relaxed, as the level.
std::atomic<bool>& amx_setting() {
  static std::atomic<bool> enabled{cpu_has_amx_int8()};
  return enabled;
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

bool cpu_has_amx_int8() {
  static const bool available = detect_amx_int8();
  return available;
}

bool amx_enabled() {
  return amx_setting().load(std::memory_order_relaxed);
}

void set_amx_enabled(bool enabled) {
  FOLIO_CHECK(!enabled || cpu_has_amx_int8(), "AMX int8 is not available on this CPU");
  amx_setting().store(enabled, std::memory_order_relaxed);
}

std::string active_kernels_name() {
  const SimdLevel level = active_simd_level();
  std::string name(simd_level_name(level));
  if (level == SimdLevel::kAvx512 && amx_enabled()) name += "+amx";
  return name;
}

}  // namespace folio::kernels::cpu
