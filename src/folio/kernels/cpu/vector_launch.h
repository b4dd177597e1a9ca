// Launching a kernel built on VectorOps so that the launch carries the SIMD path chosen when it
// was made. A HostStream may record the launch and replay it much later; the recorded launch
// keeps its table, so a replay computes exactly what the eager launch computed even if a test
// or benchmark has switched the active path in between.
//
// A kernel provides `void body(const Arguments&, const VectorOps&, begin, end, thread_index)`;
// make_vector_kernel() wraps it into a HostKernel whose arguments are the kernel's arguments
// plus the table pointer (tables are immutable statics, so the pointer stays valid).
#pragma once

#include <cstdint>

#include "folio/device/host_kernel.h"
#include "folio/kernels/cpu/vector_ops.h"

namespace folio::kernels::cpu {

template <typename Arguments>
using VectorBody = void (*)(const Arguments& arguments, const VectorOps& ops, int64_t begin,
                            int64_t end, int thread_index);

template <typename Arguments, VectorBody<Arguments> kBody>
struct VectorLaunch {
  Arguments arguments;
  const VectorOps* ops;

  static void run(const VectorLaunch& launch, int64_t begin, int64_t end, int thread_index) {
    kBody(launch.arguments, *launch.ops, begin, end, thread_index);
  }
};

// A launch of kBody over [0, num_items) using the active SIMD path.
template <typename Arguments, VectorBody<Arguments> kBody>
device::HostKernel make_vector_kernel(const char* name, const Arguments& arguments,
                                      int64_t num_items, int64_t grain) {
  using Launch = VectorLaunch<Arguments, kBody>;
  return device::HostKernel::make<Launch, &Launch::run>(name, Launch{arguments, &vector_ops()},
                                                        num_items, grain);
}

}  // namespace folio::kernels::cpu
