// The portable path of VectorOps: one lane, plain C++, no instruction-set extension. It is the
// fallback for CPUs without AVX2 and, in tests, a third implementation to compare against.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "folio/kernels/cpu/vector_ops.h"
#include "folio/tensor/half.h"

namespace folio::kernels::cpu::portable_path {
namespace {

struct Simd {
  using Vector = float;
  static constexpr int64_t kWidth = 1;

  static Vector zero() { return 0.0f; }
  static Vector broadcast(float value) { return value; }
  static Vector load(const float* pointer) { return *pointer; }
  static Vector load(const uint16_t* pointer) { return ::folio::f16_to_f32(*pointer); }
  // With one lane a partial vector never occurs (every count is a multiple of kWidth); these
  // exist so the shared loops compile.
  static Vector load_partial(const float* pointer, int64_t count, float fill = 0.0f) {
    return count > 0 ? *pointer : fill;
  }
  static Vector load_partial(const uint16_t* pointer, int64_t count) {
    return count > 0 ? ::folio::f16_to_f32(*pointer) : 0.0f;
  }
  static void store(float* pointer, Vector value) { *pointer = value; }
  static void store_partial(float* pointer, Vector value, int64_t count) {
    if (count > 0) *pointer = value;
  }
  static void store_f16(uint16_t* pointer, Vector value) { *pointer = ::folio::f32_to_f16(value); }
  static void store_f16_partial(uint16_t* pointer, Vector value, int64_t count) {
    if (count > 0) store_f16(pointer, value);
  }
  static Vector keep_first(Vector value, int64_t count) { return count > 0 ? value : 0.0f; }

  static Vector add(Vector a, Vector b) { return a + b; }
  static Vector subtract(Vector a, Vector b) { return a - b; }
  static Vector multiply(Vector a, Vector b) { return a * b; }
  static Vector divide(Vector a, Vector b) { return a / b; }
  static Vector fmadd(Vector a, Vector b, Vector c) { return a * b + c; }
  static Vector max(Vector a, Vector b) { return a > b ? a : b; }
  static float reduce_add(Vector value) { return value; }
  static float reduce_max(Vector value) { return value; }
  static Vector exp(Vector value) { return std::exp(value); }
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
