#include "folio/device/mapping_table.h"

#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace folio::device {
namespace {

const PhysicalMemoryId kMemoryA(1);
const PhysicalMemoryId kMemoryB(2);

TEST(MappingTableTest, OverlapAndCoverageQueries) {
  MappingTable table;
  EXPECT_TRUE(table.is_unmapped(0, 100));
  EXPECT_FALSE(table.is_fully_mapped(0, 1));
  table.insert({10, 10, kMemoryA, 0});
  table.insert({20, 5, kMemoryB, 50});
  EXPECT_TRUE(table.is_unmapped(0, 10));
  EXPECT_TRUE(table.is_unmapped(25, 10));
  EXPECT_FALSE(table.is_unmapped(5, 6));
  EXPECT_FALSE(table.is_unmapped(24, 1));
  EXPECT_FALSE(table.is_unmapped(0, 100));
  EXPECT_TRUE(table.is_fully_mapped(10, 15));  // spans both mappings
  EXPECT_TRUE(table.is_fully_mapped(12, 3));
  EXPECT_FALSE(table.is_fully_mapped(9, 2));
  EXPECT_FALSE(table.is_fully_mapped(24, 2));
  EXPECT_EQ(table.num_mapped_bytes(), 15u);
}

TEST(MappingTableTest, EraseSplitsStraddlingMappingsAndShiftsMemoryOffsets) {
  MappingTable table;
  table.insert({0, 30, kMemoryA, 100});
  table.erase(10, 10);
  const std::vector<Mapping> expected = {{0, 10, kMemoryA, 100}, {20, 10, kMemoryA, 120}};
  EXPECT_EQ(table.mappings(), expected);
  EXPECT_EQ(table.num_mapped_bytes(), 20u);
  table.insert({10, 10, kMemoryB, 0});
  table.erase(5, 20);
  const std::vector<Mapping> after = {{0, 5, kMemoryA, 100}, {25, 5, kMemoryA, 125}};
  EXPECT_EQ(table.mappings(), after);
  table.erase(0, 5);
  table.erase(25, 5);
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(table.num_mapped_bytes(), 0u);
}

// Random inserts and erases against a per-unit reference of which (memory, offset) each unit of
// the range shows; the table's answers and contents must match it after every step.
TEST(MappingTableTest, RandomOperationsMatchAPerUnitReference) {
  constexpr size_t kUnits = 40;
  std::mt19937 random(7);
  MappingTable table;
  std::vector<std::optional<std::pair<int64_t, size_t>>> reference(kUnits);
  for (int step = 0; step < 2000; ++step) {
    const size_t offset = random() % kUnits;
    const size_t bytes = 1 + random() % std::min<size_t>(8, kUnits - offset);
    bool any = false;
    bool all = true;
    for (size_t i = offset; i < offset + bytes; ++i) {
      any |= reference[i].has_value();
      all &= reference[i].has_value();
    }
    ASSERT_EQ(table.is_unmapped(offset, bytes), !any) << "step " << step;
    ASSERT_EQ(table.is_fully_mapped(offset, bytes), all) << "step " << step;
    if (!any) {
      const PhysicalMemoryId memory(static_cast<int64_t>(random() % 3));
      const size_t memory_offset = random() % 1000;
      table.insert({offset, bytes, memory, memory_offset});
      for (size_t i = 0; i < bytes; ++i)
        reference[offset + i] = {{memory.value(), memory_offset + i}};
    } else if (all) {
      table.erase(offset, bytes);
      for (size_t i = offset; i < offset + bytes; ++i) reference[i].reset();
    }
    std::vector<std::optional<std::pair<int64_t, size_t>>> seen(kUnits);
    size_t total = 0;
    for (const Mapping& mapping : table.mappings()) {
      ASSERT_GT(mapping.bytes, 0u);
      total += mapping.bytes;
      for (size_t i = 0; i < mapping.bytes; ++i) {
        ASSERT_FALSE(seen[mapping.range_offset + i].has_value()) << "overlap at step " << step;
        seen[mapping.range_offset + i] = {{mapping.memory.value(), mapping.memory_offset + i}};
      }
    }
    ASSERT_EQ(seen, reference) << "step " << step;
    ASSERT_EQ(table.num_mapped_bytes(), total);
  }
}

TEST(RegionChecksTest, RefuseMisalignmentEmptinessAndOverflow) {
  constexpr size_t kMax = std::numeric_limits<size_t>::max();
  EXPECT_TRUE(check_granular_size(8192, 4096, "t").ok());
  EXPECT_EQ(check_granular_size(0, 4096, "t").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(check_granular_size(100, 4096, "t").code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(check_region(4096, 4096, 8192, 4096, "t").ok());
  EXPECT_EQ(check_region(4096, 8192, 8192, 4096, "t").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(check_region(1, 4096, 8192, 4096, "t").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(check_region(kMax - 4095, 8192, kMax, 4096, "t").code(), StatusCode::kInvalidArgument);
  EXPECT_NE(check_region(1, 4096, 8192, 4096, "map: range").message().find("map: range"),
            std::string_view::npos);
}

TEST(HandleIdsTest, AreUniqueAndValid) {
  const int64_t first = next_virtual_memory_handle_id();
  const int64_t second = next_virtual_memory_handle_id();
  EXPECT_GT(first, 0);
  EXPECT_GT(second, first);
}

}  // namespace
}  // namespace folio::device
