// Helpers shared by the CPU kernel tests: running a test once per SIMD path, random inputs with
// fixed seeds, tolerance checks against double-precision references, and a paged KV cache whose
// addresses are computed here independently of PagedKvLayout's helpers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "folio/kernels/cpu/vector_ops.h"
#include "folio/kernels/paged_kv_layout.h"

namespace folio::kernels::testing {

using cpu::SimdPath;

// Every path this machine supports (portable always; AVX2 and AVX-512 where the CPU has them).
std::vector<SimdPath> supported_simd_paths();

// gtest parameter names: "portable", "avx2", "avx512".
std::string simd_path_test_name(const ::testing::TestParamInfo<SimdPath>& info);

// Forces a SIMD path for its lifetime, restoring the previous one after.
class ScopedSimdPath {
 public:
  explicit ScopedSimdPath(SimdPath path);
  ~ScopedSimdPath();
  ScopedSimdPath(const ScopedSimdPath&) = delete;
  ScopedSimdPath& operator=(const ScopedSimdPath&) = delete;

 private:
  SimdPath previous_;
};

// Uniform values in [low, high).
std::vector<float> random_floats(std::mt19937& rng, size_t count, float low = -1.0f,
                                 float high = 1.0f);

// Asserts |actual[i] - expected[i]| <= absolute + relative * |expected[i]| for every i, and
// reports the worst element.
void expect_near_all(const std::vector<float>& actual, const std::vector<double>& expected,
                     double absolute, double relative, const std::string& what);

// A paged KV cache in host memory. Pages are deliberately padded (page_bytes is larger than
// blocks_per_page * block_bytes) so that a kernel that assumes contiguous blocks reads the
// wrong bytes. Addresses are computed by row_address(), written from the layout's definition
// without PagedKvLayout's helpers.
class TestKvCache {
 public:
  TestKvCache(int32_t num_layers, int32_t block_size, int32_t num_kv_heads, int32_t head_dim,
              DType dtype, int64_t num_blocks, int32_t blocks_per_page);

  const PagedKvLayout& layout() const { return layout_; }
  int64_t num_blocks() const { return num_blocks_; }
  std::vector<std::byte>& storage() { return storage_; }

  // Start of the K (key_or_value 0) or V (1) row of `slot` in `layer`.
  std::byte* row_address(int32_t layer, int key_or_value, int64_t slot);
  // Stores a row of num_kv_heads * head_dim values (rounded to f16 for an f16 cache).
  void store_row(int32_t layer, int key_or_value, int64_t slot, const float* values);
  // Reads element `index` of a row back as f32.
  float load(int32_t layer, int key_or_value, int64_t slot, int64_t index);

 private:
  int32_t num_layers_;
  int32_t block_size_;
  int32_t num_kv_heads_;
  int32_t head_dim_;
  DType dtype_;
  int64_t num_blocks_;
  int32_t blocks_per_page_;
  int64_t block_bytes_;
  int64_t page_bytes_;
  std::vector<std::byte> storage_;
  PagedKvLayout layout_;
};

}  // namespace folio::kernels::testing
