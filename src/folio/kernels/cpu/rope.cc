#include "folio/kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "folio/base/check.h"
#include "folio/kernels/cpu/work_partition.h"

namespace folio::kernels::cpu {
namespace {

constexpr int32_t kMaxPairs = kRopeMaxRotaryDim / 2;

// Rotates the first 2 * num_pairs values of one head.
void rotate_head(float* head, const double* cosines, const double* sines, int32_t num_pairs,
                 kernels::RopeStyle style) {
  const int32_t stride = style == kernels::RopeStyle::kNormal ? 2 : 1;
  const int32_t partner_offset = style == kernels::RopeStyle::kNormal ? 1 : num_pairs;
  for (int32_t i = 0; i < num_pairs; ++i) {
    float* first = head + i * stride;
    float* second = first + partner_offset;
    const double x0 = *first;
    const double x1 = *second;
    *first = static_cast<float>(x0 * cosines[i] - x1 * sines[i]);
    *second = static_cast<float>(x0 * sines[i] + x1 * cosines[i]);
  }
}

// The angles of the last position this thread rotated. A step's RoPE ops (one per layer) all
// see the same positions with the same frequencies, and at batch 1 each op has one token, so
// all but the first op of a step find their cosines and sines here instead of paying
// rotary_dim / 2 pow, sin and cos calls again (12-25 us per tiny-model decode step). Hits return
// the values a fresh computation gives, bit for bit: every input of the computation is in the
// key, frequency factors by value.
struct RopeAngleCache {
  bool valid = false;
  float theta_base = 0.0f;
  int32_t rotary_dim = 0;
  bool has_frequency_factors = false;
  float frequency_factors[kMaxPairs] = {};
  double inverse_frequencies[kMaxPairs] = {};

  bool has_angles = false;
  int32_t position = 0;
  float position_scale = 0.0f;
  float magnitude_scale = 0.0f;
  double cosines[kMaxPairs] = {};
  double sines[kMaxPairs] = {};
};

thread_local RopeAngleCache rope_angle_cache;

// Makes the cache's inverse frequencies those of `arguments`.
void use_frequencies(const RopeArguments& arguments, RopeAngleCache& cache) {
  const int32_t num_pairs = arguments.rotary_dim / 2;
  const bool has_factors = arguments.frequency_factors != nullptr;
  if (cache.valid && cache.theta_base == arguments.theta_base &&
      cache.rotary_dim == arguments.rotary_dim && cache.has_frequency_factors == has_factors &&
      (!has_factors ||
       std::equal(arguments.frequency_factors, arguments.frequency_factors + num_pairs,
                  cache.frequency_factors))) {
    return;
  }
  cache.valid = true;
  cache.has_angles = false;
  cache.theta_base = arguments.theta_base;
  cache.rotary_dim = arguments.rotary_dim;
  cache.has_frequency_factors = has_factors;
  for (int32_t i = 0; i < num_pairs; ++i) {
    const double exponent = -2.0 * i / arguments.rotary_dim;
    cache.inverse_frequencies[i] = std::pow(static_cast<double>(arguments.theta_base), exponent);
    if (has_factors) {
      cache.frequency_factors[i] = arguments.frequency_factors[i];
      cache.inverse_frequencies[i] /= arguments.frequency_factors[i];
    }
  }
}

// Makes the cache's angles those of `position` (after use_frequencies).
void use_angles(const RopeArguments& arguments, int32_t position, RopeAngleCache& cache) {
  if (cache.has_angles && cache.position == position &&
      cache.position_scale == arguments.position_scale &&
      cache.magnitude_scale == arguments.magnitude_scale) {
    return;
  }
  cache.has_angles = true;
  cache.position = position;
  cache.position_scale = arguments.position_scale;
  cache.magnitude_scale = arguments.magnitude_scale;
  const double scaled_position =
      static_cast<double>(position) * static_cast<double>(arguments.position_scale);
  for (int32_t i = 0; i < arguments.rotary_dim / 2; ++i) {
    const double angle = scaled_position * cache.inverse_frequencies[i];
    cache.cosines[i] = std::cos(angle) * arguments.magnitude_scale;
    cache.sines[i] = std::sin(angle) * arguments.magnitude_scale;
  }
}

}  // namespace

void rope_body(const RopeArguments& arguments, int64_t begin, int64_t end, int /*thread_index*/) {
  const int32_t num_pairs = arguments.rotary_dim / 2;
  RopeAngleCache& cache = rope_angle_cache;
  use_frequencies(arguments, cache);
  for (int64_t token = begin; token < end; ++token) {
    const int32_t position = arguments.positions[token];
    FOLIO_DCHECK(position >= 0, "rope: token {} has position {}", token, position);
    use_angles(arguments, position, cache);
    float* query = arguments.query + token * arguments.query_row_stride;
    for (int32_t head = 0; head < arguments.num_heads; ++head) {
      rotate_head(query + int64_t{head} * arguments.head_dim, cache.cosines, cache.sines, num_pairs,
                  arguments.style);
    }
    float* key = arguments.key + token * arguments.key_row_stride;
    for (int32_t head = 0; head < arguments.num_kv_heads; ++head) {
      rotate_head(key + int64_t{head} * arguments.head_dim, cache.cosines, cache.sines, num_pairs,
                  arguments.style);
    }
  }
}

void rope(device::HostStream& stream, const RopeArguments& arguments) {
  FOLIO_CHECK(arguments.num_tokens >= 0 && arguments.num_heads > 0 && arguments.num_kv_heads > 0 &&
                  arguments.head_dim > 0,
              "rope shape: {} tokens, {} heads, {} kv heads, head_dim {}", arguments.num_tokens,
              arguments.num_heads, arguments.num_kv_heads, arguments.head_dim);
  FOLIO_CHECK(arguments.rotary_dim > 0 && arguments.rotary_dim % 2 == 0 &&
                  arguments.rotary_dim <= arguments.head_dim &&
                  arguments.rotary_dim <= kRopeMaxRotaryDim,
              "rope: rotary_dim {} must be even, positive and at most head_dim {} and {}",
              arguments.rotary_dim, arguments.head_dim, kRopeMaxRotaryDim);
  FOLIO_CHECK(arguments.theta_base > 0.0f, "rope: theta_base {}", arguments.theta_base);
  FOLIO_CHECK(arguments.query_row_stride >= int64_t{arguments.num_heads} * arguments.head_dim &&
                  arguments.key_row_stride >= int64_t{arguments.num_kv_heads} * arguments.head_dim,
              "rope: row strides ({}, {}) shorter than the heads", arguments.query_row_stride,
              arguments.key_row_stride);
  const int64_t elements_per_token =
      int64_t{arguments.num_heads + arguments.num_kv_heads} * arguments.rotary_dim;
  stream.launch(device::HostKernel::make<RopeArguments, &rope_body>(
      "rope", arguments, arguments.num_tokens, grain_for(4 * elements_per_token)));
}

void llama3_frequency_factors(const Llama3RopeScaling& scaling, float theta_base,
                              int32_t rotary_dim, float* factors) {
  FOLIO_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "rotary_dim {}", rotary_dim);
  FOLIO_CHECK(scaling.high_frequency_factor > scaling.low_frequency_factor,
              "llama3 rope scaling: high_frequency_factor {} <= low_frequency_factor {}",
              scaling.high_frequency_factor, scaling.low_frequency_factor);
  const double context = scaling.original_context_length;
  const double low_frequency_wavelength = context / scaling.low_frequency_factor;
  const double high_frequency_wavelength = context / scaling.high_frequency_factor;
  for (int32_t i = 0; i < rotary_dim / 2; ++i) {
    const double frequency = std::pow(static_cast<double>(theta_base), -2.0 * i / rotary_dim);
    const double wavelength = 2.0 * std::numbers::pi / frequency;
    double factor;
    if (wavelength < high_frequency_wavelength) {
      factor = 1.0;
    } else if (wavelength > low_frequency_wavelength) {
      factor = scaling.factor;
    } else {
      const double smooth = (context / wavelength - scaling.low_frequency_factor) /
                            (scaling.high_frequency_factor - scaling.low_frequency_factor);
      factor = 1.0 / ((1.0 - smooth) / scaling.factor + smooth);
    }
    factors[i] = static_cast<float>(factor);
  }
}

namespace {

// The dimension (of rotary_dim) whose wavelength fits `rotations` turns in `context` positions.
double yarn_correction_dimension(int32_t rotary_dim, double context, double rotations,
                                 double theta_base) {
  return rotary_dim * std::log(context / (rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(theta_base));
}

}  // namespace

void yarn_frequency_factors(const YarnRopeScaling& scaling, float theta_base, int32_t rotary_dim,
                            float* factors) {
  FOLIO_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "rotary_dim {}", rotary_dim);
  FOLIO_CHECK(
      scaling.factor > 0.0f && scaling.beta_slow > 0.0f && scaling.beta_fast > scaling.beta_slow,
      "yarn rope scaling: factor {}, beta_fast {}, beta_slow {}", scaling.factor, scaling.beta_fast,
      scaling.beta_slow);
  const double context = scaling.original_context_length;
  // ggml rounds the fast corner down and the slow one up, and clamps both to the dimensions.
  const double low = std::max(0.0, std::floor(yarn_correction_dimension(
                                       rotary_dim, context, scaling.beta_fast, theta_base)));
  const double high = std::min(
      static_cast<double>(rotary_dim - 1),
      std::ceil(yarn_correction_dimension(rotary_dim, context, scaling.beta_slow, theta_base)));
  const double frequency_scale = 1.0 / scaling.factor;
  for (int32_t i = 0; i < rotary_dim / 2; ++i) {
    // ggml's ramp at dimension 2i: 1 below `low`, 0 above `high`, linear between.
    const double y = (i - low) / std::max(0.001, high - low);
    const double ramp = 1.0 - std::min(1.0, std::max(0.0, y));
    const double mix = ramp * scaling.extrapolation_factor;
    factors[i] = static_cast<float>(1.0 / (frequency_scale * (1.0 - mix) + mix));
  }
}

float yarn_magnitude_scale(const YarnRopeScaling& scaling) {
  if (scaling.extrapolation_factor == 0.0f) return scaling.attention_factor;
  return static_cast<float>(scaling.attention_factor *
                            (1.0 + 0.1 * std::log(static_cast<double>(scaling.factor))));
}

}  // namespace folio::kernels::cpu
