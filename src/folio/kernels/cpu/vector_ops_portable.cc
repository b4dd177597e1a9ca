// The portable path of VectorOps: plain C++ over eight-float arrays, no instruction-set
// extension. It is the fallback for CPUs without AVX2 and, in tests, a third implementation to
// compare against.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "folio/kernels/cpu/vector_ops.h"
#include "folio/tensor/half.h"

namespace folio::kernels::cpu::portable_path {
namespace {

// Eight lanes in plain arrays: the same lane count and reduction tree as the AVX2 path, so
// long sums keep their accuracy (a one-lane running sum over a 32k vocabulary would lose ~1e-5),
// and simple enough loops for the compiler to vectorize with the baseline SSE2.
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
  static Vector load(const uint16_t* pointer) {
    return map([&](int64_t i) { return ::folio::f16_to_f32(pointer[i]); });
  }
  static Vector load_partial(const float* pointer, int64_t count, float fill = 0.0f) {
    return map([&](int64_t i) { return i < count ? pointer[i] : fill; });
  }
  static Vector load_partial(const uint16_t* pointer, int64_t count) {
    return map([&](int64_t i) { return i < count ? ::folio::f16_to_f32(pointer[i]) : 0.0f; });
  }
  static void store(float* pointer, const Vector& value) {
    for (int64_t i = 0; i < kWidth; ++i) pointer[i] = value.lane[i];
  }
  static void store_partial(float* pointer, const Vector& value, int64_t count) {
    for (int64_t i = 0; i < count; ++i) pointer[i] = value.lane[i];
  }
  static void store_f16(uint16_t* pointer, const Vector& value) {
    store_f16_partial(pointer, value, kWidth);
  }
  static void store_f16_partial(uint16_t* pointer, const Vector& value, int64_t count) {
    for (int64_t i = 0; i < count; ++i) pointer[i] = ::folio::f32_to_f16(value.lane[i]);
  }
  static Vector keep_first(const Vector& value, int64_t count) {
    return map([&](int64_t i) { return i < count ? value.lane[i] : 0.0f; });
  }

  static Vector add(const Vector& a, const Vector& b) {
    return map([&](int64_t i) { return a.lane[i] + b.lane[i]; });
  }
  static Vector subtract(const Vector& a, const Vector& b) {
    return map([&](int64_t i) { return a.lane[i] - b.lane[i]; });
  }
  static Vector multiply(const Vector& a, const Vector& b) {
    return map([&](int64_t i) { return a.lane[i] * b.lane[i]; });
  }
  static Vector divide(const Vector& a, const Vector& b) {
    return map([&](int64_t i) { return a.lane[i] / b.lane[i]; });
  }
  // Multiply then add, rounding twice: there is no fused multiply-add in baseline x86-64.
  static Vector fmadd(const Vector& a, const Vector& b, const Vector& c) {
    return map([&](int64_t i) { return a.lane[i] * b.lane[i] + c.lane[i]; });
  }
  // b when a is NaN, like MAXPS.
  static Vector max(const Vector& a, const Vector& b) {
    return map([&](int64_t i) { return a.lane[i] > b.lane[i] ? a.lane[i] : b.lane[i]; });
  }
  // The AVX2 path's tree: halves, then quarters, then the last pair.
  static float reduce_add(const Vector& value) {
    float quarter[4];
    for (int i = 0; i < 4; ++i) quarter[i] = value.lane[i] + value.lane[i + 4];
    return (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
  }
  static float reduce_max(const Vector& value) {
    float best = value.lane[0];
    for (int64_t i = 1; i < kWidth; ++i) best = value.lane[i] > best ? value.lane[i] : best;
    return best;
  }
  static Vector exp(const Vector& value) {
    return map([&](int64_t i) { return std::exp(value.lane[i]); });
  }
};

#include "folio/kernels/cpu/vector_ops_body.inc"

constexpr VectorOps kTable = make_vector_ops(SimdPath::kPortable);

}  // namespace
}  // namespace folio::kernels::cpu::portable_path

namespace folio::kernels::cpu::detail {
const VectorOps& portable_vector_ops() {
  return portable_path::kTable;
}
}  // namespace folio::kernels::cpu::detail
