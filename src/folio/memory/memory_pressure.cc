#include "folio/memory/memory_pressure.h"

#include "folio/base/check.h"

namespace folio::memory {

std::string_view pressure_level_name(PressureLevel level) {
  switch (level) {
    case PressureLevel::kNormal:
      return "normal";
    case PressureLevel::kWarning:
      return "warning";
    case PressureLevel::kCritical:
      return "critical";
    case PressureLevel::kOutOfMemory:
      return "out_of_memory";
  }
  return "unknown";
}

Status PressureThresholds::validate() const {
  const PressureBand* previous = nullptr;
  PressureLevel previous_level = PressureLevel::kNormal;
  for (PressureLevel level :
       {PressureLevel::kWarning, PressureLevel::kCritical, PressureLevel::kOutOfMemory}) {
    const PressureBand& current = band(level);
    if (!(current.exit > 0.0 && current.exit < current.enter && current.enter <= 1.0)) {
      return invalid_argument(
          "{} pressure thresholds enter {} exit {}: need 0 < exit < enter <= 1 (utilization "
          "fractions of the memory budget)",
          pressure_level_name(level), current.enter, current.exit);
    }
    if (previous != nullptr && (current.enter < previous->enter || current.exit < previous->exit)) {
      return invalid_argument(
          "{} pressure thresholds (enter {}, exit {}) must not be below {}'s (enter {}, exit {})",
          pressure_level_name(level), current.enter, current.exit,
          pressure_level_name(previous_level), previous->enter, previous->exit);
    }
    previous = &current;
    previous_level = level;
  }
  return Status();
}

const PressureBand& PressureThresholds::band(PressureLevel level) const {
  switch (level) {
    case PressureLevel::kNormal:
      break;
    case PressureLevel::kWarning:
      return warning;
    case PressureLevel::kCritical:
      return critical;
    case PressureLevel::kOutOfMemory:
      return out_of_memory;
  }
  FOLIO_CHECK(false, "the normal pressure level has no thresholds");
  return warning;
}

PressureTracker::PressureTracker(const PressureThresholds& thresholds) : thresholds_(thresholds) {
  const Status valid = thresholds.validate();
  FOLIO_CHECK(valid.ok(), "{}", valid.to_string());
}

PressureLevel PressureTracker::observe(double utilization, bool allocation_failed) {
  PressureLevel next = level_;
  // Up: the highest level whose enter threshold is reached.
  PressureLevel reached = PressureLevel::kNormal;
  for (PressureLevel level :
       {PressureLevel::kWarning, PressureLevel::kCritical, PressureLevel::kOutOfMemory}) {
    if (utilization >= thresholds_.band(level).enter) reached = level;
  }
  if (allocation_failed) reached = PressureLevel::kOutOfMemory;
  if (reached > next || allocation_failed) {
    next = reached;
  } else {
    // Down: one level at a time while utilization is below the current level's exit.
    while (next != PressureLevel::kNormal && utilization < thresholds_.band(next).exit) {
      next = static_cast<PressureLevel>(static_cast<uint8_t>(next) - 1);
    }
  }
  if (next != level_) ++entered_[static_cast<size_t>(next)];
  level_ = next;
  return level_;
}

}  // namespace folio::memory
