// Deterministic pseudo-random numbers for generated models: the same seed gives the same bits
// on every compiler, standard library and CPU. That rules out std::normal_distribution (its
// algorithm is unspecified) and libm transcendental functions (their last bit varies between
// libraries), so values come from specified integer generators and use only +, - and *, which
// IEEE 754 rounds identically everywhere.
//
//   splitmix64: Steele, Lea & Flood's 64-bit mixer; used to derive seeds.
//   xoshiro256**: Blackman & Vigna's generator; used for values.
//   approximately_normal: the Irwin-Hall sum of four uniforms, shifted and scaled to mean 0 and
//     variance 1 (bounded by +-2*sqrt(3); close enough to a normal for weight initialization).
#pragma once

#include <cstdint>
#include <string_view>

namespace folio::model {

constexpr uint64_t splitmix64(uint64_t& state) {
  state += 0x9e3779b97f4a7c15ull;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// 64-bit FNV-1a of a name, to give each tensor its own stream.
constexpr uint64_t fnv1a64(std::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (char c : text) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// Not thread-safe; one generator per stream.
class Xoshiro256 {
 public:
  explicit constexpr Xoshiro256(uint64_t seed) {
    uint64_t mixer = seed;
    for (uint64_t& word : state_) word = splitmix64(mixer);
  }

  constexpr uint64_t next() {
    const uint64_t result = rotate_left(state_[1] * 5, 7) * 9;
    const uint64_t shifted = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= shifted;
    state_[3] = rotate_left(state_[3], 45);
    return result;
  }

  // Uniform in [0, 1), exactly representable (53 random bits).
  constexpr double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  // Mean 0, variance 1, in [-2*sqrt(3), 2*sqrt(3)].
  constexpr double approximately_normal() {
    constexpr double kSqrt3 = 1.7320508075688772;
    const double sum = uniform() + uniform() + uniform() + uniform();  // mean 2, variance 1/3
    return (sum - 2.0) * kSqrt3;
  }

 private:
  static constexpr uint64_t rotate_left(uint64_t value, int bits) {
    return (value << bits) | (value >> (64 - bits));
  }
  uint64_t state_[4] = {};
};

}  // namespace folio::model
