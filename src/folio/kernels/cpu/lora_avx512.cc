// AVX-512 LoRA token update (F/BW/VL + F16C + FMA): the loops of lora_body.inc over 16-lane
// vectors with masked tails. Compiled for those extensions only inside this file, so the rest
// of the binary still runs on any x86-64; called only when the active SimdLevel is kAvx512.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "folio/base/check.h"
#include "folio/kernels/cpu/lora_kernels.h"
#include "folio/kernels/lora.h"

// GCC 12 warns inside its own intrinsics (_mm512_undefined_ps and friends) when they are
// inlined into target-specific functions (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// clang has no `#pragma GCC target`; its own pragma gives every function below the attribute.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,fma,f16c")
#endif

namespace folio::kernels::cpu::internal {
namespace {

struct Simd {
  using Vector = __m512;
  static constexpr int64_t kWidth = 16;

  // Lanes [0, count) set. Requires: 0 <= count <= 16.
  static __mmask16 first_lanes(int64_t count) { return static_cast<__mmask16>((1u << count) - 1u); }

  static Vector zero() { return _mm512_setzero_ps(); }
  static Vector broadcast(float value) { return _mm512_set1_ps(value); }
  static Vector load(const float* pointer) { return _mm512_loadu_ps(pointer); }
  static Vector load_partial(const float* pointer, int64_t count) {
    return _mm512_maskz_loadu_ps(first_lanes(count), pointer);
  }
  static void store(float* pointer, Vector value) { _mm512_storeu_ps(pointer, value); }
  static void store_partial(float* pointer, Vector value, int64_t count) {
    _mm512_mask_storeu_ps(pointer, first_lanes(count), value);
  }
  static Vector multiply(Vector a, Vector b) { return _mm512_mul_ps(a, b); }
  static Vector fmadd(Vector a, Vector b, Vector c) { return _mm512_fmadd_ps(a, b, c); }
  static float reduce_add(Vector value) { return _mm512_reduce_add_ps(value); }

  static Vector load_f16(const std::byte* pointer) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pointer)));
  }
  // A masked load: no byte past the row's end is touched.
  static Vector load_f16_partial(const std::byte* pointer, int64_t count) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(first_lanes(count), pointer));
  }
  static Vector load_int8(const std::byte* pointer) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pointer))));
  }
};

#include "folio/kernels/cpu/lora_body.inc"

}  // namespace
}  // namespace folio::kernels::cpu::internal

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace folio::kernels::cpu::internal {

void lora_token_avx512(const LoraSlotWeights& weights, int64_t input_features,
                       int64_t output_features, const float* input, const float* base,
                       float* output, float* low_rank) {
  token_update_any_format(weights, input_features, output_features, input, base, output, low_rank);
}

}  // namespace folio::kernels::cpu::internal
