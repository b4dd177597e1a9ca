# Runs the cases of test_main_check one at a time, as CTest runs each case of a test binary, and
# checks what folio_test_main prints: a case of a suite whose SetUpTestSuite failed exits non-zero
# with no "[  SKIPPED ]" line (which CTest would report as a skip), a GTEST_SKIP case exits 0
# with one.  cmake -DBINARY=path -P check_test_main.cmake
execute_process(COMMAND "${BINARY}" --gtest_filter=BrokenSetUpTest.*
                RESULT_VARIABLE broken_code OUTPUT_VARIABLE broken_output ERROR_VARIABLE broken_output)
if(broken_code EQUAL 0)
  message(FATAL_ERROR "a case whose suite set-up failed exited 0:\n${broken_output}")
endif()
if(broken_output MATCHES "\\[  SKIPPED \\]")
  message(FATAL_ERROR "a case whose suite set-up failed printed [  SKIPPED ]:\n${broken_output}")
endif()
if(NOT broken_output MATCHES "\\[  FAILED  \\] BrokenSetUpTest.NeverRuns")
  message(FATAL_ERROR "the case of the broken suite is not reported failed:\n${broken_output}")
endif()
execute_process(COMMAND "${BINARY}" --gtest_filter=SkippingTest.*
                RESULT_VARIABLE skip_code OUTPUT_VARIABLE skip_output ERROR_VARIABLE skip_output)
if(NOT skip_code EQUAL 0 OR NOT skip_output MATCHES "\\[  SKIPPED \\] SkippingTest.SkipsWithAReason")
  message(FATAL_ERROR "a GTEST_SKIP case no longer reads as skipped (exit ${skip_code}):\n${skip_output}")
endif()
