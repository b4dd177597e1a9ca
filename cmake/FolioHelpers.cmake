# Helpers shared by every layer's CMakeLists.txt.

# Warnings for Folio's own targets (not for third-party code).
function(folio_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-unused-parameter)
  if(FOLIO_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# folio_add_layer(NAME SOURCES a.cc b.cc DEPS folio_base ... [PUBLIC_LIBS x y])
# Creates the static library folio_<NAME>; headers are included as "folio/<layer>/x.h".
function(folio_add_layer name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PUBLIC_LIBS;PRIVATE_LIBS" ${ARGN})
  set(target folio_${name})
  if(ARG_SOURCES)
    add_library(${target} STATIC ${ARG_SOURCES})
    target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(${target} PUBLIC ${ARG_DEPS} ${ARG_PUBLIC_LIBS} PRIVATE ${ARG_PRIVATE_LIBS})
    folio_set_warnings(${target})
  else()
    add_library(${target} INTERFACE)
    target_include_directories(${target} INTERFACE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(${target} INTERFACE ${ARG_DEPS} ${ARG_PUBLIC_LIBS})
  endif()
endfunction()

# folio_add_test(NAME SOURCES a_test.cc DEPS folio_x [LABELS concurrency gpu] [DATA_ARGS ...])
# One GoogleTest binary; each test case is registered with CTest (gtest_discover_tests), labelled
# with LABELS, so `ctest -L concurrency` runs the ThreadSanitizer set and `-L gpu` the GPU set.
function(folio_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest folio_test_main GTest::gmock)
  # Shared test machinery is included as "testing/x.h" (tests/testing/).
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${name} PRIVATE
    FOLIO_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    FOLIO_SHARED_DATA_DIR="${PROJECT_SOURCE_DIR}/../shared/data")
  folio_set_warnings(${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if("concurrency" IN_LIST ARG_LABELS)
    set_property(GLOBAL APPEND PROPERTY FOLIO_CONCURRENCY_TESTS ${name})
  endif()
  set(properties TIMEOUT ${ARG_TIMEOUT})
  if(ARG_LABELS)
    # An empty LABELS value would swallow the next key, so it is only passed when set.
    list(APPEND properties LABELS "${ARG_LABELS}")
  endif()
  gtest_discover_tests(${name} PROPERTIES ${properties} DISCOVERY_TIMEOUT 60)
endfunction()

# folio_add_benchmark(NAME SOURCES a_bench.cc DEPS folio_x)
function(folio_add_benchmark name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} benchmark::benchmark)
  folio_set_warnings(${name})
endfunction()
