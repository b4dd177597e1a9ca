// The AVX2 path of VectorOps: 8 f32 lanes, FMA, F16C conversions. Compiled for those extensions
// only inside this file (#pragma GCC target); called only when simd_path_supported(kAvx2).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "folio/kernels/cpu/simd_target.h"
#include "folio/kernels/cpu/vector_ops.h"

FOLIO_SIMD_TARGET_BEGIN("avx2,fma,f16c")

namespace folio::kernels::cpu::avx2_path {
namespace {

#include "folio/kernels/cpu/simd_avx2.inc"

struct Simd : SimdAvx2 {
  // exp(x) as in Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial for e^r,
  // then 2^n through the exponent bits. Relative error about 2 ulp. Saturates at exp(88) above
  // 88, returns 0 below ln(FLT_MIN) (no subnormal results), propagates NaN.
  static Vector exp(Vector x) {
    const Vector clamped = _mm256_max_ps(broadcast(-88.0f), _mm256_min_ps(broadcast(88.0f), x));
    const Vector n = _mm256_round_ps(multiply(clamped, broadcast(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    Vector r = _mm256_fnmadd_ps(n, broadcast(0.693359375f), clamped);
    r = _mm256_fnmadd_ps(n, broadcast(-2.12194440e-4f), r);
    Vector p = broadcast(1.9875691500e-4f);
    p = fmadd(p, r, broadcast(1.3981999507e-3f));
    p = fmadd(p, r, broadcast(8.3334519073e-3f));
    p = fmadd(p, r, broadcast(4.1665795894e-2f));
    p = fmadd(p, r, broadcast(1.6666665459e-1f));
    p = fmadd(p, r, broadcast(5.0000001201e-1f));
    p = fmadd(p, multiply(r, r), add(r, broadcast(1.0f)));
    const __m256i exponent =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const Vector result = multiply(p, _mm256_castsi256_ps(exponent));
    const Vector underflow = _mm256_cmp_ps(x, broadcast(-87.33654475f), _CMP_LT_OQ);
    return _mm256_andnot_ps(underflow, result);
  }

  // Lane p of the result is reduce_add(v[p]), bit for bit: the same pairing tree as
  // reduce_add (lanes i and i + 4, then i and i + 2, then i and i + 1; addition is commutative,
  // so only the pairing matters), applied to kWidth vectors at once while transposing them.
  [[gnu::always_inline]] static Vector reduce_add_lanes(const Vector* v) {
    // The tree leaves the sum of its input n = 2j + k in lane 4k + j; feeding it
    // v[4 (n % 2) + n / 2] as input n puts reduce_add(v[p]) in lane p.
    const auto input = [&](int n) { return v[4 * (n % 2) + n / 2]; };
    Vector halves[4];  // halves[m]: inputs 2m and 2m + 1, four partial sums each
    for (int m = 0; m < 4; ++m) {
      const Vector a = input(2 * m);
      const Vector b = input(2 * m + 1);
      halves[m] = add(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    }
    Vector quarters[2];
    for (int m = 0; m < 2; ++m) {
      const Vector a = halves[2 * m];
      const Vector b = halves[2 * m + 1];
      quarters[m] = add(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                        _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    return add(_mm256_shuffle_ps(quarters[0], quarters[1], _MM_SHUFFLE(2, 0, 2, 0)),
               _mm256_shuffle_ps(quarters[0], quarters[1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
};

#include "folio/kernels/cpu/vector_ops_body.inc"

constexpr VectorOps kTable = make_vector_ops(SimdPath::kAvx2);

}  // namespace
}  // namespace folio::kernels::cpu::avx2_path

FOLIO_SIMD_TARGET_END

namespace folio::kernels::cpu::detail {
const VectorOps& avx2_vector_ops() {
  return avx2_path::kTable;
}
}  // namespace folio::kernels::cpu::detail
