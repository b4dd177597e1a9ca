// The AVX-512 path of VectorOps: 16 f32 lanes with masked loads and stores for the tails.
// Compiled for AVX-512F only inside this file (#pragma GCC target); called only when
// simd_path_supported(kAvx512).

// GCC 12's AVX-512 intrinsics seed unmasked operations with _mm512_undefined_*(), which
// -Wuninitialized reports inside the intrinsic header once inlined here (GCC bug 105593, fixed
// in GCC 13). The diagnostics are silenced for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "folio/kernels/cpu/simd_target.h"
#include "folio/kernels/cpu/vector_ops.h"

FOLIO_SIMD_TARGET_BEGIN("avx512f,avx2,fma,f16c")

namespace folio::kernels::cpu::avx512_path {
namespace {

#include "folio/kernels/cpu/simd_avx512.inc"

struct Simd : SimdAvx512 {
  // exp(x) with the same range reduction and polynomial as the AVX2 path (Cephes' expf);
  // 2^n applied with scalef. Saturates at exp(88), 0 below ln(FLT_MIN), propagates NaN.
  static Vector exp(Vector x) {
    const Vector clamped = _mm512_max_ps(broadcast(-88.0f), _mm512_min_ps(broadcast(88.0f), x));
    const Vector n = _mm512_roundscale_ps(multiply(clamped, broadcast(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    Vector r = _mm512_fnmadd_ps(n, broadcast(0.693359375f), clamped);
    r = _mm512_fnmadd_ps(n, broadcast(-2.12194440e-4f), r);
    Vector p = broadcast(1.9875691500e-4f);
    p = fmadd(p, r, broadcast(1.3981999507e-3f));
    p = fmadd(p, r, broadcast(8.3334519073e-3f));
    p = fmadd(p, r, broadcast(4.1665795894e-2f));
    p = fmadd(p, r, broadcast(1.6666665459e-1f));
    p = fmadd(p, r, broadcast(5.0000001201e-1f));
    p = fmadd(p, multiply(r, r), add(r, broadcast(1.0f)));
    const Vector result = _mm512_scalef_ps(p, n);
    const __mmask16 underflow = _mm512_cmp_ps_mask(x, broadcast(-87.33654475f), _CMP_LT_OQ);
    return _mm512_mask_mov_ps(result, underflow, zero());
  }
};

#include "folio/kernels/cpu/vector_ops_body.inc"

constexpr VectorOps kTable = make_vector_ops(SimdPath::kAvx512);

}  // namespace
}  // namespace folio::kernels::cpu::avx512_path

FOLIO_SIMD_TARGET_END

namespace folio::kernels::cpu::detail {
const VectorOps& avx512_vector_ops() {
  return avx512_path::kTable;
}
}  // namespace folio::kernels::cpu::detail

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
