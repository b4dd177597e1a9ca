#include "folio/kernels/paged_kv_layout.h"

#include <gtest/gtest.h>

namespace folio::kernels {
namespace {

PagedKvLayout example_layout(std::byte* base) {
  // 2 layers x (K, V) x 16 tokens x 2 kv heads x 4 dims x 2 bytes = 1024 bytes per block.
  return PagedKvLayout{.base = base,
                       .page_bytes = 4096 + 64,
                       .blocks_per_page = 4,
                       .block_bytes = 1024,
                       .block_size = 16,
                       .num_layers = 2,
                       .num_kv_heads = 2,
                       .head_dim = 4,
                       .dtype = DType::kF16};
}

TEST(PagedKvLayoutTest, AddressesFollowTheDocumentedFormula) {
  alignas(64) static std::byte base[1];
  const PagedKvLayout layout = example_layout(base);
  EXPECT_EQ(PagedKvLayout::compute_block_bytes(2, 16, 2, 4, DType::kF16), 1024);
  EXPECT_EQ(layout.token_stride(), 8);
  // Slot 5 * 16 + 3: block 5 is the second block of page 1; token 3 of layer 1's K rows.
  const int64_t slot = 5 * 16 + 3;
  const int64_t block_offset = 1 * (4096 + 64) + 1 * 1024;
  const int64_t row_bytes = 2 * 4 * 2;
  EXPECT_EQ(layout.key_pointer(1, slot) - base, block_offset + (2 * 16 + 3) * row_bytes);
  EXPECT_EQ(layout.value_pointer(1, slot) - base, block_offset + (3 * 16 + 3) * row_bytes);
  EXPECT_EQ(layout.key_pointer(0, 0) - base, 0);
  EXPECT_EQ(layout.value_pointer(0, 15) - base, (16 + 15) * row_bytes);
}

TEST(PagedKvLayoutTest, ValidateAcceptsConsistentLayoutsAndExplainsBadOnes) {
  alignas(64) static std::byte base[1];
  EXPECT_TRUE(example_layout(base).validate().ok());

  PagedKvLayout wrong_block_bytes = example_layout(base);
  wrong_block_bytes.block_bytes = 1000;
  EXPECT_EQ(wrong_block_bytes.validate().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_block_bytes.validate().message().find("needs 1024"), std::string_view::npos);

  PagedKvLayout bf16 = example_layout(base);
  bf16.dtype = DType::kBF16;
  EXPECT_NE(bf16.validate().message().find("f32 or f16"), std::string_view::npos);

  PagedKvLayout overfull = example_layout(base);
  overfull.blocks_per_page = 5;
  EXPECT_NE(overfull.validate().message().find("do not fit"), std::string_view::npos);

  PagedKvLayout no_heads = example_layout(base);
  no_heads.num_kv_heads = 0;
  EXPECT_FALSE(no_heads.validate().ok());

  EXPECT_FALSE(example_layout(nullptr).validate().ok());
}

}  // namespace
}  // namespace folio::kernels
