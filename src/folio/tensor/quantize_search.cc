#include "folio/tensor/quantize_search.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "folio/tensor/quant_blocks.h"

namespace folio::block_search {

// Adding 1.5 * 2^23 puts the integer part in the low mantissa bits, rounded half to even by the
// adder; exact for |value| < 2^22.
int round_to_nearest(float value) {
  const float shifted = value + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof(bits));
  return (bits & 0x007fffff) - 0x00400000;
}

// The value of largest magnitude with its sign (the first on ties).
float signed_extreme(const float* values, int count) {
  float max_magnitude = 0.0f;
  float extreme = 0.0f;
  for (int i = 0; i < count; ++i) {
    if (std::fabs(values[i]) > max_magnitude) {
      max_magnitude = std::fabs(values[i]);
      extreme = values[i];
    }
  }
  return extreme;
}

// ggml's make_qx_quants with weights x^2 (rmse_type 1, no importance matrix), for q6_K:
// symmetric levels in [-max_level, max_level - 1], stored + max_level. Tries scales
// -(max_level + 0.1 k) / extreme for k in [-9, 9] and keeps the least weighted squared error;
// returns the scale (0 for an all-zero sub-block).
float search_symmetric_scale(int count, int max_level, const float* values, int8_t* levels) {
  const float extreme = signed_extreme(values, count);
  if (std::fabs(extreme) < kGroupMaxEpsilon) {
    std::fill(levels, levels + count, 0);
    return 0.0f;
  }
  auto level_at = [&](float inverse_scale, int i) {
    return std::clamp(round_to_nearest(inverse_scale * values[i]), -max_level, max_level - 1);
  };
  float inverse_scale = static_cast<float>(-max_level) / extreme;
  float sum_value_level = 0.0f;
  float sum_level_squared = 0.0f;
  for (int i = 0; i < count; ++i) {
    const int level = level_at(inverse_scale, i);
    levels[i] = static_cast<int8_t>(level + max_level);
    const float weight = values[i] * values[i];
    sum_value_level += weight * values[i] * static_cast<float>(level);
    sum_level_squared += weight * static_cast<float>(level) * static_cast<float>(level);
  }
  float scale = sum_level_squared != 0.0f ? sum_value_level / sum_level_squared : 0.0f;
  float best = scale * sum_value_level;
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    inverse_scale = -(static_cast<float>(max_level) + 0.1f * static_cast<float>(step)) / extreme;
    sum_value_level = 0.0f;
    sum_level_squared = 0.0f;
    for (int i = 0; i < count; ++i) {
      const int level = level_at(inverse_scale, i);
      const float weight = values[i] * values[i];
      sum_value_level += weight * values[i] * static_cast<float>(level);
      sum_level_squared += weight * static_cast<float>(level) * static_cast<float>(level);
    }
    // Maximizing sum_value_level^2 / sum_level_squared minimizes the error at the best scale.
    if (sum_level_squared > 0.0f && sum_value_level * sum_value_level > best * sum_level_squared) {
      for (int i = 0; i < count; ++i) {
        levels[i] = static_cast<int8_t>(level_at(inverse_scale, i) + max_level);
      }
      scale = sum_value_level / sum_level_squared;
      best = scale * sum_value_level;
    }
  }
  return scale;
}

// ggml's make_q3_quants with the iterative refinement (do_rmse), for q3_K: levels in
// [-max_level, max_level - 1] (stored + max_level) from -max_level / extreme, then up to five
// passes moving single levels while that improves the x^2-weighted fit. Returns the scale.
float refine_symmetric_scale(int count, int max_level, const float* values, int8_t* levels) {
  const float extreme = signed_extreme(values, count);
  if (std::fabs(extreme) < kGroupMaxEpsilon) {
    std::fill(levels, levels + count, 0);
    return 0.0f;
  }
  const float inverse_scale = static_cast<float>(-max_level) / extreme;
  float sum_value_level = 0.0f;
  float sum_level_squared = 0.0f;
  for (int i = 0; i < count; ++i) {
    const int level =
        std::clamp(round_to_nearest(inverse_scale * values[i]), -max_level, max_level - 1);
    levels[i] = static_cast<int8_t>(level);
    const float weight = values[i] * values[i];
    sum_value_level += weight * values[i] * static_cast<float>(level);
    sum_level_squared += weight * static_cast<float>(level) * static_cast<float>(level);
  }
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < count; ++i) {
      const float weight = values[i] * values[i];
      const float old_level = static_cast<float>(levels[i]);
      float other_value_level = sum_value_level - weight * values[i] * old_level;
      if (!(other_value_level > 0.0f)) continue;
      float other_level_squared = sum_level_squared - weight * old_level * old_level;
      const int new_level =
          std::clamp(round_to_nearest(values[i] * other_level_squared / other_value_level),
                     -max_level, max_level - 1);
      if (new_level == levels[i]) continue;
      other_value_level += weight * values[i] * static_cast<float>(new_level);
      other_level_squared += weight * static_cast<float>(new_level) * static_cast<float>(new_level);
      if (other_level_squared > 0.0f &&
          other_value_level * other_value_level * sum_level_squared >
              sum_value_level * sum_value_level * other_level_squared) {
        levels[i] = static_cast<int8_t>(new_level);
        sum_value_level = other_value_level;
        sum_level_squared = other_level_squared;
        ++changed;
      }
    }
    if (changed == 0) break;
  }
  for (int i = 0; i < count; ++i) levels[i] = static_cast<int8_t>(levels[i] + max_level);
  return sum_level_squared > 0.0f ? sum_value_level / sum_level_squared : 0.0f;
}

// ggml's make_qkx2_quants: levels in [0, max_level] with value = scale * level - minimum,
// minimum >= 0. Starts from the range's own scale, then solves the weighted least-squares
// scale and minimum for each candidate's levels and keeps the lowest error. Returns the scale
// and sets `minimum`.
float search_affine_scale(int count, const AffineSearch& search, const float* values,
                          const float* weights, uint8_t* levels, float& minimum,
                          uint8_t* candidate_levels) {
  float low = values[0];
  float high = values[0];
  float sum_weights = weights[0];
  float sum_weighted_values = sum_weights * values[0];
  for (int i = 1; i < count; ++i) {
    low = std::min(low, values[i]);
    high = std::max(high, values[i]);
    sum_weights += weights[i];
    sum_weighted_values += weights[i] * values[i];
  }
  if (low > 0.0f) low = 0.0f;
  if (high == low) {
    std::fill(levels, levels + count, 0);
    minimum = -low;
    return 0.0f;
  }
  const float max_level = static_cast<float>(search.max_level);
  auto error_of = [&](float difference) {
    return search.absolute_error ? std::fabs(difference) : difference * difference;
  };
  float inverse_scale = max_level / (high - low);
  float scale = 1.0f / inverse_scale;
  float best_error = 0.0f;
  for (int i = 0; i < count; ++i) {
    levels[i] = static_cast<uint8_t>(
        std::clamp(round_to_nearest(inverse_scale * (values[i] - low)), 0, search.max_level));
    const float difference = scale * static_cast<float>(levels[i]) + low - values[i];
    best_error += weights[i] * error_of(difference);
  }
  for (int k = 0; k <= search.steps; ++k) {
    inverse_scale =
        (search.first_offset + search.step * static_cast<float>(k) + max_level) / (high - low);
    float sum_levels = 0.0f;
    float sum_levels_squared = 0.0f;
    float sum_levels_values = 0.0f;
    for (int i = 0; i < count; ++i) {
      const int level =
          std::clamp(round_to_nearest(inverse_scale * (values[i] - low)), 0, search.max_level);
      candidate_levels[i] = static_cast<uint8_t>(level);
      const float weight = weights[i];
      sum_levels += weight * static_cast<float>(level);
      sum_levels_squared += weight * static_cast<float>(level) * static_cast<float>(level);
      sum_levels_values += weight * static_cast<float>(level) * values[i];
    }
    const float determinant = sum_weights * sum_levels_squared - sum_levels * sum_levels;
    if (!(determinant > 0.0f)) continue;
    float this_scale =
        (sum_weights * sum_levels_values - sum_weighted_values * sum_levels) / determinant;
    float this_low =
        (sum_levels_squared * sum_weighted_values - sum_levels * sum_levels_values) / determinant;
    if (this_low > 0.0f) {
      this_low = 0.0f;
      this_scale = sum_levels_values / sum_levels_squared;
    }
    float error = 0.0f;
    for (int i = 0; i < count; ++i) {
      const float difference =
          this_scale * static_cast<float>(candidate_levels[i]) + this_low - values[i];
      error += weights[i] * error_of(difference);
    }
    if (error < best_error) {
      std::copy(candidate_levels, candidate_levels + count, levels);
      best_error = error;
      scale = this_scale;
      low = this_low;
    }
  }
  minimum = -low;
  return scale;
}

// The index of the grid value nearest to x (ties to the larger); the grid is sorted, so x picks
// value j once 2x reaches grid[j - 1] + grid[j], compared exactly (ggml's best_index_int8).
int nearest_grid_index(float x) {
  const float twice = x + x;
  int index = 0;
  for (int step = 8; step > 0; step >>= 1) {
    const int candidate = index + step;
    const int midpoint_sum = kIq4NonLinearValues[candidate - 1] + kIq4NonLinearValues[candidate];
    if (twice >= static_cast<float>(midpoint_sum)) index = candidate;
  }
  return index;
}

// The best scale of one 32-value block on the iq4 grid (weights x^2): starts from extreme /
// 127, then tries inverse scales (k - 127) / extreme for k in [-7, 7] and keeps the least
// weighted squared error. 0 for an all-zero block.
float search_grid_scale(const float* values) {
  float weights[32];
  for (int j = 0; j < 32; ++j) weights[j] = values[j] * values[j];
  const float extreme = signed_extreme(values, 32);
  if (std::fabs(extreme) < kGroupMaxEpsilon) return 0.0f;
  const float first_value = static_cast<float>(kIq4NonLinearValues[0]);
  auto fit = [&](float inverse_scale, float& sum_value_grid, float& sum_grid_squared) {
    sum_value_grid = 0.0f;
    sum_grid_squared = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float grid =
          static_cast<float>(kIq4NonLinearValues[nearest_grid_index(inverse_scale * values[j])]);
      sum_value_grid += weights[j] * grid * values[j];
      sum_grid_squared += weights[j] * grid * grid;
    }
  };
  float sum_value_grid = 0.0f;
  float sum_grid_squared = 0.0f;
  fit(1.0f / (-extreme / first_value), sum_value_grid, sum_grid_squared);
  float scale = sum_grid_squared > 0.0f ? sum_value_grid / sum_grid_squared : 0.0f;
  float best = scale * sum_value_grid;
  for (int k = -7; k <= 7; ++k) {
    fit(static_cast<float>(k + kIq4NonLinearValues[0]) / extreme, sum_value_grid, sum_grid_squared);
    if (sum_grid_squared > 0.0f && sum_value_grid * sum_value_grid > best * sum_grid_squared) {
      scale = sum_value_grid / sum_grid_squared;
      best = scale * sum_value_grid;
    }
  }
  return scale;
}

}  // namespace folio::block_search
