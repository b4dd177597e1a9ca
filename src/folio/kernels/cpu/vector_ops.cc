#include "folio/kernels/cpu/vector_ops.h"

#include <atomic>

#include "folio/base/check.h"
#include "folio/kernels/cpu/simd_level.h"

namespace folio::kernels::cpu {
namespace {

// The active table. Written only by set_simd_path_for_testing (while no kernel runs) and read
// at the start of each kernel body; the tables are immutable statics, so relaxed suffices.
std::atomic<const VectorOps*>& active_table() {
  static std::atomic<const VectorOps*> table{&vector_ops_for(best_simd_path())};
  return table;
}

}  // namespace

std::string_view simd_path_name(SimdPath path) {
  switch (path) {
    case SimdPath::kPortable:
      return "portable";
    case SimdPath::kAvx2:
      return "avx2";
    case SimdPath::kAvx512:
      return "avx512";
  }
  return "invalid";
}

bool simd_path_supported(SimdPath path) {
  switch (path) {
    case SimdPath::kPortable:
      return true;
    case SimdPath::kAvx2:
#if defined(__x86_64__)
      // libgcc's detection also checks that the OS saves the YMM/ZMM state (XGETBV).
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
#else
      return false;
#endif
    case SimdPath::kAvx512:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx512f") && simd_path_supported(SimdPath::kAvx2);
#else
      return false;
#endif
  }
  return false;
}

SimdPath best_simd_path() {
  if (simd_path_supported(SimdPath::kAvx512)) return SimdPath::kAvx512;
  if (simd_path_supported(SimdPath::kAvx2)) return SimdPath::kAvx2;
  return SimdPath::kPortable;
}

const VectorOps& vector_ops_for(SimdPath path) {
  FOLIO_CHECK(simd_path_supported(path), "SIMD path {} is not supported on this CPU",
              simd_path_name(path));
  switch (path) {
    case SimdPath::kPortable:
      return detail::portable_vector_ops();
    case SimdPath::kAvx2:
      return detail::avx2_vector_ops();
    case SimdPath::kAvx512:
      return detail::avx512_vector_ops();
  }
  FOLIO_UNREACHABLE("invalid SIMD path");
}

const VectorOps& vector_ops() {
  return *active_table().load(std::memory_order_relaxed);
}

SimdPath active_simd_path() {
  return vector_ops().path;
}

void set_simd_path_for_testing(SimdPath path) {
  active_table().store(&vector_ops_for(path), std::memory_order_relaxed);
}

}  // namespace folio::kernels::cpu
