// SimdLevel: which vector instruction set the CPU kernels use. Kernels are compiled for every
// level (with per-function target attributes, never global -m flags) and the level is chosen
// at run time, once per launch: the best the CPU supports unless a test or benchmark forces a
// lower one to exercise every path on one machine.
//
//   kPortable: plain C++, any CPU.
//   kAvx2:     AVX2 + FMA + F16C (Haswell and later, Zen).
//   kAvx512:   AVX-512 F/BW/VL/DQ + VNNI (Ice Lake, Sapphire Rapids, Zen 4 and later).
//
// Thread-safety: all functions may be called from any thread. The active level is one relaxed
// atomic: it publishes no other data, and a launch reads it once, so a kernel never mixes
// levels (a captured launch keeps the level it was captured with).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace folio::kernels::cpu {

enum class SimdLevel : uint8_t { kPortable, kAvx2, kAvx512 };

std::string_view simd_level_name(SimdLevel level);

// Whether the CPU converts between f16 and f32 in hardware (F16C). Read from CPUID because
// clang's __builtin_cpu_supports does not know the feature.
bool cpu_has_f16c();

// The best level this CPU supports, detected once.
SimdLevel detected_simd_level();

// Every level this CPU can run, kPortable first.
std::vector<SimdLevel> supported_simd_levels();

// The level kernels launched from now on use; detected_simd_level() unless overridden.
SimdLevel active_simd_level();

// For tests and benchmarks. Requires: level is supported by this CPU.
void set_active_simd_level(SimdLevel level);

// Sets the active level for its lifetime and restores the previous one after.
class ScopedSimdLevel {
 public:
  explicit ScopedSimdLevel(SimdLevel level) : previous_(active_simd_level()) {
    set_active_simd_level(level);
  }
  ~ScopedSimdLevel() { set_active_simd_level(previous_); }
  ScopedSimdLevel(const ScopedSimdLevel&) = delete;
  ScopedSimdLevel& operator=(const ScopedSimdLevel&) = delete;

 private:
  SimdLevel previous_;
};

}  // namespace folio::kernels::cpu
