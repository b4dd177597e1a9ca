// How the CPU kernels of this folder size their work items. A HostStream splits a launch's
// [0, num_items) into at most a few tasks per thread, each at least `grain` items; a grain that
// gives every task some tens of microseconds of work keeps the fork-join overhead (a few
// microseconds) small without starving threads on small steps.
//
// Partitioning never affects results: every kernel computes each output element inside one
// item, by a fixed sequence of operations.
#pragma once

#include <algorithm>
#include <cstdint>

namespace folio::kernels::cpu {

// Roughly the number of f32 elements one task should touch.
inline constexpr int64_t kElementsPerTask = 16384;

// The grain for items that each touch `elements_per_item` elements.
inline int64_t grain_for(int64_t elements_per_item) {
  return std::max<int64_t>(1, kElementsPerTask / std::max<int64_t>(1, elements_per_item));
}

}  // namespace folio::kernels::cpu
