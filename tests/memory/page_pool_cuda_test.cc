// The page pool on device memory: the same code over the CUDA VirtualMemory (cuMem*). Skipped at
// run time without a CUDA device. The pool never touches the pages' bytes, so everything here is
// bookkeeping over device addresses, which must not be dereferenced on the CPU.
#include <gtest/gtest.h>

#include "folio/device/cuda_virtual_memory.h"
#include "folio/memory/page_pool.h"
#include "pool_test_util.h"

namespace folio::memory {
namespace {

class PagePoolCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<device::VirtualMemory>> made = device::make_cuda_virtual_memory(0);
    if (!made.ok()) GTEST_SKIP() << "no CUDA device: " << made.status().to_string();
    vm_ = std::move(*made);
  }
  PagePoolOptions options(int64_t pages) const {
    PagePoolOptions result;
    result.name = "cuda";
    result.page_size = std::max<size_t>(size_t{2} << 20, vm_->granularity());
    result.num_pages = pages;
    return result;
  }
  std::unique_ptr<device::VirtualMemory> vm_;
};

TEST_F(PagePoolCudaTest, PagesAreDeviceAddressesInOneMappedRange) {
  Result<std::unique_ptr<PagePool>> pool = PagePool::create(*vm_, options(16));
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  EXPECT_NE((*pool)->base(), nullptr);
  EXPECT_EQ((*pool)->physical_memory().size, 16 * (*pool)->page_size());
  Result<PageAllocation> range = (*pool)->allocate(testing::request(5, ContentType::kGraphArena));
  ASSERT_TRUE(range.ok()) << range.status().to_string();
  EXPECT_EQ(range->data(), (*pool)->page_address(range->first_page()));
  EXPECT_EQ((*pool)->physical_offset(range->first_page()),
            static_cast<size_t>(range->first_page().value()) * (*pool)->page_size());
  (*pool)->check_invariants();
}

TEST_F(PagePoolCudaTest, PagesSmallerThanTheDeviceGranularityAreRejected) {
  PagePoolOptions small = options(4);
  small.page_size = 4096;
  Result<std::unique_ptr<PagePool>> pool = PagePool::create(*vm_, small);
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(pool.status().message().find("granularity"), std::string_view::npos);
}

TEST_F(PagePoolCudaTest, EvictionAndRangesWorkTheSameOnDeviceMemory) {
  PagePoolOptions plain = options(8);
  plain.high_watermark = 1.0;
  plain.low_watermark = 1.0;
  Result<std::unique_ptr<PagePool>> made = PagePool::create(*vm_, plain);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  PagePool& pool = **made;
  testing::RecordingListener listener;
  std::vector<PageAllocation> pages;
  for (int i = 0; i < 8; ++i) {
    pages.push_back(
        std::move(*pool.allocate(testing::request(1, ContentType::kKvCache, false, &listener))));
    pool.advance_step();
  }
  Result<PageAllocation> pair = pool.allocate(testing::request(2, ContentType::kAdapterWeights));
  ASSERT_TRUE(pair.ok()) << pair.status().to_string();
  EXPECT_EQ(listener.count(), 2u);
  pool.check_invariants();
}

}  // namespace
}  // namespace folio::memory
