#include "kernel_test_util.h"

#include <cmath>
#include <cstring>

#include "folio/tensor/half.h"

namespace folio::kernels::testing {

std::vector<SimdPath> supported_simd_paths() {
  std::vector<SimdPath> paths;
  for (SimdPath path : {SimdPath::kPortable, SimdPath::kAvx2, SimdPath::kAvx512}) {
    if (cpu::simd_path_supported(path)) paths.push_back(path);
  }
  return paths;
}

std::string simd_path_test_name(const ::testing::TestParamInfo<SimdPath>& info) {
  return std::string(cpu::simd_path_name(info.param));
}

ScopedSimdPath::ScopedSimdPath(SimdPath path) : previous_(cpu::active_simd_path()) {
  cpu::set_simd_path_for_testing(path);
}

ScopedSimdPath::~ScopedSimdPath() {
  cpu::set_simd_path_for_testing(previous_);
}

std::vector<float> random_floats(std::mt19937& rng, size_t count, float low, float high) {
  std::uniform_real_distribution<float> distribution(low, high);
  std::vector<float> values(count);
  for (float& value : values) value = distribution(rng);
  return values;
}

void expect_near_all(const std::vector<float>& actual, const std::vector<double>& expected,
                     double absolute, double relative, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double worst_excess = 0.0;
  size_t worst = 0;
  size_t failures = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double error = std::fabs(static_cast<double>(actual[i]) - expected[i]);
    const double allowed = absolute + relative * std::fabs(expected[i]);
    if (!(error <= allowed)) {  // also catches NaN
      ++failures;
      const double excess = std::isnan(error) ? 1e300 : error - allowed;
      if (excess > worst_excess || failures == 1) {
        worst_excess = excess;
        worst = i;
      }
    }
  }
  EXPECT_EQ(failures, 0u) << what << ": " << failures << " of " << actual.size()
                          << " elements out of tolerance; worst at " << worst << ": got "
                          << (actual.empty() ? 0.0f : actual[worst]) << ", want "
                          << (expected.empty() ? 0.0 : expected[worst]);
}

TestKvCache::TestKvCache(int32_t num_layers, int32_t block_size, int32_t num_kv_heads,
                         int32_t head_dim, DType dtype, int64_t num_blocks, int32_t blocks_per_page)
    : num_layers_(num_layers),
      block_size_(block_size),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      dtype_(dtype),
      num_blocks_(num_blocks),
      blocks_per_page_(blocks_per_page) {
  const int64_t element_bytes = dtype == DType::kF16 ? 2 : 4;
  block_bytes_ = int64_t{num_layers} * 2 * block_size * num_kv_heads * head_dim * element_bytes;
  page_bytes_ = blocks_per_page * block_bytes_ + 192;  // a gap after each page's blocks
  const int64_t num_pages = (num_blocks + blocks_per_page - 1) / blocks_per_page;
  // Filled with a NaN pattern (0xff bytes) so reading an unwritten row shows up in the output.
  storage_.assign(static_cast<size_t>(num_pages * page_bytes_), std::byte{0xff});
  layout_ = PagedKvLayout{.base = storage_.data(),
                          .page_bytes = page_bytes_,
                          .blocks_per_page = blocks_per_page,
                          .block_bytes = block_bytes_,
                          .block_size = block_size,
                          .num_layers = num_layers,
                          .num_kv_heads = num_kv_heads,
                          .head_dim = head_dim,
                          .dtype = dtype};
}

std::byte* TestKvCache::row_address(int32_t layer, int key_or_value, int64_t slot) {
  const int64_t block = slot / block_size_;
  const int64_t token = slot % block_size_;
  const int64_t element_bytes = dtype_ == DType::kF16 ? 2 : 4;
  const int64_t row_bytes = int64_t{num_kv_heads_} * head_dim_ * element_bytes;
  const int64_t page = block / blocks_per_page_;
  const int64_t block_in_page = block % blocks_per_page_;
  const int64_t offset = page * page_bytes_ + block_in_page * block_bytes_ +
                         (int64_t{layer} * 2 + key_or_value) * block_size_ * row_bytes +
                         token * row_bytes;
  return storage_.data() + offset;
}

void TestKvCache::store_row(int32_t layer, int key_or_value, int64_t slot, const float* values) {
  std::byte* row = row_address(layer, key_or_value, slot);
  const int64_t count = int64_t{num_kv_heads_} * head_dim_;
  for (int64_t i = 0; i < count; ++i) {
    if (dtype_ == DType::kF16) {
      const uint16_t half = f32_to_f16(values[i]);
      std::memcpy(row + i * 2, &half, 2);
    } else {
      std::memcpy(row + i * 4, &values[i], 4);
    }
  }
}

float TestKvCache::load(int32_t layer, int key_or_value, int64_t slot, int64_t index) {
  const std::byte* row = row_address(layer, key_or_value, slot);
  if (dtype_ == DType::kF16) {
    uint16_t half;
    std::memcpy(&half, row + index * 2, 2);
    return f16_to_f32(half);
  }
  float value;
  std::memcpy(&value, row + index * 4, 4);
  return value;
}

}  // namespace folio::kernels::testing
