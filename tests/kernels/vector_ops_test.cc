// VectorOps on every SIMD path against double-precision references, at sizes that exercise
// full vectors and partial tails; plus the exactness properties other kernels rely on
// (key_scores is dot exactly, f16 conversion is bit-exact, maximum ignores NaN).
#include "folio/kernels/cpu/vector_ops.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "folio/tensor/half.h"
#include "kernel_test_util.h"

namespace folio::kernels::testing {
namespace {

using cpu::VectorOps;

constexpr int64_t kSizes[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 40, 64, 100, 128, 4099};
constexpr float kInfinity = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

class VectorOpsTest : public ::testing::TestWithParam<SimdPath> {
 protected:
  const VectorOps& ops() const { return cpu::vector_ops_for(GetParam()); }
  std::mt19937 rng_{1234};
};

TEST_P(VectorOpsTest, ReductionsMatchDoubleReference) {
  for (int64_t n : kSizes) {
    const std::vector<float> a = random_floats(rng_, n);
    const std::vector<float> b = random_floats(rng_, n);
    double dot = 0, magnitude = 0, squares = 0, best = -1e300;
    for (int64_t i = 0; i < n; ++i) {
      dot += double{a[i]} * b[i];
      magnitude += std::fabs(double{a[i]} * b[i]);
      squares += double{a[i]} * a[i];
      best = std::max(best, double{a[i]});
    }
    // f32 accumulation in 8 or 16 lanes over at most 4099 terms: within 2e-6 of the sum of
    // magnitudes (the worst-case bound, 4099 / 8 * 2^-24, is 3e-5).
    EXPECT_NEAR(ops().dot(a.data(), b.data(), n), dot, 2e-6 * magnitude + 1e-7) << n;
    EXPECT_NEAR(ops().sum_squares(a.data(), n), squares, 2e-6 * squares + 1e-7) << n;
    EXPECT_EQ(ops().maximum(a.data(), n), static_cast<float>(best)) << n;
  }
}

TEST_P(VectorOpsTest, MaximumIgnoresNanAndHandlesEmptyRows) {
  for (int64_t n : kSizes) {
    std::vector<float> x(n, kNan);
    EXPECT_EQ(ops().maximum(x.data(), n), -kInfinity) << "all NaN, n = " << n;
    x[n / 2] = -3.0f;
    EXPECT_EQ(ops().maximum(x.data(), n), -3.0f) << "one value among NaN, n = " << n;
  }
  EXPECT_EQ(ops().maximum(nullptr, 0), -kInfinity);
}

TEST_P(VectorOpsTest, ElementwiseOpsMatchReferenceInPlaceToo) {
  for (int64_t n : kSizes) {
    const std::vector<float> x = random_floats(rng_, n, -6.0f, 6.0f);
    const std::vector<float> y = random_floats(rng_, n);
    std::vector<double> scaled(n), silu(n), sum(n);
    for (int64_t i = 0; i < n; ++i) {
      scaled[i] = double{x[i]} * 0.37 * y[i];
      silu[i] = double{x[i]} / (1.0 + std::exp(-double{x[i]})) * y[i];
      sum[i] = double{x[i]} + y[i];
    }
    std::vector<float> out(n);
    ops().multiply_scaled(out.data(), x.data(), y.data(), 0.37f, n);
    expect_near_all(out, scaled, 1e-7, 3e-7, "multiply_scaled");
    ops().silu_multiply(out.data(), x.data(), y.data(), n);
    expect_near_all(out, silu, 1e-7, 1e-6, "silu_multiply");
    std::vector<float> in_place = x;
    ops().add(in_place.data(), in_place.data(), y.data(), n);
    expect_near_all(in_place, sum, 0.0, 1e-7, "add in place");
    ops().scale(in_place.data(), -2.0f, n);
    for (double& value : sum) value *= -2.0;
    expect_near_all(in_place, sum, 0.0, 1e-7, "scale");
  }
}

TEST_P(VectorOpsTest, ExpShiftedSumIsAccurateOverTheWholeRange) {
  // Inputs spanning exp's range: results within a few ulp of exp of the f32 argument
  // x * multiplier - shift (the multiplication by 2 is exact, the subtraction rounds once on
  // every path), sum within f32 summation error.
  for (int64_t n : kSizes) {
    const std::vector<float> x = random_floats(rng_, n, -40.0f, 40.0f);
    std::vector<float> out(n);
    const float sum = ops().exp_shifted_sum(out.data(), x.data(), 2.0f, 1.5f, n);
    std::vector<double> expected(n);
    double expected_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float argument = x[i] * 2.0f - 1.5f;
      expected[i] = std::exp(double{argument});
      if (expected[i] < 1.2e-38) expected[i] = 0.0;  // AVX paths flush below FLT_MIN
      expected_sum += expected[i];
    }
    expect_near_all(out, expected, 1.2e-38, 1e-6, "exp_shifted_sum values");
    EXPECT_NEAR(sum, expected_sum, 1e-6 * expected_sum) << n;
  }
}

TEST_P(VectorOpsTest, ExpOfMinusInfinityIsZero) {
  std::vector<float> x(19, -kInfinity);
  x[4] = 0.0f;
  std::vector<float> out(x.size());
  EXPECT_EQ(ops().exp_shifted_sum(out.data(), x.data(), 1.0f, 0.0f, 19), 1.0f);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], i == 4 ? 1.0f : 0.0f) << i;
}

TEST_P(VectorOpsTest, KeyScoresEqualScaledDotExactly) {
  // The attention kernel's results must not depend on how heads and keys are tiled: every score
  // is bit-identical to scale * dot(query, key), for any number of queries (more than one
  // pass's worth too) and keys: rows of up to 40 keys reach the reduced tiles of every width
  // (16 keys of 1 query, 8 of 2, 4 of 4 on AVX-512) and their left-over keys.
  for (int64_t head_dim : {13, 40, 64, 128}) {
    const int64_t key_stride = head_dim * 3;
    const int64_t max_keys = 40, max_queries = 10, score_stride = 41;
    const std::vector<float> queries = random_floats(rng_, max_queries * head_dim, -2.0f, 2.0f);
    const std::vector<float> keys = random_floats(rng_, max_keys * key_stride);
    std::vector<uint16_t> keys_f16(keys.size());
    std::vector<float> keys_rounded(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      keys_f16[i] = f32_to_f16(keys[i]);
      keys_rounded[i] = f16_to_f32(keys_f16[i]);
    }
    for (int64_t num_queries = 1; num_queries <= max_queries; ++num_queries) {
      for (int64_t num_keys = 1; num_keys <= max_keys; ++num_keys) {
        std::vector<float> scores(max_queries * score_stride), scores_f16(scores.size());
        ops().key_scores_f32(scores.data(), score_stride, queries.data(), head_dim, num_queries,
                             keys.data(), key_stride, num_keys, head_dim, 0.125f);
        ops().key_scores_f16(scores_f16.data(), score_stride, queries.data(), head_dim, num_queries,
                             keys_f16.data(), key_stride, num_keys, head_dim, 0.125f);
        for (int64_t q = 0; q < num_queries; ++q) {
          const float* query = queries.data() + q * head_dim;
          for (int64_t t = 0; t < num_keys; ++t) {
            ASSERT_EQ(scores[q * score_stride + t],
                      ops().dot(query, keys.data() + t * key_stride, head_dim) * 0.125f)
                << "query " << q << " of " << num_queries << ", key " << t << " of " << num_keys;
            ASSERT_EQ(scores_f16[q * score_stride + t],
                      ops().dot(query, keys_rounded.data() + t * key_stride, head_dim) * 0.125f);
          }
        }
      }
    }
  }
}

TEST_P(VectorOpsTest, AccumulateValuesMatchesReferenceAndIgnoresGrouping) {
  for (int64_t head_dim : {13, 40, 64, 72, 128}) {
    const int64_t value_stride = head_dim * 2 + 8;
    const int64_t weight_stride = 16;
    for (int64_t num_queries : {1, 2, 3, 8, 9}) {
      for (int64_t num_values : {1, 5, 16}) {
        const std::vector<float> weights =
            random_floats(rng_, num_queries * weight_stride, 0.0f, 1.0f);
        const std::vector<float> values = random_floats(rng_, num_values * value_stride);
        std::vector<uint16_t> values_f16(values.size());
        for (size_t i = 0; i < values.size(); ++i) values_f16[i] = f32_to_f16(values[i]);
        const std::vector<float> start = random_floats(rng_, num_queries * head_dim);
        std::vector<double> expected(start.size()), expected_f16(start.size());
        for (int64_t q = 0; q < num_queries; ++q) {
          for (int64_t d = 0; d < head_dim; ++d) {
            double sum = start[q * head_dim + d], sum_f16 = sum;
            for (int64_t t = 0; t < num_values; ++t) {
              const double weight = weights[q * weight_stride + t];
              sum += weight * values[t * value_stride + d];
              sum_f16 += weight * f16_to_f32(values_f16[t * value_stride + d]);
            }
            expected[q * head_dim + d] = sum;
            expected_f16[q * head_dim + d] = sum_f16;
          }
        }
        std::vector<float> together = start;
        ops().accumulate_values_f32(together.data(), head_dim, weights.data(), weight_stride,
                                    num_queries, values.data(), value_stride, num_values, head_dim);
        expect_near_all(together, expected, 2e-6, 1e-6, "accumulate_values_f32");
        std::vector<float> alone = start;  // one query at a time: the same bits
        for (int64_t q = 0; q < num_queries; ++q) {
          ops().accumulate_values_f32(alone.data() + q * head_dim, head_dim,
                                      weights.data() + q * weight_stride, weight_stride, 1,
                                      values.data(), value_stride, num_values, head_dim);
        }
        EXPECT_EQ(alone, together) << num_queries << " queries, head_dim " << head_dim;
        std::vector<float> half = start;
        ops().accumulate_values_f16(half.data(), head_dim, weights.data(), weight_stride,
                                    num_queries, values_f16.data(), value_stride, num_values,
                                    head_dim);
        expect_near_all(half, expected_f16, 2e-6, 1e-6, "accumulate_values_f16");
      }
    }
  }
}

TEST_P(VectorOpsTest, F16ConversionIsBitExactWithScalarReference) {
  std::vector<float> values = random_floats(rng_, 1000, -70000.0f, 70000.0f);
  const std::vector<float> small = random_floats(rng_, 1000, -1e-4f, 1e-4f);  // subnormal f16
  values.insert(values.end(), small.begin(), small.end());
  for (float special : {0.0f, -0.0f, kInfinity, -kInfinity, kNan, 65504.0f, 65520.0f, 6e-8f}) {
    values.push_back(special);
  }
  for (int64_t n : {int64_t{1}, int64_t{9}, int64_t{17}, static_cast<int64_t>(values.size())}) {
    std::vector<uint16_t> out(n + 1, 0xabcd);
    ops().f32_to_f16(out.data(), values.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out[i], f32_to_f16(values[i])) << values[i];
    EXPECT_EQ(out[n], 0xabcd) << "wrote past the end";
  }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, VectorOpsTest, ::testing::ValuesIn(supported_simd_paths()),
                         simd_path_test_name);

TEST(SimdPathTest, BestPathIsSupportedAndActiveByDefault) {
  EXPECT_TRUE(cpu::simd_path_supported(cpu::best_simd_path()));
  EXPECT_EQ(cpu::active_simd_path(), cpu::best_simd_path());
  for (SimdPath path : supported_simd_paths()) {
    ScopedSimdPath scoped(path);
    EXPECT_EQ(cpu::vector_ops().path, path);
  }
  EXPECT_EQ(cpu::active_simd_path(), cpu::best_simd_path());
}

}  // namespace
}  // namespace folio::kernels::testing
