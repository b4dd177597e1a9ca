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
