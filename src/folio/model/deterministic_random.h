// Deterministic pseudo-random numbers for generated models: the same seed gives the same bits
// on every compiler, standard library and CPU. That rules out std::normal_distribution (its
// algorithm is unspecified) and libm transcendental functions (their last bit varies between
// libraries), so values come from specified integer generators and use only +, - and *, which
// IEEE 754 rounds identically everywhere.
//
//   SplitMix64 and xoshiro256** (base/random.h): seeds and values.
//   approximately_normal: the Irwin-Hall sum of four uniforms, shifted and scaled to mean 0 and
//     variance 1 (bounded by +-2*sqrt(3); close enough to a normal for weight initialization).
#pragma once

#include "folio/base/random.h"

#include <cstdint>
#include <string_view>

namespace folio::model {

// 64-bit FNV-1a of a name, to give each tensor its own stream.
constexpr uint64_t fnv1a64(std::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (char c : text) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// Mean 0, variance 1, in [-2*sqrt(3), 2*sqrt(3)]: four uniforms of `random`.
inline double approximately_normal(Xoshiro256StarStar& random) {
  constexpr double kSqrt3 = 1.7320508075688772;
  const double sum = random.next_double() + random.next_double() + random.next_double() +
                     random.next_double();  // mean 2, variance 1/3
  return (sum - 2.0) * kSqrt3;
}

}  // namespace folio::model
