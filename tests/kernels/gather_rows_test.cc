// gather_rows: selected rows copied, rows past the count zeroed, indices and count read at
// replay time, out-of-range indices rejected.
#include "folio/kernels/cpu/gather_rows.h"

#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "folio/base/thread_pool.h"
#include "folio/device/host_stream.h"
#include "kernel_test_util.h"

namespace folio::kernels::testing {
namespace {

constexpr int64_t kSourceRows = 10, kWidth = 6, kMaxRows = 5;

struct GatherFixture {
  std::vector<float> source;
  std::vector<float> destination = std::vector<float>(kMaxRows * kWidth, -1.0f);
  std::vector<int32_t> indices = std::vector<int32_t>(kMaxRows, 0);
  int32_t count = 0;

  explicit GatherFixture(std::mt19937& rng) : source(random_floats(rng, kSourceRows * kWidth)) {}

  cpu::GatherRowsArguments arguments() {
    return {.source = reinterpret_cast<const std::byte*>(source.data()),
            .destination = reinterpret_cast<std::byte*>(destination.data()),
            .row_indices = indices.data(),
            .num_rows = &count,
            .num_source_rows = kSourceRows,
            .max_rows = kMaxRows,
            .row_bytes = kWidth * sizeof(float)};
  }

  void expect_gathered() const {
    for (int64_t row = 0; row < kMaxRows; ++row) {
      for (int64_t i = 0; i < kWidth; ++i) {
        const float want = row < count ? source[indices[row] * kWidth + i] : 0.0f;
        EXPECT_EQ(destination[row * kWidth + i], want) << "row " << row;
      }
    }
  }
};

TEST(GatherRowsTest, CopiesSelectedRowsAndZeroesTheRest) {
  std::mt19937 rng(12);
  GatherFixture fixture(rng);
  fixture.indices = {9, 0, 4, 4, 0};
  fixture.count = 3;
  ThreadPool pool(2);
  device::HostStream stream(pool);
  cpu::gather_rows(stream, fixture.arguments());
  fixture.expect_gathered();
}

TEST(GatherRowsTest, ReplayReadsTheCurrentIndicesAndCount) {
  std::mt19937 rng(13);
  GatherFixture fixture(rng);
  fixture.count = 1;
  ThreadPool pool(2);
  device::HostStream stream(pool);
  stream.begin_capture();
  cpu::gather_rows(stream, fixture.arguments());
  const device::HostGraph graph = stream.end_capture();
  for (int32_t count : {5, 0, 2}) {
    for (int32_t& index : fixture.indices) index = static_cast<int32_t>(rng() % kSourceRows);
    fixture.count = count;
    stream.replay(graph);
    fixture.expect_gathered();
  }
}

TEST(GatherRowsDeathTest, AbortsOnIndexOrCountOutOfRange) {
  std::mt19937 rng(14);
  GatherFixture fixture(rng);
  fixture.count = 2;
  fixture.indices[1] = kSourceRows;
  EXPECT_DEATH(cpu::gather_rows_body(fixture.arguments(), 0, kMaxRows, 0),
               "selects source row 10 of 10");
  fixture.indices[1] = 0;
  fixture.count = kMaxRows + 1;
  EXPECT_DEATH(cpu::gather_rows_body(fixture.arguments(), 0, kMaxRows, 0),
               "6 rows requested, room for 5");
}

}  // namespace
}  // namespace folio::kernels::testing
