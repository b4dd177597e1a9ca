// kv_write: every written row lands exactly where the layout says (checked against a cache
// image built independently), skipped tokens and everything else stay untouched, and values
// round-trip (f32 exactly, f16 as round-to-nearest-even).
#include "folio/kernels/cpu/kv_write.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "folio/base/thread_pool.h"
#include "folio/device/host_stream.h"
#include "folio/tensor/half.h"
#include "kernel_test_util.h"

namespace folio::kernels::testing {
namespace {

using Config = std::tuple<SimdPath, DType>;

class KvWriteTest : public ::testing::TestWithParam<Config> {};

TEST_P(KvWriteTest, WritesEachTokenToItsSlotAndNothingElse) {
  const auto [path, dtype] = GetParam();
  ScopedSimdPath scoped(path);
  constexpr int32_t kBlockSize = 8, kKvHeads = 3, kHeadDim = 40, kLayer = 1;
  constexpr int64_t kRow = int64_t{kKvHeads} * kHeadDim;
  constexpr int64_t kNumBlocks = 10, kTokens = 29;
  // Rows of a fused QKV projection: [q (4 heads) | k | v], so K and V rows have a stride.
  constexpr int64_t kQkvStride = 4 * kHeadDim + 2 * kRow;
  TestKvCache actual(2, kBlockSize, kKvHeads, kHeadDim, dtype, kNumBlocks, 4);
  TestKvCache expected(2, kBlockSize, kKvHeads, kHeadDim, dtype, kNumBlocks, 4);

  std::mt19937 rng(static_cast<unsigned>(dtype) + 17);
  std::vector<int32_t> slots(kNumBlocks * kBlockSize);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(kTokens);
  slots[3] = -1;  // skipped tokens
  slots[20] = -1;
  const std::vector<float> qkv = random_floats(rng, kTokens * kQkvStride, -100.0f, 100.0f);

  ThreadPool pool(2);
  device::HostStream stream(pool);
  cpu::kv_write(stream, cpu::KvWriteArguments{.key = qkv.data() + 4 * kHeadDim,
                                              .value = qkv.data() + 4 * kHeadDim + kRow,
                                              .key_row_stride = kQkvStride,
                                              .value_row_stride = kQkvStride,
                                              .slot_mapping = slots.data(),
                                              .cache = actual.layout(),
                                              .layer = kLayer,
                                              .num_tokens = kTokens});

  for (int64_t token = 0; token < kTokens; ++token) {
    if (slots[token] < 0) continue;
    const float* key = qkv.data() + token * kQkvStride + 4 * kHeadDim;
    expected.store_row(kLayer, 0, slots[token], key);
    expected.store_row(kLayer, 1, slots[token], key + kRow);
  }
  ASSERT_EQ(actual.storage().size(), expected.storage().size());
  EXPECT_EQ(
      std::memcmp(actual.storage().data(), expected.storage().data(), actual.storage().size()), 0)
      << "cache image differs from the independently built one";

  // Round trip through PagedKvLayout's own accessors.
  for (int64_t token = 0; token < kTokens; ++token) {
    if (slots[token] < 0) continue;
    const float* key = qkv.data() + token * kQkvStride + 4 * kHeadDim;
    const std::byte* stored = actual.layout().key_pointer(kLayer, slots[token]);
    for (int64_t i = 0; i < kRow; ++i) {
      if (dtype == DType::kF16) {
        uint16_t half;
        std::memcpy(&half, stored + i * 2, 2);
        ASSERT_EQ(half, f32_to_f16(key[i]));
      } else {
        float value;
        std::memcpy(&value, stored + i * 4, 4);
        ASSERT_EQ(value, key[i]);
      }
    }
  }
}

TEST_P(KvWriteTest, SkipsPaddingTokensPastTheValidCount) {
  const auto [path, dtype] = GetParam();
  ScopedSimdPath scoped(path);
  constexpr int32_t kBlockSize = 16, kKvHeads = 2, kHeadDim = 64;
  constexpr int64_t kRow = int64_t{kKvHeads} * kHeadDim, kTokens = 12;
  TestKvCache actual(1, kBlockSize, kKvHeads, kHeadDim, dtype, 4, 4);
  TestKvCache expected(1, kBlockSize, kKvHeads, kHeadDim, dtype, 4, 4);
  std::mt19937 rng(3);
  const std::vector<float> keys = random_floats(rng, kTokens * kRow);
  const std::vector<float> values = random_floats(rng, kTokens * kRow);
  // Five real tokens in block 2, then padding that all points at the dummy slot 0.
  std::vector<int32_t> slots(kTokens, 0);
  for (int32_t t = 0; t < 5; ++t) slots[t] = 2 * kBlockSize + 3 * t;
  int32_t num_valid = 5;
  cpu::KvWriteArguments arguments{.key = keys.data(),
                                  .value = values.data(),
                                  .key_row_stride = kRow,
                                  .value_row_stride = kRow,
                                  .slot_mapping = slots.data(),
                                  .num_valid_tokens = &num_valid,
                                  .cache = actual.layout(),
                                  .layer = 0,
                                  .num_tokens = kTokens};
  ThreadPool pool(3);
  device::HostStream stream(pool);
  stream.begin_capture();
  cpu::kv_write(stream, arguments);
  const device::HostGraph graph = stream.end_capture();
  stream.replay(graph);
  for (int32_t t = 0; t < num_valid; ++t) {
    expected.store_row(0, 0, slots[t], keys.data() + t * kRow);
    expected.store_row(0, 1, slots[t], values.data() + t * kRow);
  }
  EXPECT_EQ(actual.storage(), expected.storage()) << "5 valid tokens";

  num_valid = 7;  // the replay reads the new count
  slots[5] = 3 * kBlockSize;
  slots[6] = 3 * kBlockSize + 1;
  stream.replay(graph);
  for (int32_t t = 5; t < num_valid; ++t) {
    expected.store_row(0, 0, slots[t], keys.data() + t * kRow);
    expected.store_row(0, 1, slots[t], values.data() + t * kRow);
  }
  EXPECT_EQ(actual.storage(), expected.storage()) << "7 valid tokens";
}

std::string config_name(const ::testing::TestParamInfo<Config>& info) {
  return std::string(cpu::simd_path_name(std::get<0>(info.param))) + "_" +
         std::string(dtype_name(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(AllPaths, KvWriteTest,
                         ::testing::Combine(::testing::ValuesIn(supported_simd_paths()),
                                            ::testing::Values(DType::kF32, DType::kF16)),
                         config_name);

}  // namespace
}  // namespace folio::kernels::testing
