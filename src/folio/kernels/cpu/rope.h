// Rotary position embedding (RoPE): each query and key head is cut into pairs of values, and
// pair i of a token at position p is rotated by the angle
//   p * position_scale * theta_base^(-2i / rotary_dim) / frequency_factors[i].
// Which values form a pair depends on the model family:
//   kNormal: (2i, 2i + 1), adjacent values. llama.cpp's "normal" RoPE, used for Llama and
//            Mistral GGUF files (the converter permutes the Q/K weights to this order).
//   kNeox:   (i, i + rotary_dim / 2), the two halves. GPT-NeoX style, used by Qwen2.
// theta_base is the model's rope.freq_base; position_scale is 1 / rope.scaling.factor for linear
// scaling (positions are divided by the factor); frequency_factors, when given, divide each
// pair's frequency (GGUF's rope_freqs tensor; llama3_frequency_factors() builds it from
// Llama 3.1's rope_scaling parameters; yarn_frequency_factors() YaRN's). The rotated pair is
// multiplied by magnitude_scale (1 but for YaRN, yarn_magnitude_scale()). Values past
// rotary_dim in a head are left unchanged.
//
// Angles, cosines and sines are computed in double for each token on the fly, so the rotation
// is accurate to f32 rounding even at positions in the millions (an f32 angle would be off by
// ~position * 2^-24 radians) and no table has to be built or sized for a maximum position.
// Positions are read through a pointer at run time. One work item is one token (all its heads).
#pragma once

#include <cstdint>

#include "folio/device/host_stream.h"
#include "folio/kernels/rope_style.h"

namespace folio::kernels::cpu {

inline constexpr int32_t kRopeMaxRotaryDim = 1024;

struct RopeArguments {
  // f32 [num_tokens, query_row_stride]; head h is [h * head_dim, (h + 1) * head_dim) of a row.
  // Rotated in place.
  float* query;
  // f32 [num_tokens, key_row_stride]; num_kv_heads heads laid out like the query's.
  float* key;
  int64_t query_row_stride = 0;
  int64_t key_row_stride = 0;
  const int32_t* positions;  // i32 [num_tokens], >= 0
  // f32 [rotary_dim / 2], or nullptr for no per-pair factor.
  const float* frequency_factors = nullptr;
  int64_t num_tokens = 0;  // the step's padded token count
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t rotary_dim = 0;  // usually head_dim
  kernels::RopeStyle style = kernels::RopeStyle::kNormal;
  float theta_base = 10000.0f;
  float position_scale = 1.0f;
  float magnitude_scale = 1.0f;  // multiplies cosines and sines (YaRN's mscale)
};

void rope_body(const RopeArguments& arguments, int64_t begin, int64_t end, int thread_index);

// Requires: 0 < rotary_dim <= head_dim, rotary_dim even and <= kRopeMaxRotaryDim, theta_base > 0,
// positive head counts, row strides >= heads * head_dim.
void rope(device::HostStream& stream, const RopeArguments& arguments);

// Llama 3.1's rope_scaling ("rope_type": "llama3"): long wavelengths are stretched by `factor`,
// short ones kept, those in between interpolated.
struct Llama3RopeScaling {
  float factor = 8.0f;
  float low_frequency_factor = 1.0f;
  float high_frequency_factor = 4.0f;
  int32_t original_context_length = 8192;
};

// Writes the per-pair frequency divisors that make rope() apply Llama 3.1 scaling (the values
// llama.cpp's converter stores as rope_freqs). factors: f32 [rotary_dim / 2].
// Requires: rotary_dim even and > 0, high_frequency_factor > low_frequency_factor.
void llama3_frequency_factors(const Llama3RopeScaling& scaling, float theta_base,
                              int32_t rotary_dim, float* factors);

// YaRN ("rope_type": "yarn") as ggml's rope computes it, with freq_scale = 1 / factor: pair i's
// angle is theta_i * (freq_scale * (1 - r_i) + r_i), r_i = ramp_i * extrapolation_factor, where
// ramp_i falls from 1 to 0 across the pairs between the correction dimensions of beta_fast and
// beta_slow (the dimensions whose wavelengths fit beta_fast and beta_slow rotations in
// original_context_length): high frequencies keep their angle, low ones are interpolated.
struct YarnRopeScaling {
  float factor = 1.0f;
  float extrapolation_factor = 1.0f;
  float attention_factor = 1.0f;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int32_t original_context_length = 4096;
};

// Writes the per-pair frequency divisors 1 / (freq_scale * (1 - r_i) + r_i). factors: f32
// [rotary_dim / 2]. Requires: rotary_dim even and > 0, factor > 0, beta_fast > beta_slow > 0.
void yarn_frequency_factors(const YarnRopeScaling& scaling, float theta_base, int32_t rotary_dim,
                            float* factors);
// ggml's mscale: attention_factor * (1 + 0.1 ln factor) when extrapolation_factor != 0,
// attention_factor otherwise.
float yarn_magnitude_scale(const YarnRopeScaling& scaling);

}  // namespace folio::kernels::cpu
