#include "folio/base/strong_id.h"

#include <cstdint>
#include <type_traits>
#include <unordered_set>

#include <gtest/gtest.h>

namespace folio {
namespace {

struct PageIdTag {};
struct BlockIdTag {};
using PageId = StrongId<PageIdTag, int32_t>;
using BlockId = StrongId<BlockIdTag, int32_t>;
using SlotId = StrongId<struct SlotIdTag, uint16_t>;

// Ids of different concepts do not convert into one another, nor from bare integers.
static_assert(!std::is_convertible_v<PageId, BlockId>);
static_assert(!std::is_convertible_v<int32_t, PageId>);
static_assert(!std::is_convertible_v<PageId, int32_t>);
static_assert(sizeof(PageId) == sizeof(int32_t));
static_assert(PageId::kInvalid == -1);
static_assert(SlotId::kInvalid == UINT16_MAX);

TEST(StrongIdTest, DefaultIsInvalid) {
  EXPECT_FALSE(PageId().is_valid());
  EXPECT_EQ(PageId(), PageId::invalid());
  EXPECT_FALSE(SlotId().is_valid());
  EXPECT_TRUE(PageId(0).is_valid());
  EXPECT_TRUE(SlotId(0).is_valid());
  EXPECT_FALSE(SlotId(UINT16_MAX).is_valid());
}

TEST(StrongIdTest, ComparesByValue) {
  EXPECT_EQ(PageId(3), PageId(3));
  EXPECT_NE(PageId(3), PageId(4));
  EXPECT_LT(PageId(3), PageId(4));
  EXPECT_GT(PageId(5), PageId(4));
  EXPECT_EQ(PageId(9).value(), 9);
}

TEST(StrongIdTest, HashesAndFormats) {
  std::unordered_set<PageId> ids = {PageId(1), PageId(2), PageId(1)};
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_TRUE(ids.contains(PageId(2)));
  EXPECT_EQ(fmt::format("page {}", PageId(42)), "page 42");
  EXPECT_EQ(fmt::format("{:>4}", SlotId(7)), "   7");
}

}  // namespace
}  // namespace folio
