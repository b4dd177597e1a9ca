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
#include <cstdint>
#include <cstring>
#include <limits>

#include "folio/kernels/cpu/vector_ops.h"

// clang has no `#pragma GCC target`; its own pragma gives every function below the attribute.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
#endif

namespace folio::kernels::cpu::avx512_path {
namespace {

struct Simd {
  using Vector = __m512;
  static constexpr int64_t kWidth = 16;

  // Lanes [0, count). Requires: 0 <= count <= 16.
  static __mmask16 first_lanes(int64_t count) { return static_cast<__mmask16>((1u << count) - 1u); }

  static Vector zero() { return _mm512_setzero_ps(); }
  static Vector broadcast(float value) { return _mm512_set1_ps(value); }
  static Vector load(const float* pointer) { return _mm512_loadu_ps(pointer); }
  static Vector load(const uint16_t* pointer) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pointer)));
  }
  static Vector load_partial(const float* pointer, int64_t count, float fill = 0.0f) {
    return _mm512_mask_loadu_ps(broadcast(fill), first_lanes(count), pointer);
  }
  static Vector load_partial(const uint16_t* pointer, int64_t count) {
    alignas(32) uint16_t buffer[kWidth] = {};
    std::memcpy(buffer, pointer, static_cast<size_t>(count) * sizeof(uint16_t));
    return load(buffer);
  }
  static void store(float* pointer, Vector value) { _mm512_storeu_ps(pointer, value); }
  static void store_partial(float* pointer, Vector value, int64_t count) {
    _mm512_mask_storeu_ps(pointer, first_lanes(count), value);
  }
  static void store_f16(uint16_t* pointer, Vector value) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pointer),
                        _mm512_cvtps_ph(value, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store_f16_partial(uint16_t* pointer, Vector value, int64_t count) {
    alignas(32) uint16_t buffer[kWidth];
    store_f16(buffer, value);
    std::memcpy(pointer, buffer, static_cast<size_t>(count) * sizeof(uint16_t));
  }
  static Vector keep_first(Vector value, int64_t count) {
    return _mm512_maskz_mov_ps(first_lanes(count), value);
  }

  static Vector add(Vector a, Vector b) { return _mm512_add_ps(a, b); }
  static Vector subtract(Vector a, Vector b) { return _mm512_sub_ps(a, b); }
  static Vector multiply(Vector a, Vector b) { return _mm512_mul_ps(a, b); }
  static Vector divide(Vector a, Vector b) { return _mm512_div_ps(a, b); }
  static Vector fmadd(Vector a, Vector b, Vector c) { return _mm512_fmadd_ps(a, b, c); }
  static Vector max(Vector a, Vector b) { return _mm512_max_ps(a, b); }
  static float reduce_add(Vector value) { return _mm512_reduce_add_ps(value); }
  static float reduce_max(Vector value) { return _mm512_reduce_max_ps(value); }

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

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace folio::kernels::cpu::detail {
const VectorOps& avx512_vector_ops() {
  return avx512_path::kTable;
}
}  // namespace folio::kernels::cpu::detail

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
