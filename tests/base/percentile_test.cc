#include "folio/base/percentile.h"

#include <algorithm>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

namespace folio {
namespace {

// Expected values are worked by hand from the definition in percentile.h (numpy's default,
// linear interpolation between closest ranks): rank = fraction * (n - 1).

std::vector<double> one_to(int n) {
  std::vector<double> values;
  for (int i = 1; i <= n; ++i) values.push_back(i);
  return values;
}

TEST(PercentileTest, EmptySampleGivesZero) {
  EXPECT_EQ(percentile({}, 0), 0);
  EXPECT_EQ(percentile({}, 0.5), 0);
  EXPECT_EQ(percentile({}, 1), 0);
}

TEST(PercentileTest, OneValueIsEveryPercentile) {
  for (const double fraction : {0.0, 0.5, 0.99, 1.0}) {
    EXPECT_EQ(percentile({7}, fraction), 7) << fraction;
  }
}

TEST(PercentileTest, TwoValuesInterpolateAcrossTheGap) {
  EXPECT_DOUBLE_EQ(percentile({10, 20}, 0), 10);
  EXPECT_DOUBLE_EQ(percentile({10, 20}, 0.5), 15);     // rank 0.5
  EXPECT_DOUBLE_EQ(percentile({10, 20}, 0.99), 19.9);  // rank 0.99: 10 + 0.99 * 10
  EXPECT_DOUBLE_EQ(percentile({10, 20}, 1), 20);
}

TEST(PercentileTest, EndsAreMinimumAndMaximum) {
  EXPECT_EQ(percentile(one_to(100), 0), 1);
  EXPECT_EQ(percentile(one_to(100), 1), 100);
}

TEST(PercentileTest, MedianOfEvenCountIsMidpointOfMiddlePair) {
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 0.5), 2.5);  // rank 1.5
  EXPECT_DOUBLE_EQ(percentile(one_to(100), 0.5), 50.5);  // rank 49.5
}

TEST(PercentileTest, MedianOfOddCountIsMiddleValue) {
  EXPECT_EQ(percentile({3, 1, 2}, 0.5), 2);  // rank 1, exact
}

TEST(PercentileTest, P99InterpolatesBetweenTheTopTwoRanks) {
  EXPECT_DOUBLE_EQ(percentile(one_to(100), 0.99), 99.01);  // rank 98.01: 99 + 0.01 * 1
  // 16 requests, as in a short `folio bench`: rank 14.85 gives 15 + 0.85 * (16 - 15). The floor
  // rank that `folio bench` used before gave 15, the server load generator 15.85.
  EXPECT_DOUBLE_EQ(percentile(one_to(16), 0.99), 15.85);
}

TEST(PercentileTest, OrderOfInputDoesNotMatter) {
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 0.9), 3.7);  // sorted {1, 2, 3, 4}, rank 2.7
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 0.5), 2.5);
  std::vector<double> descending = one_to(100);
  std::reverse(descending.begin(), descending.end());
  EXPECT_DOUBLE_EQ(percentile(descending, 0.99), 99.01);
  EXPECT_EQ(percentile(descending, 0), 1);
}

TEST(PercentileTest, RepeatedValuesStayPut) {
  EXPECT_EQ(percentile({5, 5, 5}, 0.3), 5);
  EXPECT_DOUBLE_EQ(percentile({1, 5, 5, 9}, 0.5), 5);  // rank 1.5 between two fives
}

TEST(PercentileTest, InfiniteMaximumIsReturnedNotNan) {
  const double infinity = std::numeric_limits<double>::infinity();
  EXPECT_EQ(percentile({1, infinity}, 1), infinity);
  EXPECT_EQ(percentile({1, infinity, infinity}, 0.5), infinity);  // rank 1, exact
  EXPECT_EQ(percentile({1, 2}, 0), 1);
}

TEST(PercentileTest, SortedVariantAgreesWithSortingOne) {
  const std::vector<double> unsorted = {9.5, 0.25, 3, 7, 1, 12, 4.5};
  std::vector<double> sorted = unsorted;
  std::sort(sorted.begin(), sorted.end());
  for (const double fraction : {0.0, 0.1, 0.5, 0.9, 0.99, 1.0}) {
    EXPECT_EQ(percentile_of_sorted(sorted, fraction), percentile(unsorted, fraction)) << fraction;
  }
  EXPECT_EQ(percentile_of_sorted({}, 0.5), 0);
}

TEST(PercentileDeathTest, FractionOutsideZeroToOneAborts) {
  EXPECT_DEATH(percentile({1, 2}, 1.5), "outside \\[0, 1\\]");
  EXPECT_DEATH(percentile({1, 2}, -0.01), "outside \\[0, 1\\]");
  EXPECT_DEATH(percentile({1, 2}, std::numeric_limits<double>::quiet_NaN()), "outside");
}

}  // namespace
}  // namespace folio
