// Matmul under a multi-threaded pool (labelled `concurrency`: also run under ThreadSanitizer):
// results bit-identical to one thread, and captured launches replayed on new inputs.
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "folio/base/thread_pool.h"
#include "folio/kernels/cpu/matmul.h"
#include "folio/kernels/cpu/simd_level.h"
#include "tests/kernels/matmul_test_util.h"

namespace folio::kernels::cpu {
namespace {

using namespace ::folio::kernels::cpu::matmul_testing;  // NOLINT

struct Shape {
  int64_t rows;
  int64_t output_features;
  int64_t input_features;
};

class MatmulThreadsTest : public ::testing::Test {
 protected:
  ThreadPool single_thread_{1};
  ThreadPool two_threads_{2};
};

TEST_F(MatmulThreadsTest, ResultsAreIdenticalForOneAndTwoThreads) {
  device::HostStream one(single_thread_);
  device::HostStream two(two_threads_);
  for (SimdLevel level : supported_simd_levels()) {
    ScopedSimdLevel scoped(level);
    for (DType dtype : kWeightDtypes) {
      std::vector<Shape> shapes = {{1, 203, 256}, {17, 203, 128}, {300, 21, 1024}};
      // f32 only: two row tiles and three column tiles of the sgemm path.
      if (dtype == DType::kF32) shapes.push_back({136, 260, kSgemmMinInputFeatures});
      for (const Shape& shape : shapes) {
        SCOPED_TRACE(std::string(simd_level_name(level)) + " " + std::string(dtype_name(dtype)) +
                     " M=" + std::to_string(shape.rows));
        const Problem problem(shape.rows, shape.output_features, shape.input_features, dtype, true,
                              5);
        const std::vector<float> single = problem.run(one);
        const std::vector<float> parallel = problem.run(two);
        ASSERT_EQ(std::memcmp(single.data(), parallel.data(), single.size() * sizeof(float)), 0);
      }
    }
  }
}

TEST_F(MatmulThreadsTest, ReplayOfACapturedLaunchMatchesEagerLaunchOnNewInputs) {
  device::HostStream stream(two_threads_);
  for (DType dtype : kWeightDtypes) {
    // The last shape takes the sgemm path for f32.
    for (const Shape& shape : {Shape{1, 77, 128}, Shape{17, 77, 128},
                               Shape{kSgemmMinRows, 21, kSgemmMinInputFeatures}}) {
      const int64_t rows = shape.rows;
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " M=" + std::to_string(rows));
      Problem problem(rows, shape.output_features, shape.input_features, dtype, true, 21);
      const int64_t workspace_bytes =
          matmul_workspace_bytes(dtype, rows, shape.input_features, stream.pool().num_threads());
      AlignedBuffer workspace(workspace_bytes);
      std::vector<float> replayed(rows * shape.output_features,
                                  std::numeric_limits<float>::quiet_NaN());
      stream.begin_capture();
      matmul(stream, problem.arguments(replayed.data(), workspace.data(), workspace_bytes));
      const device::HostGraph graph = stream.end_capture();
      EXPECT_EQ(graph.num_kernels(), is_quantized(dtype) ? 2u : 1u);

      // New values behind the same pointers, as a replayed step sees them.
      for (float& value : problem.input) value = -0.5f * value + 0.25f;
      stream.replay(graph);
      const std::vector<float> eager = problem.run(stream);
      ASSERT_EQ(std::memcmp(eager.data(), replayed.data(), eager.size() * sizeof(float)), 0);
      expect_matches_reference(problem, replayed);
    }
  }
}

// The block types of GGUF files (random block bytes, K whole super-blocks): 1 vs 2 threads on
// every level, and a replay on new inputs equals the eager launch.
TEST_F(MatmulThreadsTest, BlockTypesAreThreadCountIndependentAndReplayable) {
  device::HostStream one(single_thread_);
  device::HostStream two(two_threads_);
  for (DType dtype : kBlockDtypes) {
    for (SimdLevel level : supported_simd_levels()) {
      ScopedSimdLevel scoped(level);
      for (const Shape& shape : {Shape{1, 203, 512}, Shape{17, 203, 256}}) {
        SCOPED_TRACE(std::string(simd_level_name(level)) + " " + std::string(dtype_name(dtype)) +
                     " M=" + std::to_string(shape.rows));
        const Problem problem(shape.rows, shape.output_features, shape.input_features, dtype, true,
                              5);
        const std::vector<float> single = problem.run(one);
        const std::vector<float> parallel = problem.run(two);
        ASSERT_EQ(std::memcmp(single.data(), parallel.data(), single.size() * sizeof(float)), 0);
      }
    }
    SCOPED_TRACE(std::string(dtype_name(dtype)) + " replay");
    Problem problem(5, 77, 512, dtype, true, 21);
    const int64_t workspace_bytes = matmul_workspace_bytes(dtype, 5, 512, 2);
    AlignedBuffer workspace(workspace_bytes);
    std::vector<float> replayed(5 * 77, std::numeric_limits<float>::quiet_NaN());
    two.begin_capture();
    matmul(two, problem.arguments(replayed.data(), workspace.data(), workspace_bytes));
    const device::HostGraph graph = two.end_capture();
    EXPECT_EQ(graph.num_kernels(), 2u);
    for (float& value : problem.input) value = -0.5f * value + 0.25f;
    two.replay(graph);
    const std::vector<float> eager = problem.run(two);
    ASSERT_EQ(std::memcmp(eager.data(), replayed.data(), eager.size() * sizeof(float)), 0);
    expect_matches_reference(problem, replayed);
  }
}

}  // namespace
}  // namespace folio::kernels::cpu
