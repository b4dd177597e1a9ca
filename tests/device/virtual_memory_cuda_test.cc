// VirtualMemory contract suites on the CUDA implementation (device 0). Every test skips, saying
// why, when make_cuda_virtual_memory(0) fails: no driver, no device, or no VMM support. Bytes go
// in and out of views with the driver's synchronous cuMemcpyHtoD / cuMemcpyDtoH.
#include <gtest/gtest.h>

#include "folio/device/cuda/cuda_driver.h"
#include "folio/device/cuda_virtual_memory.h"
#include "virtual_memory_argument_contract.h"
#include "virtual_memory_contract.h"

namespace folio::device::testing {
namespace {

constexpr int kDeviceOrdinal = 0;

// The primary context of device 0, retained once for the test process (never released, so it
// outlives every VirtualMemory the tests make and destroy).
Result<CUcontext> primary_context(const cuda::CudaDriver& driver) {
  static Result<CUcontext> context = [&]() -> Result<CUcontext> {
    CUdevice device = 0;
    FOLIO_RETURN_IF_ERROR(
        driver.check(driver.device_get(&device, kDeviceOrdinal), "cuDeviceGet", "test"));
    CUcontext retained = nullptr;
    FOLIO_RETURN_IF_ERROR(driver.check(driver.primary_context_retain(&retained, device),
                                       "cuDevicePrimaryCtxRetain", "test"));
    return retained;
  }();
  return context;
}

struct CudaBackend {
  static Result<std::unique_ptr<VirtualMemory>> make() {
    return make_cuda_virtual_memory(kDeviceOrdinal);
  }
  static Status write(std::byte* address, const void* source, size_t bytes) {
    return copy([&](const cuda::CudaDriver& driver) {
      return driver.memcpy_host_to_device(reinterpret_cast<uintptr_t>(address), source, bytes);
    });
  }
  static Status read(const std::byte* address, void* destination, size_t bytes) {
    return copy([&](const cuda::CudaDriver& driver) {
      return driver.memcpy_device_to_host(destination, reinterpret_cast<uintptr_t>(address), bytes);
    });
  }

 private:
  template <typename Copy>
  static Status copy(const Copy& copy_bytes) {
    FOLIO_ASSIGN_OR_RETURN(const cuda::CudaDriver* driver, cuda::CudaDriver::get());
    FOLIO_ASSIGN_OR_RETURN(CUcontext context, primary_context(*driver));
    FOLIO_RETURN_IF_ERROR(
        driver->check(driver->context_push_current(context), "cuCtxPushCurrent", "test copy"));
    const Status status = driver->check(copy_bytes(*driver), "cuMemcpy", "test copy");
    CUcontext popped = nullptr;
    driver->context_pop_current(&popped);
    return status;
  }
};

INSTANTIATE_TYPED_TEST_SUITE_P(Cuda, VirtualMemoryContractTest, CudaBackend);
INSTANTIATE_TYPED_TEST_SUITE_P(Cuda, VirtualMemoryArgumentTest, CudaBackend);

TEST(CudaVirtualMemoryTest, GranularityIsThePowerOfTwoTheDriverReports) {
  Result<std::unique_ptr<VirtualMemory>> made = make_cuda_virtual_memory(kDeviceOrdinal);
  if (!made.ok()) GTEST_SKIP() << "no CUDA device: " << made.status().to_string();
  const size_t granularity = (*made)->granularity();
  EXPECT_EQ((*made)->kind(), DeviceKind::kCuda);
  EXPECT_GT(granularity, 0u);
  EXPECT_EQ(granularity & (granularity - 1), 0u);
}

TEST(CudaVirtualMemoryTest, ADeviceThatDoesNotExistIsUnavailable) {
  Result<std::unique_ptr<VirtualMemory>> made = make_cuda_virtual_memory(kDeviceOrdinal);
  if (!made.ok()) GTEST_SKIP() << "no CUDA device: " << made.status().to_string();
  EXPECT_EQ(make_cuda_virtual_memory(1 << 20).status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace folio::device::testing
