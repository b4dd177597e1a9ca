// The AVX2 path of VectorOps: 8 f32 lanes, FMA, F16C conversions. Compiled for those extensions
// only inside this file (#pragma GCC target); called only when simd_path_supported(kAvx2).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "folio/kernels/cpu/vector_ops.h"

// clang has no `#pragma GCC target`; its own pragma gives every function below the attribute.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace folio::kernels::cpu::avx2_path {
namespace {

struct Simd {
  using Vector = __m256;
  static constexpr int64_t kWidth = 8;

  // All ones in lanes [0, count).
  static __m256i first_lanes(int64_t count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }

  static Vector zero() { return _mm256_setzero_ps(); }
  static Vector broadcast(float value) { return _mm256_set1_ps(value); }
  static Vector load(const float* pointer) { return _mm256_loadu_ps(pointer); }
  static Vector load(const uint16_t* pointer) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pointer)));
  }
  static Vector load_partial(const float* pointer, int64_t count, float fill = 0.0f) {
    const __m256i mask = first_lanes(count);
    return _mm256_blendv_ps(broadcast(fill), _mm256_maskload_ps(pointer, mask),
                            _mm256_castsi256_ps(mask));
  }
  static Vector load_partial(const uint16_t* pointer, int64_t count) {
    alignas(16) uint16_t buffer[kWidth] = {};
    std::memcpy(buffer, pointer, static_cast<size_t>(count) * sizeof(uint16_t));
    return load(buffer);
  }
  static void store(float* pointer, Vector value) { _mm256_storeu_ps(pointer, value); }
  static void store_partial(float* pointer, Vector value, int64_t count) {
    _mm256_maskstore_ps(pointer, first_lanes(count), value);
  }
  static void store_f16(uint16_t* pointer, Vector value) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(pointer),
                     _mm256_cvtps_ph(value, _MM_FROUND_TO_NEAREST_INT));
  }
  static void store_f16_partial(uint16_t* pointer, Vector value, int64_t count) {
    alignas(16) uint16_t buffer[kWidth];
    store_f16(buffer, value);
    std::memcpy(pointer, buffer, static_cast<size_t>(count) * sizeof(uint16_t));
  }
  static Vector keep_first(Vector value, int64_t count) {
    return _mm256_and_ps(value, _mm256_castsi256_ps(first_lanes(count)));
  }

  static Vector add(Vector a, Vector b) { return _mm256_add_ps(a, b); }
  static Vector subtract(Vector a, Vector b) { return _mm256_sub_ps(a, b); }
  static Vector multiply(Vector a, Vector b) { return _mm256_mul_ps(a, b); }
  static Vector divide(Vector a, Vector b) { return _mm256_div_ps(a, b); }
  static Vector fmadd(Vector a, Vector b, Vector c) { return _mm256_fmadd_ps(a, b, c); }
  static Vector max(Vector a, Vector b) { return _mm256_max_ps(a, b); }

  static float reduce_add(Vector value) {
    __m128 sum = _mm_add_ps(_mm256_castps256_ps128(value), _mm256_extractf128_ps(value, 1));
    sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
    sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
    return _mm_cvtss_f32(sum);
  }
  static float reduce_max(Vector value) {
    __m128 best = _mm_max_ps(_mm256_castps256_ps128(value), _mm256_extractf128_ps(value, 1));
    best = _mm_max_ps(best, _mm_movehl_ps(best, best));
    best = _mm_max_ss(best, _mm_movehdup_ps(best));
    return _mm_cvtss_f32(best);
  }

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

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace folio::kernels::cpu::detail {
const VectorOps& avx2_vector_ops() {
  return avx2_path::kTable;
}
}  // namespace folio::kernels::cpu::detail
