// Cases for check_test_main.cmake, which runs them one at a time as CTest does: a suite whose
// SetUpTestSuite fails (its case must be reported failed, never skipped) and a case that skips
// itself (it must still read as skipped).
#include <gtest/gtest.h>

namespace {

class BrokenSetUpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { FAIL() << "the suite's set-up failed on purpose"; }
};

TEST_F(BrokenSetUpTest, NeverRuns) {
  ADD_FAILURE() << "a case of a broken suite ran";
}

TEST(SkippingTest, SkipsWithAReason) {
  GTEST_SKIP() << "skipped on purpose";
}

}  // namespace
