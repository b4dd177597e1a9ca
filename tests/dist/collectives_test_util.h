// Inputs and independent references for the collectives tests: every rank's values are drawn
// from its own seeded stream, so any process can rebuild any rank's input; sums are checked
// against a double-precision reference within the bound of f32 summation in any order.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "folio/base/random.h"
#include "folio/dist/collectives.h"

namespace folio::dist::testing {

#define FOLIO_EXPECT_OK(expression)                   \
  do {                                                \
    const ::folio::Status folio_status_ = expression; \
    EXPECT_TRUE(folio_status_.ok()) << folio_status_; \
  } while (false)

// Values of several magnitudes (so additions round), identical on every platform.
inline std::vector<float> rank_values(int rank, size_t count, uint64_t seed = 1) {
  Xoshiro256StarStar random(seed * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(rank) + 1);
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) {
    const double scale = static_cast<double>(uint64_t{1} << (i % 7)) / 8.0;
    values[i] = static_cast<float>(approximately_normal(random) * scale);
  }
  return values;
}

inline std::vector<std::byte> rank_bytes(int rank, size_t count, uint64_t seed = 1) {
  Xoshiro256StarStar random(seed * 0xbf58476d1ce4e5b9ULL + static_cast<uint64_t>(rank) + 7);
  std::vector<std::byte> bytes(count);
  for (std::byte& byte : bytes) byte = static_cast<std::byte>(random.next() >> 56);
  return bytes;
}

// ((x_0 + x_1) + x_2) + ... in f32: the in-process backend's order.
inline std::vector<float> rank_order_sum(const std::vector<std::vector<float>>& inputs) {
  std::vector<float> sum = inputs[0];
  for (size_t rank = 1; rank < inputs.size(); ++rank) {
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += inputs[rank][i];
  }
  return sum;
}

// Each element within (n - 1) * 2^-24 * sum |x_i| (times 1.001 for the reference's own
// rounding) of the exact sum computed in double: f32 summation of n terms in any order.
inline void expect_within_summation_bound(std::span<const float> result,
                                          const std::vector<std::vector<float>>& inputs) {
  const double unit_roundoff = std::ldexp(1.0, -24);
  const double terms = static_cast<double>(inputs.size());
  size_t failures = 0;
  for (size_t i = 0; i < result.size() && failures < 5; ++i) {
    double exact = 0;
    double magnitude = 0;
    for (const auto& input : inputs) {
      exact += input[i];
      magnitude += std::fabs(input[i]);
    }
    const double bound = (terms - 1) * unit_roundoff * magnitude * 1.001;
    if (std::fabs(result[i] - exact) > bound) {
      ++failures;
      ADD_FAILURE() << "element " << i << ": " << result[i] << " vs exact " << exact << ", bound "
                    << bound;
    }
  }
}

inline bool bit_equal(std::span<const float> a, std::span<const float> b) {
  // memcmp must not see the null pointer of an empty span.
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

}  // namespace folio::dist::testing
