#include "folio/engine/phase_budget_tuner.h"

#include <algorithm>
#include <cmath>

namespace folio::engine {

namespace {

// How far `value` is over `target` on a log2 scale, clamped to [0, 1]: 0 at or under the target,
// 1 at twice the target or more.
double over_target(double value, double target) {
  if (value <= target) return 0.0;
  return std::clamp(std::log2(value / target), 0.0, 1.0);
}

double fraction(int32_t part, int32_t whole) {
  return whole == 0 ? 0.0 : static_cast<double>(part) / static_cast<double>(whole);
}

}  // namespace

Status PhaseBudgetTunerOptions::validate() const {
  if (window_steps < 1) {
    return invalid_argument("phase tuner window_steps must be at least 1, got {}", window_steps);
  }
  if (!(learning_rate > 0.0 && learning_rate <= 1.0)) {
    return invalid_argument("phase tuner learning_rate must be in (0, 1], got {}", learning_rate);
  }
  if (!(min_prefill_token_share > 0.0 && min_prefill_token_share <= max_prefill_token_share &&
        max_prefill_token_share <= 1.0)) {
    return invalid_argument(
        "phase tuner prefill token share bounds must satisfy 0 < min <= max <= 1, got [{}, {}]",
        min_prefill_token_share, max_prefill_token_share);
  }
  if (!(min_decode_kv_share >= 0.0 && min_decode_kv_share <= max_decode_kv_share &&
        max_decode_kv_share < 1.0)) {
    return invalid_argument(
        "phase tuner decode KV share bounds must satisfy 0 <= min <= max < 1, got [{}, {}]",
        min_decode_kv_share, max_decode_kv_share);
  }
  if (!(smoothing > 0.0 && smoothing <= 1.0)) {
    return invalid_argument("phase tuner smoothing must be in (0, 1], got {}", smoothing);
  }
  if (!(dead_band >= 0.0 && dead_band < 1.0 && reversal_band >= dead_band && reversal_band < 1.0)) {
    return invalid_argument(
        "phase tuner bands must satisfy 0 <= dead_band <= reversal_band < 1, got {} and {}",
        dead_band, reversal_band);
  }
  if (ttft_target <= Duration::zero() || tpot_target <= Duration::zero()) {
    return invalid_argument("phase tuner TTFT and TPOT targets must be positive");
  }
  return Status();
}

Result<PhaseBudgetTuner> PhaseBudgetTuner::create(const PhaseBudgetTunerOptions& options,
                                                  const PhaseSplit& initial) {
  FOLIO_RETURN_IF_ERROR(options.validate());
  FOLIO_RETURN_IF_ERROR(initial.validate());
  if (options.enabled && (initial.prefill_token_share < options.min_prefill_token_share ||
                          initial.prefill_token_share > options.max_prefill_token_share ||
                          initial.decode_kv_share < options.min_decode_kv_share ||
                          initial.decode_kv_share > options.max_decode_kv_share)) {
    return invalid_argument(
        "the initial phase split (prefill token share {}, decode KV share {}) is outside the "
        "tuner's bounds ([{}, {}] and [{}, {}]); move it or widen the bounds",
        initial.prefill_token_share, initial.decode_kv_share, options.min_prefill_token_share,
        options.max_prefill_token_share, options.min_decode_kv_share, options.max_decode_kv_share);
  }
  return PhaseBudgetTuner(options, initial);
}

bool PhaseBudgetTuner::observe(const PhaseObservation& observation) {
  if (!options_.enabled) return false;
  ++steps_;
  limited_steps_ += observation.prefill_limited_by_split ? 1 : 0;
  wait_seconds_ += to_seconds(observation.oldest_wait);
  if (observation.decode_tokens > 0) {
    ++decode_steps_;
    if (observation.prefill_tokens > 0) {
      // Per step, not on the window's mean: the few slow mixed steps are the ones that break
      // the TPOT of every decode in them.
      slow_mixed_steps_ +=
          over_target(to_seconds(observation.step_time), to_seconds(options_.tpot_target));
    }
  }
  preemptions_ += observation.preemptions;
  held_steps_ += observation.held_by_kv_share > 0 ? 1 : 0;
  kv_utilization_ += observation.kv_utilization;
  if (steps_ < options_.window_steps) return false;
  return end_window();
}

bool PhaseBudgetTuner::end_window() {
  const double mean_wait = wait_seconds_ / steps_;
  const double prefill_need =
      fraction(limited_steps_, steps_) * over_target(mean_wait, to_seconds(options_.ttft_target));
  const double decode_need = decode_steps_ == 0 ? 0.0 : slow_mixed_steps_ / decode_steps_;
  const double token_signal = prefill_need - decode_need;

  // Preemptions with the cache mostly empty come from something the share cannot fix (one
  // sequence larger than what is left, say).
  const bool kv_was_full = kv_utilization_ / steps_ >= 0.5;
  double kv_signal = 0.0;
  if (preemptions_ > 0 && kv_was_full) {
    kv_signal = 1.0;
  } else if (preemptions_ == 0) {
    kv_signal = -fraction(held_steps_, steps_);
  }

  const bool token_moved =
      update(token_, token_signal, split_.prefill_token_share, options_.min_prefill_token_share,
             options_.max_prefill_token_share);
  const bool kv_moved = update(kv_, kv_signal, split_.decode_kv_share, options_.min_decode_kv_share,
                               options_.max_decode_kv_share);
  steps_ = limited_steps_ = decode_steps_ = preemptions_ = held_steps_ = 0;
  wait_seconds_ = slow_mixed_steps_ = kv_utilization_ = 0.0;
  return token_moved || kv_moved;
}

bool PhaseBudgetTuner::update(Controller& controller, double signal, double& share, double low,
                              double high) const {
  controller.average =
      (1.0 - options_.smoothing) * controller.average + options_.smoothing * signal;
  const double magnitude = std::abs(controller.average);
  if (magnitude <= options_.dead_band) return false;
  const int direction = controller.average > 0.0 ? 1 : -1;
  // Hysteresis: undoing the last move takes a stronger signal than continuing it.
  if (controller.last_direction != 0 && direction != controller.last_direction &&
      magnitude <= options_.reversal_band) {
    return false;
  }
  const double moved = std::clamp(share + options_.learning_rate * controller.average, low, high);
  if (moved == share) return false;  // at its bound already
  share = moved;
  controller.last_direction = direction;
  ++controller.moves;
  return true;
}

}  // namespace folio::engine
