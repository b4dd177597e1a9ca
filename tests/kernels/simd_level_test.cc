#include "folio/kernels/cpu/simd_level.h"

#include <gtest/gtest.h>

namespace folio::kernels::cpu {
namespace {

TEST(SimdLevelTest, SupportedLevelsRunFromPortableToTheDetectedOne) {
  const std::vector<SimdLevel> levels = supported_simd_levels();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), SimdLevel::kPortable);
  EXPECT_EQ(levels.back(), detected_simd_level());
  EXPECT_EQ(active_simd_level(), detected_simd_level());
}

TEST(SimdLevelTest, ScopedLevelOverridesAndRestores) {
  {
    ScopedSimdLevel scoped(SimdLevel::kPortable);
    EXPECT_EQ(active_simd_level(), SimdLevel::kPortable);
  }
  EXPECT_EQ(active_simd_level(), detected_simd_level());
  EXPECT_EQ(simd_level_name(SimdLevel::kAvx512), "avx512");
}

TEST(SimdLevelDeathTest, RefusesALevelTheCpuLacks) {
  if (detected_simd_level() == SimdLevel::kAvx512) GTEST_SKIP() << "this CPU has every level";
  EXPECT_DEATH(set_active_simd_level(SimdLevel::kAvx512), "not supported by this CPU");
}

}  // namespace
}  // namespace folio::kernels::cpu
