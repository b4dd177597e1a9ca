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

  // Lane p of the result is reduce_add(v[p]), bit for bit: the same pairing tree as
  // _mm512_reduce_add_ps (lanes i and i + 8, then i and i + 4, then i and i + 2, then i and
  // i + 1; addition is commutative, so only the pairing matters), applied to kWidth vectors at
  // once while transposing them: 15 additions and 30 shuffles instead of kWidth horizontal sums.
  [[gnu::always_inline]] static Vector reduce_add_lanes(const Vector* v) {
    // The tree leaves the sum of its input n = 4j + k in lane 4k + j; feeding it
    // v[4 (n % 4) + n / 4] as input n puts reduce_add(v[p]) in lane p.
    const auto input = [&](int n) { return v[4 * (n % 4) + n / 4]; };
    Vector halves[8];  // halves[m]: inputs 2m and 2m + 1, eight partial sums each
    for (int m = 0; m < 8; ++m) {
      const Vector a = input(2 * m);
      const Vector b = input(2 * m + 1);
      halves[m] = add(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                      _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    Vector quarters[4];  // quarters[m]: inputs 4m .. 4m + 3, four partial sums each
    for (int m = 0; m < 4; ++m) {
      const Vector a = halves[2 * m];
      const Vector b = halves[2 * m + 1];
      quarters[m] = add(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                        _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
    }
    Vector eighths[2];
    for (int m = 0; m < 2; ++m) {
      const Vector a = quarters[2 * m];
      const Vector b = quarters[2 * m + 1];
      eighths[m] = add(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    return add(_mm512_shuffle_ps(eighths[0], eighths[1], _MM_SHUFFLE(2, 0, 2, 0)),
               _mm512_shuffle_ps(eighths[0], eighths[1], _MM_SHUFFLE(3, 1, 3, 1)));
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
