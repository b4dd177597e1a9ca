// PhaseBudgetTuner: moves the scheduler's phase split (PhaseSplit, scheduler.h) toward what the
// steps ask for (seed 002 §11.4, adaptive budgets). Pure logic: the engine feeds it one
// PhaseObservation per step and applies split() when observe() says it moved.
//
// Two shares, each with its own signal in [-1, 1] computed over a window of window_steps steps:
//   - prefill_token_share. Up when prefill is starved: the fraction of steps whose prefill work
//     was cut by the split's cap, times how far the oldest waiting request's wait is over
//     ttft_target (log2 of wait / target, clamped to [0, 1]: 1 at twice the target). Down when
//     decodes are slowed by the prefill riding along: the mean over decode steps of how far
//     each one that also ran prefill tokens was over tpot_target (same scale; per step, since
//     the few slow steps are what breaks the TPOT of every decode in them). Raising a
//     share the split does not cap changes nothing, so the up signal needs the cap to bind; and
//     lowering it helps only if prefill shares the decodes' steps.
//   - decode_kv_share. Up when running sequences were preempted for KV while the cache was at
//     least half used (the share keeps room for decodes to grow); down by the fraction of steps
//     whose admissions the share held back in windows without preemptions.
// Each window's signal enters an exponential moving average (weight `smoothing`); a share moves
// by learning_rate * average, clamped to its bounds, only when |average| > dead_band, and a
// move against the previous one needs |average| > reversal_band (hysteresis): a steady signal
// walks the share to a bound (or to where the two sides balance) at most learning_rate per
// window, an alternating or noisy one stays inside the bands.
//
// Off (the default) it never moves: the split stays what SchedulerOptions::phase_split says, so
// an engine behaves as without a tuner; and the targets it steers by are deployment choices the
// operator states when turning it on.
//
// Invariants: when enabled, min <= share <= max for both shares at all times; split() is always
// valid (PhaseSplit::validate). Thread-safety: none; the engine thread owns it.
#pragma once

#include <cstdint>

#include "folio/base/result.h"
#include "folio/engine/clock.h"
#include "folio/engine/scheduler.h"

namespace folio::engine {

struct PhaseBudgetTunerOptions {
  bool enabled = false;
  int32_t window_steps = 8;    // steps per signal
  double learning_rate = 0.1;  // the largest move of a share per window
  double min_prefill_token_share = 0.125;
  double max_prefill_token_share = 1.0;
  double min_decode_kv_share = 0.0;
  double max_decode_kv_share = 0.25;
  double smoothing = 0.25;     // weight of a new window's signal in the average, (0, 1]
  double dead_band = 0.1;      // no move while |average| <= this
  double reversal_band = 0.3;  // reversing the last move needs |average| > this (>= dead_band)
  Duration ttft_target = std::chrono::seconds(1);        // longest acceptable queue wait
  Duration tpot_target = std::chrono::milliseconds(50);  // longest acceptable decode step

  // Errors: bounds outside the split's ranges or inverted, non-positive rates or targets.
  Status validate() const;
};

// What one step did, for the tuner.
struct PhaseObservation {
  int32_t prefill_tokens = 0;
  int32_t decode_tokens = 0;  // sequences decoded
  bool prefill_limited_by_split = false;
  int32_t num_waiting = 0;       // WAITING and SWAPPED after the step
  Duration oldest_wait{};        // of those, the longest wait so far (0 when none)
  int32_t preemptions = 0;       // by recompute and by swap
  int32_t held_by_kv_share = 0;  // admissions the KV share held back
  double kv_utilization = 0.0;   // owned KV blocks / blocks sequences may own
  Duration step_time{};          // the step's wall time
};

class PhaseBudgetTuner {
 public:
  // Errors: invalid options; enabled with `initial` outside the bounds or invalid.
  static Result<PhaseBudgetTuner> create(const PhaseBudgetTunerOptions& options,
                                         const PhaseSplit& initial);

  // Records one step; at the end of a window may move the split. Returns whether it moved.
  bool observe(const PhaseObservation& observation);

  const PhaseSplit& split() const { return split_; }
  const PhaseBudgetTunerOptions& options() const { return options_; }
  int64_t num_token_share_moves() const { return token_.moves; }
  int64_t num_kv_share_moves() const { return kv_.moves; }
  // The smoothed signals, in [-1, 1]: positive asks for more prefill tokens / more decode KV.
  double token_signal() const { return token_.average; }
  double kv_signal() const { return kv_.average; }

 private:
  // One share's controller.
  struct Controller {
    double average = 0.0;
    int last_direction = 0;  // -1, 0 (none yet), +1
    int64_t moves = 0;
  };

  PhaseBudgetTuner(const PhaseBudgetTunerOptions& options, const PhaseSplit& initial)
      : options_(options), split_(initial) {}
  // Folds `signal` into the controller and moves `share` within [low, high]; whether it moved.
  bool update(Controller& controller, double signal, double& share, double low, double high) const;
  // Computes the window's signals, moves the shares, starts a new window; whether it moved.
  bool end_window();

  PhaseBudgetTunerOptions options_;
  PhaseSplit split_;
  Controller token_;
  Controller kv_;
  // The current window's sums.
  int32_t steps_ = 0;
  int32_t limited_steps_ = 0;
  double wait_seconds_ = 0.0;
  int32_t decode_steps_ = 0;
  // Over decode steps that also ran prefill tokens: how far each was over the TPOT target.
  double slow_mixed_steps_ = 0.0;
  int32_t preemptions_ = 0;
  int32_t held_steps_ = 0;
  double kv_utilization_ = 0.0;
};

}  // namespace folio::engine
