// VirtualMemory contract suites on the host implementation, plus what only the host can show:
// the kernel's own view of each region (/proc/self/maps) and a fault on a kNone region.
#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "folio/device/cuda_virtual_memory.h"
#include "folio/device/host_virtual_memory.h"
#include "virtual_memory_argument_contract.h"
#include "virtual_memory_contract.h"

namespace folio::device::testing {
namespace {

struct HostBackend {
  static Result<std::unique_ptr<VirtualMemory>> make() { return make_host_virtual_memory(); }
  static Status write(std::byte* address, const void* source, size_t bytes) {
    std::memcpy(address, source, bytes);
    return Status::ok_status();
  }
  static Status read(const std::byte* address, void* destination, size_t bytes) {
    std::memcpy(destination, address, bytes);
    return Status::ok_status();
  }
};

INSTANTIATE_TYPED_TEST_SUITE_P(Host, VirtualMemoryContractTest, HostBackend);
INSTANTIATE_TYPED_TEST_SUITE_P(Host, VirtualMemoryArgumentTest, HostBackend);

// The permission string ("rw-s", "---p") of the kernel mapping containing `address`, or "" when
// no mapping contains it: an independent reference for what the implementation did.
std::string kernel_permissions(const void* address) {
  const auto target = reinterpret_cast<uintptr_t>(address);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t begin = 0;
    uintptr_t end = 0;
    char permissions[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &begin, &end, permissions) != 3) continue;
    if (begin <= target && target < end) return permissions;
  }
  return "";
}

class HostVirtualMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<VirtualMemory>> made = make_host_virtual_memory();
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    vm_ = std::move(made).value();
    page_ = vm_->granularity();
  }
  std::unique_ptr<VirtualMemory> vm_;
  size_t page_ = 0;
};

TEST_F(HostVirtualMemoryTest, GranularityIsTheOsPage) {
  EXPECT_EQ(vm_->kind(), DeviceKind::kHost);
  EXPECT_EQ(page_, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
}

TEST_F(HostVirtualMemoryTest, KernelSeesReservationViewsAndGuards) {
  const AddressRange range = *vm_->reserve(3 * page_);
  const PhysicalMemory memory = *vm_->create(page_);
  EXPECT_EQ(kernel_permissions(range.base), "---p");
  ASSERT_TRUE(vm_->map(range, page_, memory, 0, page_).ok());
  EXPECT_EQ(kernel_permissions(range.base), "---p");
  EXPECT_EQ(kernel_permissions(range.base + page_), "rw-s");
  ASSERT_TRUE(vm_->set_access(range, page_, page_, Access::kNone).ok());
  EXPECT_EQ(kernel_permissions(range.base + page_), "---s");
  ASSERT_TRUE(vm_->unmap(range, page_, page_).ok());
  // Unmapped means reserved again, not a hole.
  EXPECT_EQ(kernel_permissions(range.base + page_), "---p");
  ASSERT_TRUE(vm_->release(range).ok());
  EXPECT_EQ(kernel_permissions(range.base + page_), "");
}

TEST_F(HostVirtualMemoryTest, ReservingHugeAddressSpaceCommitsNothing) {
  // 64 GiB of PROT_NONE, MAP_NORESERVE address space costs no memory.
  const Result<AddressRange> range = vm_->reserve(size_t{64} << 30);
  ASSERT_TRUE(range.ok()) << range.status().to_string();
  EXPECT_TRUE(vm_->release(*range).ok());
}

TEST_F(HostVirtualMemoryTest, TouchingAnInaccessibleRegionFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const AddressRange range = *vm_->reserve(page_);
  const PhysicalMemory memory = *vm_->create(page_);
  ASSERT_TRUE(vm_->map(range, 0, memory, 0, page_).ok());
  ASSERT_TRUE(vm_->set_access(range, 0, page_, Access::kNone).ok());
  volatile std::byte* guard = range.base;
  EXPECT_DEATH(*guard = std::byte{1}, "");
}

TEST_F(HostVirtualMemoryTest, DestructionReleasesEverythingStillLive) {
  const AddressRange range = *vm_->reserve(2 * page_);
  const PhysicalMemory memory = *vm_->create(page_);
  ASSERT_TRUE(vm_->map(range, 0, memory, 0, page_).ok());
  vm_.reset();
  EXPECT_EQ(kernel_permissions(range.base), "");
}

TEST(CudaVirtualMemoryFactoryTest, WithoutADeviceItIsUnavailableWithAReason) {
  Result<std::unique_ptr<VirtualMemory>> made = make_cuda_virtual_memory(0);
  if (made.ok()) GTEST_SKIP() << "a CUDA device is present; cuda_virtual_memory_test covers it";
  EXPECT_EQ(made.status().code(), StatusCode::kUnavailable) << made.status().to_string();
  EXPECT_FALSE(made.status().message().empty());
}

TEST(CudaVirtualMemoryFactoryTest, NegativeOrdinalIsInvalid) {
  EXPECT_EQ(make_cuda_virtual_memory(-1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace folio::device::testing
