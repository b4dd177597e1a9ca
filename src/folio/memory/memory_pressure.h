// Memory pressure levels (seed 002 §11.3): how close the one memory budget is to full, as one of
// four levels that the layers above react to with escalating actions (engine/
// memory_pressure_handler.h says which):
//
//   normal         nothing to do
//   warning        evict cold content (unused adapters, CACHED prefix blocks), stop prefetching
//   critical       stop admitting new requests, shrink the prefill chunk, preempt the cheaper way
//   out of memory  preempt running sequences
//
// A level is entered when utilization (the fraction of the budget held, in [0, 1]) reaches its
// `enter` threshold and left only when utilization falls below its `exit` threshold, which is
// lower: hysteresis, so a utilization hovering around one threshold does not flip the level at
// every observation. Escalation may skip levels (normal -> critical in one observation); so may
// de-escalation (critical -> normal when utilization falls below both exits). A failed
// allocation is out of memory whatever the utilization says.
//
// Thread-safety: PressureTracker is a value owned by one thread (the engine's).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "folio/base/status.h"

namespace folio::memory {

enum class PressureLevel : uint8_t { kNormal, kWarning, kCritical, kOutOfMemory };
inline constexpr int kNumPressureLevels = 4;
inline constexpr std::array<PressureLevel, kNumPressureLevels> kAllPressureLevels = {
    PressureLevel::kNormal, PressureLevel::kWarning, PressureLevel::kCritical,
    PressureLevel::kOutOfMemory};

// "normal", "warning", "critical", "out_of_memory": also the `level` label of the metrics.
std::string_view pressure_level_name(PressureLevel level);

// One level's two thresholds, fractions of the budget. Requires exit < enter.
struct PressureBand {
  double enter = 1.0;
  double exit = 1.0;
};

// The seed's levels: warning at 80%, critical at 95%, out of memory at (nearly) 100%, each left
// five points (two for out of memory) lower.
struct PressureThresholds {
  PressureBand warning{0.80, 0.75};
  PressureBand critical{0.95, 0.90};
  PressureBand out_of_memory{0.99, 0.97};

  // kInvalidArgument naming the band unless 0 < exit < enter <= 1 for each band and both the
  // enters and the exits rise from warning to out of memory.
  Status validate() const;
  // Requires: level != kNormal.
  const PressureBand& band(PressureLevel level) const;
};

class PressureTracker {
 public:
  // Requires: thresholds.validate().ok().
  explicit PressureTracker(const PressureThresholds& thresholds);

  // Takes one observation and returns the level after it. `allocation_failed`: an allocation
  // could not be met since the last observation (out of memory at once).
  PressureLevel observe(double utilization, bool allocation_failed = false);

  PressureLevel level() const { return level_; }
  // Times each level was entered (a jump from normal to critical enters critical only).
  int64_t times_entered(PressureLevel level) const { return entered_[static_cast<size_t>(level)]; }
  const PressureThresholds& thresholds() const { return thresholds_; }

 private:
  PressureThresholds thresholds_;
  PressureLevel level_ = PressureLevel::kNormal;
  std::array<int64_t, kNumPressureLevels> entered_{};
};

}  // namespace folio::memory
