#include "folio/kernels/cpu/embedding.h"

#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "folio/base/thread_pool.h"
#include "folio/tensor/quantize.h"

namespace folio::kernels::cpu {
namespace {

constexpr int64_t kVocab = 50;
constexpr int64_t kHidden = 96;

// A random table in `dtype` and its rows widened to f32 by the reference conversions.
struct Table {
  std::vector<std::byte> stored;  // dtype [kVocab, kHidden]
  std::vector<float> widened;     // f32 [kVocab, kHidden]

  Table(DType dtype, uint32_t seed) {
    std::mt19937 generator(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t stride = row_bytes(dtype, kHidden);
    stored.resize(kVocab * stride);
    widened.resize(kVocab * kHidden);
    std::vector<float> values(kHidden);
    for (int64_t row = 0; row < kVocab; ++row) {
      for (float& value : values) value = normal(generator);
      quantize_row(dtype, values.data(), stored.data() + row * stride, kHidden);
      dequantize_row(dtype, stored.data() + row * stride, widened.data() + row * kHidden, kHidden);
    }
  }
};

EmbeddingArguments arguments_for(const Table& table, DType dtype, const std::vector<int32_t>& ids,
                                 std::vector<float>& output) {
  EmbeddingArguments arguments;
  arguments.token_ids = ids.data();
  arguments.table = table.stored.data();
  arguments.output = output.data();
  arguments.num_tokens = static_cast<int64_t>(ids.size());
  arguments.vocab_size = kVocab;
  arguments.hidden = kHidden;
  arguments.table_dtype = dtype;
  return arguments;
}

void expect_rows(const Table& table, const std::vector<int32_t>& ids,
                 const std::vector<float>& output) {
  for (size_t token = 0; token < ids.size(); ++token) {
    ASSERT_EQ(std::memcmp(output.data() + token * kHidden,
                          table.widened.data() + ids[token] * kHidden, kHidden * sizeof(float)),
              0)
        << "token " << token << " id " << ids[token];
  }
}

TEST(EmbeddingTest, GathersWidenedRowsForEveryDtypeAndThreadCount) {
  ThreadPool one(1);
  ThreadPool two(2);
  const std::vector<int32_t> ids = {3, 0, 49, 3, 17, 22, 8, 41, 0, 30, 12};
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const Table table(dtype, 5);
    for (ThreadPool* pool : {&one, &two}) {
      device::HostStream stream(*pool);
      std::vector<float> output(ids.size() * kHidden, std::numeric_limits<float>::quiet_NaN());
      embedding(stream, arguments_for(table, dtype, ids, output));
      expect_rows(table, ids, output);
    }
  }
}

TEST(EmbeddingTest, ReplayReadsTheTokenIdsOfTheCurrentStep) {
  ThreadPool pool(2);
  device::HostStream stream(pool);
  const Table table(DType::kQ8_0, 6);
  std::vector<int32_t> ids = {1, 2, 3, 4};
  std::vector<float> output(ids.size() * kHidden);
  stream.begin_capture();
  embedding(stream, arguments_for(table, DType::kQ8_0, ids, output));
  const device::HostGraph graph = stream.end_capture();
  ids = {40, 0, 7, 7};  // same buffer, next step's tokens
  stream.replay(graph);
  expect_rows(table, ids, output);
}

#if defined(NDEBUG) && !defined(FOLIO_DEBUG_CHECKS)
TEST(EmbeddingTest, ReleaseBuildsWriteZerosForAnOutOfRangeId) {
  ThreadPool pool(1);
  device::HostStream stream(pool);
  const Table table(DType::kF16, 7);
  const std::vector<int32_t> ids = {2, kVocab, -1, 5};
  std::vector<float> output(ids.size() * kHidden, std::numeric_limits<float>::quiet_NaN());
  embedding(stream, arguments_for(table, DType::kF16, ids, output));
  for (int64_t i = 0; i < kHidden; ++i) {
    EXPECT_EQ(output[kHidden + i], 0.0f);
    EXPECT_EQ(output[2 * kHidden + i], 0.0f);
  }
  EXPECT_EQ(std::memcmp(output.data(), table.widened.data() + 2 * kHidden, kHidden * sizeof(float)),
            0);
  EXPECT_EQ(std::memcmp(output.data() + 3 * kHidden, table.widened.data() + 5 * kHidden,
                        kHidden * sizeof(float)),
            0);
}
#else
TEST(EmbeddingDeathTest, DebugBuildsStopAtAnOutOfRangeId) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ThreadPool pool(1);
  device::HostStream stream(pool);
  const Table table(DType::kF16, 7);
  const std::vector<int32_t> ids = {2, kVocab};
  std::vector<float> output(ids.size() * kHidden);
  EXPECT_DEATH(embedding(stream, arguments_for(table, DType::kF16, ids, output)),
               "outside the vocabulary");
}
#endif

}  // namespace
}  // namespace folio::kernels::cpu
