// The scale searches of ggml's reference quantizers, shared by quantize_blocks.cc: for one
// sub-block of values, candidate scales are tried and the one whose integer levels fit best (a
// weighted squared or absolute error) is kept. Each follows its ggml function operation for
// operation (named below), so the levels and scales, and hence the stored bytes, are ggml's.
// Internal to tensor/: the public interface is quantize.h.
//
// Terms: a *level* is a value's integer code before packing; `round_to_nearest` is ggml's
// nearest_int (round half to even through the float adder), defined for every float, so no
// float-to-int conversion here can be undefined.
#pragma once

#include <cstdint>

namespace folio::block_search {

// Below this magnitude a sub-block is treated as all zeros (ggml's GROUP_MAX_EPS).
inline constexpr float kGroupMaxEpsilon = 1e-15f;

int round_to_nearest(float value);

// The value of largest magnitude with its sign (the first on ties).
float signed_extreme(const float* values, int count);

// ggml's make_qx_quants with weights x^2 (rmse_type 1, no importance matrix), for q6_K:
// symmetric levels in [-max_level, max_level - 1], stored + max_level. Tries scales
// -(max_level + 0.1 k) / extreme for k in [-9, 9] and keeps the least weighted squared error;
// returns the scale (0 for an all-zero sub-block).
float search_symmetric_scale(int count, int max_level, const float* values, int8_t* levels);

// ggml's make_q3_quants with the iterative refinement (do_rmse), for q3_K: levels in
// [-max_level, max_level - 1] (stored + max_level) from -max_level / extreme, then up to five
// passes moving single levels while that improves the x^2-weighted fit. Returns the scale.
float refine_symmetric_scale(int count, int max_level, const float* values, int8_t* levels);

// The candidate scales of the affine search: inverse scale (first_offset + step * k +
// max_level) / (max - min) for k in [0, steps]. `absolute_error`: weigh |error| (q2_K) rather
// than error^2.
struct AffineSearch {
  int max_level = 15;
  float first_offset = -1.0f;
  float step = 0.1f;
  int steps = 20;
  bool absolute_error = false;
};

// ggml's make_qkx2_quants: levels in [0, max_level] with value = scale * level - minimum,
// minimum >= 0. Starts from the range's own scale, then solves the weighted least-squares
// scale and minimum for each candidate's levels and keeps the lowest error. Returns the scale
// and sets `minimum`.
float search_affine_scale(int count, const AffineSearch& search, const float* values,
                          const float* weights, uint8_t* levels, float& minimum,
                          uint8_t* candidate_levels);

// The index of the grid value nearest to x (ties to the larger); the grid is sorted, so x picks
// value j once 2x reaches grid[j - 1] + grid[j], compared exactly (ggml's best_index_int8).
int nearest_grid_index(float x);

// The best scale of one 32-value block on the iq4 grid (weights x^2): starts from extreme /
// 127, then tries inverse scales (k - 127) / extreme for k in [-7, 7] and keeps the least
// weighted squared error. 0 for an all-zero block.
float search_grid_scale(const float* values);

}  // namespace folio::block_search
