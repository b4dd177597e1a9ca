// Token id sequences for tests: `count` consecutive ids from `first`. Distinct ranges give
// prompts with no shared prefix; equal ranges give prompts a prefix cache can reuse.
#pragma once

#include <cstdint>
#include <numeric>
#include <vector>

namespace folio::testing {

inline std::vector<int32_t> tokens(int32_t count, int32_t first = 100) {
  std::vector<int32_t> result(static_cast<size_t>(count));
  std::iota(result.begin(), result.end(), first);
  return result;
}

}  // namespace folio::testing
