// VectorOps: the vectorized inner loops the CPU norm, activation, softmax and attention kernels
// are built from, in one table per instruction-set path.
//
// A path is a set of x86 extensions the loops are compiled for: AVX-512 (avx512f), AVX2 (avx2 +
// fma + f16c), or portable C++ (8-float arrays, no extension). Each path's loops are compiled in
// their own translation unit under `#pragma GCC target`, so the rest of the build needs no -m flags
// and one binary runs on any x86-64. At start-up the best path the CPU (and the OS) supports is
// chosen; tests force each supported path through set_simd_path_for_testing().
//
// Numerics: within one path every function is a fixed sequence of operations for given sizes,
// so a result never depends on which thread ran it. Different paths round differently (lane
// count changes the summation order, AVX paths use a polynomial exp), so results are compared
// across paths only with tolerances. f32 -> f16 conversion rounds to nearest even on every path
// and is bit-identical to folio::f32_to_f16.
//
// Thread-safety: the table functions are pure. The active path is process-wide: set it only
// while no kernel is running (tests do it between launches). Kernel launches record the table
// active when they are made (vector_launch.h), so a captured graph keeps its path.
#pragma once

#include <cstdint>
#include <string_view>

namespace folio::kernels::cpu {

enum class SimdPath { kPortable, kAvx2, kAvx512 };

std::string_view simd_path_name(SimdPath path);

// Whether this CPU and OS can run `path`.
bool simd_path_supported(SimdPath path);
// The fastest supported path.
SimdPath best_simd_path();

// f16 values travel as their IEEE binary16 bit patterns (uint16_t).
struct VectorOps {
  SimdPath path;

  // sum_i a[i] * b[i].
  float (*dot)(const float* a, const float* b, int64_t n);
  // sum_i x[i]^2.
  float (*sum_squares)(const float* x, int64_t n);
  // The largest value of x[0, n), ignoring NaN; -infinity when n == 0 or all are NaN.
  float (*maximum)(const float* x, int64_t n);

  // out[i] = x[i] * scale * weight[i]. out may equal x.
  void (*multiply_scaled)(float* out, const float* x, const float* weight, float scale, int64_t n);
  // out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). out may equal gate or up.
  void (*silu_multiply)(float* out, const float* gate, const float* up, int64_t n);
  // out[i] = a[i] + b[i]. out may equal a or b.
  void (*add)(float* out, const float* a, const float* b, int64_t n);
  // x[i] *= factor.
  void (*scale)(float* x, float factor, int64_t n);
  // out[i] = exp(x[i] * multiplier - shift); returns the sum of the out[i]. out may equal x.
  float (*exp_shifted_sum)(float* out, const float* x, float multiplier, float shift, int64_t n);

  // Attention tiles: several query heads against the same key (or value) rows, so a group of
  // GQA heads reads each K/V row once. Queries are rows of head_dim f32, `query_stride` apart;
  // keys and values are rows of head_dim elements (f32 or f16 bits), `key_stride` apart.
  //
  // scores[h * score_stride + t] = scale * dot(query h, key t), for h < num_queries and
  // t < num_keys. Each score equals scale * dot(query h, key t) exactly, however the queries
  // and keys are grouped.
  void (*key_scores_f32)(float* scores, int64_t score_stride, const float* queries,
                         int64_t query_stride, int64_t num_queries, const float* keys,
                         int64_t key_stride, int64_t num_keys, int64_t head_dim, float scale);
  void (*key_scores_f16)(float* scores, int64_t score_stride, const float* queries,
                         int64_t query_stride, int64_t num_queries, const uint16_t* keys,
                         int64_t key_stride, int64_t num_keys, int64_t head_dim, float scale);
  // accumulators[h * accumulator_stride + d] += sum over t, in order, of
  // weights[h * weight_stride + t] * values[t * value_stride + d]; each element is one chain of
  // fused multiply-adds, so the result does not depend on how queries are grouped.
  void (*accumulate_values_f32)(float* accumulators, int64_t accumulator_stride,
                                const float* weights, int64_t weight_stride, int64_t num_queries,
                                const float* values, int64_t value_stride, int64_t num_values,
                                int64_t head_dim);
  void (*accumulate_values_f16)(float* accumulators, int64_t accumulator_stride,
                                const float* weights, int64_t weight_stride, int64_t num_queries,
                                const uint16_t* values, int64_t value_stride, int64_t num_values,
                                int64_t head_dim);

  // out[i] = f16(in[i]), round to nearest even.
  void (*f32_to_f16)(uint16_t* out, const float* in, int64_t n);
};

// The table of the active path (best_simd_path() unless a test forced another).
const VectorOps& vector_ops();
SimdPath active_simd_path();

// The table of a given path. Requires: simd_path_supported(path).
const VectorOps& vector_ops_for(SimdPath path);

// Test hook: makes `path` the active one. Requires: simd_path_supported(path), no kernel running.
void set_simd_path_for_testing(SimdPath path);

namespace detail {
// One per path, each defined in its own translation unit (vector_ops_<path>.cc).
const VectorOps& portable_vector_ops();
const VectorOps& avx2_vector_ops();
const VectorOps& avx512_vector_ops();
}  // namespace detail

}  // namespace folio::kernels::cpu
