#include "folio/base/check.h"

#include <gtest/gtest.h>

namespace folio {
namespace {

TEST(CheckTest, PassingCheckEvaluatesConditionOnce) {
  int evaluations = 0;
  FOLIO_CHECK(++evaluations == 1, "never printed");
  EXPECT_EQ(evaluations, 1);
}

TEST(CheckDeathTest, FailedCheckAbortsWithLocationExpressionAndMessage) {
  const int pages = 3;
  EXPECT_DEATH(FOLIO_CHECK(pages > 4, "pool has {} pages", pages),
               "invariant broken at .*check_test.cc:[0-9]+: pages > 4: pool has 3 pages");
}

TEST(CheckDeathTest, FailedCheckWithoutMessageNamesExpression) {
  EXPECT_DEATH(FOLIO_CHECK(1 + 1 == 3), "invariant broken at .*: 1 \\+ 1 == 3\n");
}

TEST(CheckDeathTest, UnreachableAborts) {
  EXPECT_DEATH(FOLIO_UNREACHABLE("state {}", 7), "unreachable: state 7");
}

#if !defined(NDEBUG) || defined(FOLIO_DEBUG_CHECKS)
TEST(CheckDeathTest, DebugCheckAbortsInDebugBuilds) {
  EXPECT_TRUE(FOLIO_EXPENSIVE_CHECKS());
  EXPECT_DEATH(FOLIO_DCHECK(false, "debug {}", 1), "false: debug 1");
}
#else
TEST(CheckTest, DebugCheckDoesNotEvaluateInReleaseBuilds) {
  EXPECT_FALSE(FOLIO_EXPENSIVE_CHECKS());
  int evaluations = 0;
  FOLIO_DCHECK(++evaluations < 0, "would fail if evaluated");
  EXPECT_EQ(evaluations, 0);
}
#endif

}  // namespace
}  // namespace folio
