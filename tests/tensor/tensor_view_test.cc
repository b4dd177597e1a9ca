#include "folio/tensor/tensor_view.h"

#include <vector>

#include <gtest/gtest.h>

namespace folio {
namespace {

TEST(TensorViewTest, RowsOfAQuantizedMatrixAreWholeBlocksBackToBack) {
  std::vector<std::byte> storage(3 * 2 * 34);
  Result<TensorView> view = TensorView::make(storage.data(), DType::kQ8_0, {3, 64});
  ASSERT_TRUE(view.ok()) << view.status().to_string();
  EXPECT_EQ(view->rank(), 2);
  EXPECT_EQ(view->num_rows(), 3);
  EXPECT_EQ(view->row_elements(), 64);
  EXPECT_EQ(view->num_elements(), 192);
  EXPECT_EQ(view->row_bytes(), 68);
  EXPECT_EQ(view->size_bytes(), 204);
  EXPECT_EQ(view->row(2), storage.data() + 136);
  EXPECT_EQ(view->to_string(), "q8_0 [3, 64]");
}

TEST(TensorViewTest, LeadingDimensionsMultiplyIntoRows) {
  std::vector<float> storage(2 * 3 * 4 * 5);
  Result<TensorView> view = TensorView::make(storage.data(), DType::kF32, {2, 3, 4, 5});
  ASSERT_TRUE(view.ok()) << view.status().to_string();
  EXPECT_EQ(view->num_rows(), 24);
  EXPECT_EQ(view->row_bytes(), 20);
  EXPECT_EQ(view->dim(2), 4);
  EXPECT_EQ(reinterpret_cast<float*>(view->row(23)), storage.data() + 115);
}

TEST(TensorViewTest, EmptyDimensionsAreAllowed) {
  Result<TensorView> view = TensorView::make(nullptr, DType::kF16, {0, 8});
  ASSERT_TRUE(view.ok()) << view.status().to_string();
  EXPECT_EQ(view->num_elements(), 0);
  EXPECT_EQ(view->size_bytes(), 0);
}

TEST(TensorViewTest, RejectsMalformedShapes) {
  EXPECT_EQ(TensorView::make(nullptr, DType::kF32, std::span<const int64_t>()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(TensorView::make(nullptr, DType::kF32, {1, 2, 3, 4, 5}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(TensorView::make(nullptr, DType::kF32, {4, -1}).status().code(),
            StatusCode::kInvalidArgument);
  const Result<TensorView> partial_block = TensorView::make(nullptr, DType::kQ4_0, {2, 48});
  EXPECT_EQ(partial_block.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(partial_block.status().message().find("whole 32-value blocks"), std::string::npos)
      << partial_block.status().to_string();
}

}  // namespace
}  // namespace folio
