// measure_read_bandwidth: a finite, positive rate over a buffer of the size asked for, and a
// refused buffer too small to leave the caches. (Its value is the machine's: not asserted.)
#include <gtest/gtest.h>

#include <cmath>

#include "folio/base/read_bandwidth.h"

namespace folio {
namespace {

TEST(ReadBandwidthTest, MeasuresAFinitePositiveRate) {
  ThreadPool pool(1);
  ReadBandwidthOptions options;
  options.buffer_bytes = int64_t{8} << 20;
  options.passes = 2;
  const double bytes_per_second = measure_read_bandwidth(pool, options);
  EXPECT_TRUE(std::isfinite(bytes_per_second));
  EXPECT_GT(bytes_per_second, 0.0);
}

// A buffer made on one pool is read by pools of other sizes, pass after pass.
TEST(ReadBandwidthTest, OneBufferIsReadByPoolsOfAnySize) {
  ThreadPool two(2);
  ThreadPool one(1);
  ReadBandwidthBuffer buffer(two, (int64_t{4} << 20) + 100);
  EXPECT_EQ(buffer.bytes(), int64_t{4} << 20);  // whole 4 KiB slices
  for (ThreadPool* pool : {&one, &two, &one}) {
    const double bytes_per_second = buffer.read_pass(*pool);
    EXPECT_TRUE(std::isfinite(bytes_per_second));
    EXPECT_GT(bytes_per_second, 0.0);
  }
}

TEST(ReadBandwidthDeathTest, RefusesABufferBelowOneMebibyte) {
  ThreadPool pool(1);
  ReadBandwidthOptions options;
  options.buffer_bytes = 4096;
  EXPECT_DEATH(measure_read_bandwidth(pool, options), "read bandwidth over 4096 bytes");
}

}  // namespace
}  // namespace folio
