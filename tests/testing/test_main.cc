// main() of every test binary: GoogleTest's, with one change to what it prints.
//
// When a suite's SetUpTestSuite fails fatally, GoogleTest runs none of its cases: it marks each
// one skipped, prints "[  SKIPPED ]" for it (and again in the summary), and exits 1. CTest runs
// each case as its own process and, through gtest_discover_tests' SKIP_REGULAR_EXPRESSION
// ("[  SKIPPED ]", which CTest checks before the exit code), reports that failure as a skip. A
// race between two test processes writing one temporary file stayed hidden that way. This
// printer reports such a case as failed instead, and replaces the summary of a run in which a
// suite's set-up failed, so no "[  SKIPPED ]" line comes from it and the exit code decides.
// Cases skipped by GTEST_SKIP are printed exactly as GoogleTest prints them.
#include <cstdio>
#include <memory>

#include <gtest/gtest.h>

namespace {

using ::testing::TestEventListener;

// The suite whose cases are running failed outside any case: in SetUpTestSuite (or, at the end,
// TearDownTestSuite).
bool current_suite_failed_outside_its_cases() {
  const ::testing::TestSuite* suite = ::testing::UnitTest::GetInstance()->current_test_suite();
  return suite != nullptr && suite->ad_hoc_test_result().Failed();
}

class SuiteSetUpFailurePrinter final : public TestEventListener {
 public:
  explicit SuiteSetUpFailurePrinter(TestEventListener* printer) : printer_(printer) {}

  void OnTestProgramStart(const ::testing::UnitTest& unit) override {
    printer_->OnTestProgramStart(unit);
  }
  void OnTestIterationStart(const ::testing::UnitTest& unit, int iteration) override {
    printer_->OnTestIterationStart(unit, iteration);
  }
  void OnEnvironmentsSetUpStart(const ::testing::UnitTest& unit) override {
    printer_->OnEnvironmentsSetUpStart(unit);
  }
  void OnEnvironmentsSetUpEnd(const ::testing::UnitTest& unit) override {
    printer_->OnEnvironmentsSetUpEnd(unit);
  }
  void OnTestSuiteStart(const ::testing::TestSuite& suite) override {
    printer_->OnTestSuiteStart(suite);
  }
  void OnTestStart(const ::testing::TestInfo& info) override { printer_->OnTestStart(info); }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    printer_->OnTestPartResult(result);
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Skipped() && current_suite_failed_outside_its_cases()) {
      suite_set_up_failed_ = true;
      std::printf("[  FAILED  ] %s.%s: not run, the suite's SetUpTestSuite failed (above)\n",
                  info.test_suite_name(), info.name());
      std::fflush(stdout);
      return;
    }
    printer_->OnTestEnd(info);
  }
  void OnTestSuiteEnd(const ::testing::TestSuite& suite) override {
    printer_->OnTestSuiteEnd(suite);
  }
  void OnEnvironmentsTearDownStart(const ::testing::UnitTest& unit) override {
    printer_->OnEnvironmentsTearDownStart(unit);
  }
  void OnEnvironmentsTearDownEnd(const ::testing::UnitTest& unit) override {
    printer_->OnEnvironmentsTearDownEnd(unit);
  }
  void OnTestIterationEnd(const ::testing::UnitTest& unit, int iteration) override {
    if (!suite_set_up_failed_) {
      printer_->OnTestIterationEnd(unit, iteration);
      return;
    }
    // GoogleTest's summary would list the cases as skipped again: this one lists what failed.
    std::printf("[==========] %d tests from %d test suites ran.\n", unit.test_to_run_count(),
                unit.test_suite_to_run_count());
    for (int suite_index = 0; suite_index < unit.total_test_suite_count(); ++suite_index) {
      const ::testing::TestSuite* suite = unit.GetTestSuite(suite_index);
      if (suite->ad_hoc_test_result().Failed()) {
        std::printf("[  FAILED  ] %s: SetUpTestSuite or TearDownTestSuite\n", suite->name());
      }
      for (int test_index = 0; test_index < suite->total_test_count(); ++test_index) {
        const ::testing::TestInfo* info = suite->GetTestInfo(test_index);
        if (info->result()->Failed()) {
          std::printf("[  FAILED  ] %s.%s\n", suite->name(), info->name());
        }
      }
    }
    std::fflush(stdout);
  }
  void OnTestProgramEnd(const ::testing::UnitTest& unit) override {
    printer_->OnTestProgramEnd(unit);
  }

 private:
  std::unique_ptr<TestEventListener> printer_;
  bool suite_set_up_failed_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  TestEventListener* printer = listeners.Release(listeners.default_result_printer());
  if (printer != nullptr) listeners.Append(new SuiteSetUpFailurePrinter(printer));
  return RUN_ALL_TESTS();
}
