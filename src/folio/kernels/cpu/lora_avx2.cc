// AVX2 + FMA + F16C LoRA token update: the loops of lora_body.inc over 8-lane vectors. Compiled
// for those extensions only inside this file; called only when the active SimdLevel is kAvx2.
// Tails use maskload / maskstore for f32 and a zero-filled copy for f16, so no byte past a row's
// end is read.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "folio/base/check.h"
#include "folio/kernels/cpu/lora_kernels.h"
#include "folio/kernels/lora.h"

// clang has no `#pragma GCC target`; its own pragma gives every function below the attribute.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace folio::kernels::cpu::internal {
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
  // Masked-off lanes read as 0 and are never touched in memory.
  static Vector load_partial(const float* pointer, int64_t count) {
    return _mm256_maskload_ps(pointer, first_lanes(count));
  }
  static void store(float* pointer, Vector value) { _mm256_storeu_ps(pointer, value); }
  static void store_partial(float* pointer, Vector value, int64_t count) {
    _mm256_maskstore_ps(pointer, first_lanes(count), value);
  }
  static Vector multiply(Vector a, Vector b) { return _mm256_mul_ps(a, b); }
  static Vector fmadd(Vector a, Vector b, Vector c) { return _mm256_fmadd_ps(a, b, c); }
  static float reduce_add(Vector value) {
    __m128 sum = _mm_add_ps(_mm256_castps256_ps128(value), _mm256_extractf128_ps(value, 1));
    sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
    sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
    return _mm_cvtss_f32(sum);
  }

  static Vector load_f16(const std::byte* pointer) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pointer)));
  }
  static Vector load_f16_partial(const std::byte* pointer, int64_t count) {
    alignas(16) std::byte buffer[kWidth * 2] = {};
    std::memcpy(buffer, pointer, static_cast<size_t>(count) * 2);
    return load_f16(buffer);
  }
  static Vector load_int8(const std::byte* pointer) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(pointer))));
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

void lora_token_avx2(const LoraSlotWeights& weights, int64_t input_features,
                     int64_t output_features, const float* input, const float* base, float* output,
                     float* low_rank) {
  token_update_any_format(weights, input_features, output_features, input, base, output, low_rank);
}

}  // namespace folio::kernels::cpu::internal
