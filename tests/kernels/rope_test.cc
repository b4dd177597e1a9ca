// RoPE against a double-precision reference for both pair conventions, the model families'
// theta values, linear and Llama-3 frequency scaling, partial rotation and positions up to the
// millions; plus a captured launch that follows new positions on replay.
#include "folio/kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "folio/base/thread_pool.h"
#include "folio/device/host_stream.h"
#include "kernel_test_util.h"

namespace folio::kernels::testing {
namespace {

using kernels::RopeStyle;

// Inputs in [-1, 1]; the kernel rounds a double rotation once, so half an ulp of an output
// below 1.5 (9e-8) plus the double cos/sin error is the whole difference.
constexpr double kTolerance = 1e-7;

struct RopeCase {
  RopeStyle style;
  float theta_base;
  float position_scale;
  int32_t head_dim;
  int32_t rotary_dim;
  bool llama3_scaling;
};

// Rotates one head in double: pair i of (x[a], x[b]) by position * scale / (theta^(2i/d) f_i).
void reference_rotate(const RopeCase& rope, const std::vector<float>& factors, int64_t position,
                      const float* head, double* out) {
  for (int32_t d = 0; d < rope.head_dim; ++d) out[d] = head[d];
  const int32_t pairs = rope.rotary_dim / 2;
  for (int32_t i = 0; i < pairs; ++i) {
    const int32_t a = rope.style == RopeStyle::kNormal ? 2 * i : i;
    const int32_t b = rope.style == RopeStyle::kNormal ? 2 * i + 1 : i + pairs;
    double frequency = 1.0 / std::pow(double{rope.theta_base}, 2.0 * i / rope.rotary_dim);
    if (!factors.empty()) frequency /= factors[i];
    const double angle = static_cast<double>(position) * rope.position_scale * frequency;
    out[a] = head[a] * std::cos(angle) - head[b] * std::sin(angle);
    out[b] = head[a] * std::sin(angle) + head[b] * std::cos(angle);
  }
}

class RopeTest : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeTest, MatchesDoubleReferenceIncludingLargePositions) {
  const RopeCase rope = GetParam();
  constexpr int32_t kHeads = 4, kKvHeads = 2;
  // Up to 1.2e8: past where an f32 angle or position loses integers (2^24 + 1), still where a
  // double angle is good to 1e-8 radians (at 2e9 two valid double formulas differ by 2e-7).
  const std::vector<int32_t> positions = {0,      1,        7,       4095, 8191,     32768,
                                          131071, 16777217, 1000000, 3,    123456789};
  const int64_t tokens = static_cast<int64_t>(positions.size());
  // Q and K are column ranges of one fused QKV row, so both have a row stride.
  const int64_t stride = int64_t{kHeads + 2 * kKvHeads} * rope.head_dim;
  std::mt19937 rng(rope.head_dim + static_cast<int>(rope.style));
  std::vector<float> qkv = random_floats(rng, tokens * stride);
  const std::vector<float> original = qkv;
  std::vector<float> factors;
  if (rope.llama3_scaling) {
    factors.resize(rope.rotary_dim / 2);
    cpu::llama3_frequency_factors(cpu::Llama3RopeScaling{}, rope.theta_base, rope.rotary_dim,
                                  factors.data());
  }

  ThreadPool pool(2);
  device::HostStream stream(pool);
  cpu::rope(stream,
            cpu::RopeArguments{.query = qkv.data(),
                               .key = qkv.data() + kHeads * rope.head_dim,
                               .query_row_stride = stride,
                               .key_row_stride = stride,
                               .positions = positions.data(),
                               .frequency_factors = factors.empty() ? nullptr : factors.data(),
                               .num_tokens = tokens,
                               .num_heads = kHeads,
                               .num_kv_heads = kKvHeads,
                               .head_dim = rope.head_dim,
                               .rotary_dim = rope.rotary_dim,
                               .style = rope.style,
                               .theta_base = rope.theta_base,
                               .position_scale = rope.position_scale});

  std::vector<double> expected(qkv.size());
  for (int64_t token = 0; token < tokens; ++token) {
    for (int32_t head = 0; head < kHeads + 2 * kKvHeads; ++head) {
      const int64_t offset = token * stride + int64_t{head} * rope.head_dim;
      if (head < kHeads + kKvHeads) {  // queries and keys rotate, the V columns do not
        reference_rotate(rope, factors, positions[token], original.data() + offset,
                         expected.data() + offset);
      } else {
        for (int32_t d = 0; d < rope.head_dim; ++d) expected[offset + d] = original[offset + d];
      }
    }
  }
  expect_near_all(qkv, expected, kTolerance, 0.0, "rope");
}

std::string rope_case_name(const ::testing::TestParamInfo<RopeCase>& info) {
  const RopeCase& rope = info.param;
  return std::string(rope.style == RopeStyle::kNormal ? "normal" : "neox") + "_theta" +
         std::to_string(static_cast<int64_t>(rope.theta_base)) + "_dim" +
         std::to_string(rope.head_dim) + "_rotary" + std::to_string(rope.rotary_dim) +
         (rope.position_scale != 1.0f ? "_linear" : "") + (rope.llama3_scaling ? "_llama3" : "");
}

INSTANTIATE_TEST_SUITE_P(
    ModelFamilies, RopeTest,
    ::testing::Values(RopeCase{RopeStyle::kNormal, 10000.0f, 1.0f, 128, 128, false},  // Llama 2
                      RopeCase{RopeStyle::kNormal, 500000.0f, 1.0f, 128, 128, true},  // Llama 3.1
                      RopeCase{RopeStyle::kNormal, 10000.0f, 0.25f, 64, 64, false},   // linear x4
                      RopeCase{RopeStyle::kNeox, 1000000.0f, 1.0f, 128, 128, false},  // Qwen2
                      RopeCase{RopeStyle::kNeox, 10000.0f, 1.0f, 80, 32, false},      // partial
                      RopeCase{RopeStyle::kNormal, 10000.0f, 0.5f, 40, 24, false}),
    rope_case_name);

TEST(RopeScalingTest, Llama3FactorsKeepHighFrequenciesAndStretchLowOnes) {
  constexpr int32_t kRotaryDim = 128;
  const cpu::Llama3RopeScaling scaling;  // factor 8, low 1, high 4, context 8192
  std::vector<float> factors(kRotaryDim / 2);
  cpu::llama3_frequency_factors(scaling, 500000.0f, kRotaryDim, factors.data());
  int interpolated = 0;
  for (int32_t i = 0; i < kRotaryDim / 2; ++i) {
    const double wavelength = 2 * std::numbers::pi * std::pow(500000.0, 2.0 * i / kRotaryDim);
    if (wavelength < 8192.0 / 4) {
      EXPECT_EQ(factors[i], 1.0f) << i;
    } else if (wavelength > 8192.0 / 1) {
      EXPECT_EQ(factors[i], 8.0f) << i;
    } else {  // new frequency = (1 - s) f / 8 + s f with s = (8192 / wavelength - 1) / 3
      const double smooth = (8192.0 / wavelength - 1.0) / 3.0;
      EXPECT_NEAR(factors[i], 1.0 / ((1 - smooth) / 8.0 + smooth), 1e-6) << i;
      ++interpolated;
    }
    if (i > 0) {
      EXPECT_GE(factors[i], factors[i - 1]) << i;
    }
  }
  EXPECT_GT(interpolated, 0);
}

// YaRN with original context 64, theta 10000, 16 rotary dimensions: the correction dimensions
// are floor(16 ln(64 / (32 * 2 pi)) / (2 ln 10000)) < 0 -> 0 and ceil(16 ln(64 / (2 pi)) /
// (2 ln 10000)) = ceil(2.016) = 3, so pair 0 keeps its frequency, pairs 3.. are divided by the
// factor, and pairs 1 and 2 blend the two with ramps 2/3 and 1/3.
TEST(RopeScalingTest, YarnFactorsRampFromKeptToInterpolatedFrequencies) {
  cpu::YarnRopeScaling scaling;
  scaling.factor = 4.0f;
  scaling.original_context_length = 64;
  std::vector<float> factors(8);
  cpu::yarn_frequency_factors(scaling, 10000.0f, 16, factors.data());
  EXPECT_FLOAT_EQ(factors[0], 1.0f);
  EXPECT_FLOAT_EQ(factors[1], static_cast<float>(1.0 / (0.25 / 3 + 2.0 / 3)));
  EXPECT_FLOAT_EQ(factors[2], static_cast<float>(1.0 / (0.25 * 2 / 3 + 1.0 / 3)));
  for (int i = 3; i < 8; ++i) EXPECT_FLOAT_EQ(factors[i], 4.0f) << i;
  EXPECT_FLOAT_EQ(cpu::yarn_magnitude_scale(scaling), static_cast<float>(1 + 0.1 * std::log(4.0)));
  scaling.extrapolation_factor = 0.0f;  // pure interpolation, no magnitude change
  scaling.attention_factor = 0.5f;
  cpu::yarn_frequency_factors(scaling, 10000.0f, 16, factors.data());
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(factors[i], 4.0f) << i;
  EXPECT_FLOAT_EQ(cpu::yarn_magnitude_scale(scaling), 0.5f);
}

TEST(RopeReplayTest, CapturedLaunchUsesThePositionsPresentAtReplay) {
  constexpr int32_t kHeadDim = 64, kTokens = 5;
  std::mt19937 rng(8);
  const std::vector<float> input = random_floats(rng, 2 * kTokens * kHeadDim);
  std::vector<float> query(kTokens * kHeadDim), key(kTokens * kHeadDim);
  std::vector<int32_t> positions = {0, 1, 2, 3, 4};
  const cpu::RopeArguments arguments{.query = query.data(),
                                     .key = key.data(),
                                     .query_row_stride = kHeadDim,
                                     .key_row_stride = kHeadDim,
                                     .positions = positions.data(),
                                     .num_tokens = kTokens,
                                     .num_heads = 1,
                                     .num_kv_heads = 1,
                                     .head_dim = kHeadDim,
                                     .rotary_dim = kHeadDim,
                                     .style = RopeStyle::kNeox};
  ThreadPool pool(2);
  device::HostStream stream(pool);
  stream.begin_capture();
  cpu::rope(stream, arguments);
  const device::HostGraph graph = stream.end_capture();

  const auto reset = [&] {
    std::copy(input.begin(), input.begin() + kTokens * kHeadDim, query.begin());
    std::copy(input.begin() + kTokens * kHeadDim, input.end(), key.begin());
  };
  positions = {900, 17, 5000, 3, 65536};  // same buffer, new values
  reset();
  stream.replay(graph);
  const std::vector<float> replayed_query = query, replayed_key = key;
  reset();
  cpu::rope(stream, arguments);
  EXPECT_EQ(replayed_query, query);
  EXPECT_EQ(replayed_key, key);
  const RopeCase rope{RopeStyle::kNeox, 10000.0f, 1.0f, kHeadDim, kHeadDim, false};
  std::vector<double> expected(kHeadDim);
  for (int32_t token = 0; token < kTokens; ++token) {
    reference_rotate(rope, {}, positions[token], input.data() + token * kHeadDim, expected.data());
    const std::vector<float> row(query.begin() + token * kHeadDim,
                                 query.begin() + (token + 1) * kHeadDim);
    expect_near_all(row, expected, kTolerance, 0.0, "replayed token " + std::to_string(token));
  }
}

// The kernel's own arithmetic, written out without any reuse between calls: what every call
// must return bit for bit, whatever the calls before it on the same thread were.
void uncached_rope(const cpu::RopeArguments& arguments, const float* query_in, const float* key_in,
                   std::vector<float>& query_out, std::vector<float>& key_out) {
  const int32_t pairs = arguments.rotary_dim / 2;
  query_out.assign(query_in, query_in + arguments.num_tokens * arguments.query_row_stride);
  key_out.assign(key_in, key_in + arguments.num_tokens * arguments.key_row_stride);
  for (int64_t token = 0; token < arguments.num_tokens; ++token) {
    const double scaled_position = static_cast<double>(arguments.positions[token]) *
                                   static_cast<double>(arguments.position_scale);
    const auto rotate = [&](float* head) {
      for (int32_t i = 0; i < pairs; ++i) {
        double inverse_frequency =
            std::pow(static_cast<double>(arguments.theta_base), -2.0 * i / arguments.rotary_dim);
        if (arguments.frequency_factors) inverse_frequency /= arguments.frequency_factors[i];
        const double angle = scaled_position * inverse_frequency;
        const double cosine = std::cos(angle) * arguments.magnitude_scale;
        const double sine = std::sin(angle) * arguments.magnitude_scale;
        float* first = head + (arguments.style == RopeStyle::kNormal ? 2 * i : i);
        float* second = first + (arguments.style == RopeStyle::kNormal ? 1 : pairs);
        const double x0 = *first, x1 = *second;
        *first = static_cast<float>(x0 * cosine - x1 * sine);
        *second = static_cast<float>(x0 * sine + x1 * cosine);
      }
    };
    for (int32_t head = 0; head < arguments.num_heads; ++head) {
      rotate(query_out.data() + token * arguments.query_row_stride + head * arguments.head_dim);
    }
    for (int32_t head = 0; head < arguments.num_kv_heads; ++head) {
      rotate(key_out.data() + token * arguments.key_row_stride + head * arguments.head_dim);
    }
  }
}

TEST(RopeAngleReuseTest, EveryCallEqualsAFreshComputationWhateverCameBefore) {
  // The kernel keeps the last position's angles per thread (a step's layers repeat them). Calls
  // that change one input at a time (theta, rotary dim, position and magnitude scale, the factor
  // values behind the same pointer, the positions) must each give the fresh result bit for bit.
  constexpr int32_t kHeadDim = 32;
  std::mt19937 rng(21);
  std::vector<float> factors(kHeadDim / 2, 1.0f);
  std::vector<int32_t> positions = {7};
  std::vector<float> query(2 * kHeadDim * 3), key(kHeadDim * 3);
  const std::vector<float> query_in = random_floats(rng, static_cast<int64_t>(query.size()));
  const std::vector<float> key_in = random_floats(rng, static_cast<int64_t>(key.size()));
  cpu::RopeArguments arguments{.query = query.data(),
                               .key = key.data(),
                               .query_row_stride = 2 * kHeadDim,
                               .key_row_stride = kHeadDim,
                               .positions = positions.data(),
                               .num_tokens = 1,
                               .num_heads = 2,
                               .num_kv_heads = 1,
                               .head_dim = kHeadDim,
                               .rotary_dim = kHeadDim,
                               .style = RopeStyle::kNeox};
  std::vector<float> expected_query, expected_key;
  for (int call = 0; call < 400; ++call) {
    switch (rng() % 8) {
      case 0:
        arguments.theta_base = rng() % 2 ? 10000.0f : 500000.0f;
        break;
      case 1:
        arguments.rotary_dim = rng() % 2 ? kHeadDim : kHeadDim / 2;
        break;
      case 2:
        arguments.position_scale = rng() % 2 ? 1.0f : 0.25f;
        break;
      case 3:
        arguments.magnitude_scale = rng() % 2 ? 1.0f : 1.125f;
        break;
      case 4:
        arguments.frequency_factors = rng() % 2 ? factors.data() : nullptr;
        break;
      case 5:
        factors[rng() % factors.size()] = 1.0f + static_cast<float>(rng() % 4);
        break;
      case 6:
        positions = {static_cast<int32_t>(rng() % 3), static_cast<int32_t>(rng() % 3),
                     static_cast<int32_t>(rng() % 3)};
        arguments.positions = positions.data();
        arguments.num_tokens = 1 + static_cast<int64_t>(rng() % 3);
        break;
      default:
        arguments.style = rng() % 2 ? RopeStyle::kNeox : RopeStyle::kNormal;
        break;
    }
    std::copy(query_in.begin(), query_in.end(), query.begin());
    std::copy(key_in.begin(), key_in.end(), key.begin());
    cpu::rope_body(arguments, 0, arguments.num_tokens, 0);
    uncached_rope(arguments, query_in.data(), key_in.data(), expected_query, expected_key);
    ASSERT_EQ(std::vector<float>(query.begin(),
                                 query.begin() + static_cast<int64_t>(expected_query.size())),
              expected_query)
        << "call " << call;
    ASSERT_EQ(
        std::vector<float>(key.begin(), key.begin() + static_cast<int64_t>(expected_key.size())),
        expected_key)
        << "call " << call;
  }
}

}  // namespace
}  // namespace folio::kernels::testing
