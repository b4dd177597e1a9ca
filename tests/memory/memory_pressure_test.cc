#include "folio/memory/memory_pressure.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace folio::memory {
namespace {

using L = PressureLevel;

TEST(MemoryPressureTest, ScriptedTraceEscalatesAndFallsBackWithHysteresis) {
  PressureTracker tracker{PressureThresholds{}};
  struct Step {
    double utilization;
    bool failed;
    PressureLevel expected;
  };
  const std::vector<Step> trace = {
      {0.50, false, L::kNormal},       {0.79, false, L::kNormal},
      {0.80, false, L::kWarning},      {0.77, false, L::kWarning},  // above warning's exit
      {0.76, false, L::kWarning},      {0.74, false, L::kNormal},   //
      {0.96, false, L::kCritical},                                  // skips warning
      {0.91, false, L::kCritical},     {0.89, false, L::kWarning},  // below critical's exit
      {0.999, false, L::kOutOfMemory}, {0.98, false, L::kOutOfMemory},
      {0.96, false, L::kCritical},     {0.50, false, L::kNormal},  // falls past every exit
      {0.10, true, L::kOutOfMemory},   {0.10, false, L::kNormal},  // a failed allocation
  };
  for (size_t index = 0; index < trace.size(); ++index) {
    EXPECT_EQ(tracker.observe(trace[index].utilization, trace[index].failed), trace[index].expected)
        << "observation " << index << " utilization " << trace[index].utilization;
  }
  EXPECT_EQ(tracker.times_entered(L::kWarning), 2);
  EXPECT_EQ(tracker.times_entered(L::kCritical), 2);
  EXPECT_EQ(tracker.times_entered(L::kOutOfMemory), 2);
  EXPECT_EQ(tracker.times_entered(L::kNormal), 3);
}

// Noise around a threshold narrower than its band never flips the level back and forth.
TEST(MemoryPressureTest, NoiseInsideTheBandDoesNotOscillate) {
  const PressureThresholds thresholds;
  for (const double centre : {0.80, 0.95, 0.99}) {
    PressureTracker tracker{thresholds};
    std::mt19937_64 random(static_cast<uint64_t>(centre * 1000));
    std::uniform_real_distribution<double> noise(-0.0099, 0.0099);
    int changes = 0;
    PressureLevel last = tracker.level();
    for (int index = 0; index < 10'000; ++index) {
      const PressureLevel level = tracker.observe(centre + noise(random));
      if (level != last) ++changes;
      last = level;
    }
    // Up once at the first observation over the enter threshold, never down again.
    EXPECT_LE(changes, 1) << "utilization around " << centre;
  }
}

// Under a random walk, every observation's level is one the thresholds allow: at or above the
// level's exit, below the next level's enter (unless still held by hysteresis), and the level
// changes only when utilization crossed a threshold.
TEST(MemoryPressureTest, RandomWalkLevelsAgreeWithThresholds) {
  const PressureThresholds thresholds;
  PressureTracker tracker{thresholds};
  std::mt19937_64 random(7);
  std::normal_distribution<double> step(0.0, 0.02);
  double utilization = 0.5;
  PressureLevel previous = L::kNormal;
  for (int index = 0; index < 20'000; ++index) {
    utilization = std::clamp(utilization + step(random), 0.0, 1.0);
    const PressureLevel level = tracker.observe(utilization);
    if (level != L::kNormal) {
      EXPECT_GE(utilization, thresholds.band(level).exit);
    }
    if (level != L::kOutOfMemory) {
      const auto above = static_cast<PressureLevel>(static_cast<uint8_t>(level) + 1);
      EXPECT_LT(utilization, thresholds.band(above).enter);
    }
    if (level > previous) {
      EXPECT_GE(utilization, thresholds.band(level).enter);
    }
    if (level < previous) {
      EXPECT_LT(utilization, thresholds.band(previous).exit);
    }
    previous = level;
  }
}

TEST(MemoryPressureTest, BadThresholdsAreRefusedNamingTheBand) {
  PressureThresholds thresholds;
  EXPECT_TRUE(thresholds.validate().ok());
  thresholds.warning = PressureBand{0.8, 0.85};
  Status status = thresholds.validate();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("warning"), std::string::npos) << status.to_string();

  thresholds = PressureThresholds{};
  thresholds.critical = PressureBand{0.7, 0.6};  // below warning's
  status = thresholds.validate();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("critical"), std::string::npos) << status.to_string();

  thresholds = PressureThresholds{};
  thresholds.out_of_memory = PressureBand{1.2, 0.97};
  EXPECT_EQ(thresholds.validate().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace folio::memory
