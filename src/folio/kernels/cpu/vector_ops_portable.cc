// The portable path of VectorOps: plain C++ over eight-float arrays, no instruction-set
// extension. It is the fallback for CPUs without AVX2 and, in tests, a third implementation to
// compare against.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "folio/kernels/cpu/vector_ops.h"
#include "folio/tensor/half.h"

namespace folio::kernels::cpu::portable_path {
namespace {

#include "folio/kernels/cpu/simd_portable.inc"

struct Simd : SimdPortable {
  static Vector exp(const Vector& value) {
    return map([&](int64_t i) { return std::exp(value.lane[i]); });
  }
  // Lane p of the result is reduce_add(v[p]).
  static Vector reduce_add_lanes(const Vector* v) {
    return map([&](int64_t i) { return reduce_add(v[i]); });
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
