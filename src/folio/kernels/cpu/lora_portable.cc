// Portable LoRA token update (any CPU): the loops of lora_body.inc over eight-float arrays, the
// lane count and reduction tree of the AVX2 path, with multiply then add (two roundings: there
// is no fused multiply-add in baseline x86-64).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "folio/base/check.h"
#include "folio/kernels/cpu/lora_kernels.h"
#include "folio/kernels/lora.h"
#include "folio/tensor/half.h"

namespace folio::kernels::cpu::internal {
namespace {

struct Simd {
  static constexpr int64_t kWidth = 8;
  struct Vector {
    float lane[kWidth];
  };

  template <typename Function>
  static Vector map(Function function) {
    Vector result;
    for (int64_t i = 0; i < kWidth; ++i) result.lane[i] = function(i);
    return result;
  }

  static Vector zero() { return broadcast(0.0f); }
  static Vector broadcast(float value) {
    return map([&](int64_t) { return value; });
  }
  static Vector load(const float* pointer) {
    return map([&](int64_t i) { return pointer[i]; });
  }
  static Vector load_partial(const float* pointer, int64_t count) {
    return map([&](int64_t i) { return i < count ? pointer[i] : 0.0f; });
  }
  static void store(float* pointer, const Vector& value) {
    for (int64_t i = 0; i < kWidth; ++i) pointer[i] = value.lane[i];
  }
  static void store_partial(float* pointer, const Vector& value, int64_t count) {
    for (int64_t i = 0; i < count; ++i) pointer[i] = value.lane[i];
  }
  static Vector multiply(const Vector& a, const Vector& b) {
    return map([&](int64_t i) { return a.lane[i] * b.lane[i]; });
  }
  static Vector fmadd(const Vector& a, const Vector& b, const Vector& c) {
    return map([&](int64_t i) { return a.lane[i] * b.lane[i] + c.lane[i]; });
  }
  // The AVX2 path's tree: halves, then quarters, then the last pair.
  static float reduce_add(const Vector& value) {
    float quarter[4];
    for (int i = 0; i < 4; ++i) quarter[i] = value.lane[i] + value.lane[i + 4];
    return (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
  }

  // Weights may sit at any byte address: read through memcpy.
  static float f16_at(const std::byte* pointer, int64_t index) {
    uint16_t bits;
    std::memcpy(&bits, pointer + index * 2, sizeof(bits));
    return ::folio::f16_to_f32(bits);
  }
  static Vector load_f16(const std::byte* pointer) {
    return map([&](int64_t i) { return f16_at(pointer, i); });
  }
  static Vector load_f16_partial(const std::byte* pointer, int64_t count) {
    return map([&](int64_t i) { return i < count ? f16_at(pointer, i) : 0.0f; });
  }
  static Vector load_int8(const std::byte* pointer) {
    return map([&](int64_t i) {
      return static_cast<float>(static_cast<int8_t>(std::to_integer<uint8_t>(pointer[i])));
    });
  }
};

#include "folio/kernels/cpu/lora_body.inc"

}  // namespace

void lora_token_portable(const LoraSlotWeights& weights, int64_t input_features,
                         int64_t output_features, const float* input, const float* base,
                         float* output, float* low_rank) {
  token_update_any_format(weights, input_features, output_features, input, base, output, low_rank);
}

}  // namespace folio::kernels::cpu::internal
