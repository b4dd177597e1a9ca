// Pseudo-random numbers reproducible across runs, compilers and platforms, for seeded sampling
// and for generated model weights (which also rules out libm transcendentals, whose last bit
// varies between libraries: approximately_normal uses only +, - and *).
//
// Sampling with a seed must give the same tokens everywhere, and a seed must give the same model
// bytes everywhere, so the generator is a documented
// algorithm with integer-only state transitions rather than std::mt19937 plus a distribution
// (the standard distributions are implementation-defined):
// - SplitMix64 (Steele, Lea, Flood 2014; the seeding generator recommended by xoshiro's
//   authors): state += 0x9e3779b97f4a7c15, then two xor-shift-multiply rounds.
// - xoshiro256** 1.0 (Blackman and Vigna 2018): 256 bits of state, output rotl(s1 * 5, 7) * 9.
//   Its state is the first four SplitMix64 outputs of the 64-bit seed, so no seed gives the
//   all-zero state.
// - A uniform double in [0, 1) is the top 53 bits of one output times 2^-53 (exact).
//
// Thread-safety: a generator is a value; one owner at a time.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

namespace folio {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

class Xoshiro256StarStar {
 public:
  using State = std::array<uint64_t, 4>;

  explicit Xoshiro256StarStar(uint64_t seed) {
    SplitMix64 seeder(seed);
    for (uint64_t& word : state_) word = seeder.next();
  }
  // Requires: the state is not all zero (the generator would only ever return 0).
  static Xoshiro256StarStar from_state(const State& state) {
    Xoshiro256StarStar generator(0);
    generator.state_ = state;
    return generator;
  }

  uint64_t next() {
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

  // Uniform in [0, 1): every multiple of 2^-53 equally likely.
  double next_double() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  const State& state() const { return state_; }

 private:
  static uint64_t rotate_left(uint64_t value, int shift) {
    return (value << shift) | (value >> (64 - shift));
  }

  State state_{};
};

// 64-bit FNV-1a (offset basis 0xcbf29ce484222325, prime 0x100000001b3): of a name, to give each
// tensor its own stream; of bytes, to fingerprint a file or a serialized sequence (the reference
// scripts in tests/data hash the same way).
constexpr uint64_t fnv1a64(std::span<const uint8_t> bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (uint8_t byte : bytes) hash = (hash ^ byte) * 0x100000001b3ull;
  return hash;
}
constexpr uint64_t fnv1a64(std::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (char c : text) hash = (hash ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return hash;
}

// Mean 0, variance 1, in [-2*sqrt(3), 2*sqrt(3)]: four uniforms of `random`.
inline double approximately_normal(Xoshiro256StarStar& random) {
  constexpr double kSqrt3 = 1.7320508075688772;
  const double sum = random.next_double() + random.next_double() + random.next_double() +
                     random.next_double();  // mean 2, variance 1/3
  return (sum - 2.0) * kSqrt3;
}

}  // namespace folio
