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
#include <string>
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

// AMX int8 tiles (Sapphire Rapids and later) beside the AVX-512 level: q8_0's matmul takes its
// tiles of 16 rows of x through them (matmul_q8_0_avx512.cc), with the same results bit for bit
// as without, so they are a speed option rather than a level. Available when the CPU has
// AMX-TILE and AMX-INT8 and Linux granted this process the tile data state
// (arch_prctl(ARCH_REQ_XCOMP_PERM), asked once, here).
bool cpu_has_amx_int8();
// Whether kernels launched from now on use AMX: cpu_has_amx_int8() unless overridden. Read once
// per launch, like the level (a captured launch keeps what it was captured with).
bool amx_enabled();
// For tests and benchmarks. Requires: !enabled or cpu_has_amx_int8().
void set_amx_enabled(bool enabled);

// What kernels launched now run on, for reports: the active level's name, "+amx" when AMX is
// enabled at the AVX-512 level ("avx512+amx").
std::string active_kernels_name();

// Sets amx_enabled for its lifetime and restores the previous value after.
class ScopedAmxEnabled {
 public:
  explicit ScopedAmxEnabled(bool enabled) : previous_(amx_enabled()) { set_amx_enabled(enabled); }
  ~ScopedAmxEnabled() { set_amx_enabled(previous_); }
  ScopedAmxEnabled(const ScopedAmxEnabled&) = delete;
  ScopedAmxEnabled& operator=(const ScopedAmxEnabled&) = delete;

 private:
  bool previous_;
};

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
