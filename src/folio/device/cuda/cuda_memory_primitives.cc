#include "folio/device/cuda/cuda_memory_primitives.h"

#include <cstdint>
#include <memory>

#include "folio/base/check.h"
#include "folio/device/cuda_virtual_memory.h"
#include "folio/device/tracked_virtual_memory.h"

namespace folio::device {
namespace {

CUmemAllocationProp device_allocation_properties(CUdevice device) {
  CUmemAllocationProp properties{};
  properties.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  properties.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  properties.location.id = device;
  return properties;
}

std::byte* as_pointer(CUdeviceptr address) {
  return reinterpret_cast<std::byte*>(static_cast<uintptr_t>(address));
}

CUdeviceptr as_device_address(std::byte* pointer) {
  return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(pointer));
}

CUmemAccess_flags access_flags_of(Access access) {
  switch (access) {
    case Access::kNone:
      return CU_MEM_ACCESS_FLAGS_PROT_NONE;
    case Access::kReadWrite:
      return CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  FOLIO_UNREACHABLE("unknown Access {}", static_cast<int>(access));
}

Result<CUdevice> find_vmm_device(const cuda::CudaDriver& driver, int device_ordinal) {
  int num_devices = 0;
  FOLIO_RETURN_IF_ERROR(
      driver.check(driver.device_get_count(&num_devices), "cuDeviceGetCount", "counting GPUs"));
  if (device_ordinal >= num_devices) {
    return unavailable("CUDA device {} does not exist: the driver sees {} device(s)",
                       device_ordinal, num_devices);
  }
  CUdevice device = 0;
  FOLIO_RETURN_IF_ERROR(driver.check(driver.device_get(&device, device_ordinal), "cuDeviceGet",
                                     fmt::format("opening CUDA device {}", device_ordinal)));
  int supported = 0;
  FOLIO_RETURN_IF_ERROR(
      driver.check(driver.device_get_attribute(
                       &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device),
                   "cuDeviceGetAttribute", "querying virtual memory management support"));
  if (supported == 0) {
    return unavailable("CUDA device {} does not support virtual memory management", device_ordinal);
  }
  return device;
}

}  // namespace

Result<std::unique_ptr<VirtualMemory>> make_cuda_virtual_memory(int device_ordinal) {
  if (device_ordinal < 0) {
    return invalid_argument("CUDA device ordinal {} is negative", device_ordinal);
  }
  FOLIO_ASSIGN_OR_RETURN(const cuda::CudaDriver* driver, cuda::CudaDriver::get());
  FOLIO_ASSIGN_OR_RETURN(CUdevice device, find_vmm_device(*driver, device_ordinal));
  const CUmemAllocationProp properties = device_allocation_properties(device);
  size_t granularity = 0;
  FOLIO_RETURN_IF_ERROR(
      driver->check(driver->memory_get_allocation_granularity(&granularity, &properties,
                                                              CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                    "cuMemGetAllocationGranularity", "querying the allocation granularity"));
  CUcontext context = nullptr;
  FOLIO_RETURN_IF_ERROR(driver->check(driver->primary_context_retain(&context, device),
                                      "cuDevicePrimaryCtxRetain",
                                      "retaining the device's primary context"));
  return std::unique_ptr<VirtualMemory>(
      std::make_unique<TrackedVirtualMemory<cuda::CudaMemoryPrimitives>>(*driver, device, context,
                                                                         granularity));
}

namespace cuda {

CudaMemoryPrimitives::CallScope::CallScope(const CudaMemoryPrimitives& primitives)
    : driver_(primitives.driver_) {
  status_ = driver_.check(driver_.context_push_current(primitives.context_), "cuCtxPushCurrent",
                          "making the device's primary context current");
}

CudaMemoryPrimitives::CallScope::~CallScope() {
  CUcontext popped = nullptr;
  if (status_.ok()) driver_.context_pop_current(&popped);
}

CudaMemoryPrimitives::CudaMemoryPrimitives(const CudaDriver& driver, CUdevice device,
                                           CUcontext context, size_t granularity)
    : driver_(driver), device_(device), context_(context), granularity_(granularity) {
  FOLIO_CHECK(granularity > 0, "CUDA reported an allocation granularity of 0");
}

CudaMemoryPrimitives::~CudaMemoryPrimitives() {
  driver_.primary_context_release(device_);
}

Status CudaMemoryPrimitives::create_granules(size_t count,
                                             std::vector<CUmemGenericAllocationHandle>& granules) {
  const CUmemAllocationProp properties = device_allocation_properties(device_);
  const size_t first_new = granules.size();
  granules.reserve(first_new + count);
  for (size_t i = 0; i < count; ++i) {
    CUmemGenericAllocationHandle handle = 0;
    Status status =
        driver_.check(driver_.memory_create(&handle, granularity_, &properties, 0), "cuMemCreate",
                      fmt::format("allocating granule {} of {}", i + 1, count));
    if (!status.ok()) {
      release_granules(std::span(granules).subspan(first_new)).ignore();
      granules.resize(first_new);
      return status;
    }
    granules.push_back(handle);
  }
  return Status::ok_status();
}

Status CudaMemoryPrimitives::release_granules(
    std::span<const CUmemGenericAllocationHandle> granules) {
  Status first_failure;
  for (CUmemGenericAllocationHandle handle : granules) {
    Status status = driver_.check(driver_.memory_release(handle), "cuMemRelease",
                                  "releasing a granule of physical memory");
    if (first_failure.ok()) first_failure = status;
  }
  return first_failure;
}

Status CudaMemoryPrimitives::unmap_granules(CUdeviceptr address, size_t count) {
  Status first_failure;
  for (size_t i = 0; i < count; ++i) {
    Status status = driver_.check(driver_.memory_unmap(address + i * granularity_, granularity_),
                                  "cuMemUnmap", "unmapping a granule");
    if (first_failure.ok()) first_failure = status;
  }
  return first_failure;
}

Result<std::byte*> CudaMemoryPrimitives::reserve(size_t bytes) {
  CUdeviceptr base = 0;
  FOLIO_RETURN_IF_ERROR(driver_.check(driver_.memory_address_reserve(&base, bytes, 0, 0, 0),
                                      "cuMemAddressReserve",
                                      fmt::format("reserving {} bytes of address space", bytes)));
  return as_pointer(base);
}

Status CudaMemoryPrimitives::release_range(const AddressRange& range,
                                           const MappingTable& mappings) {
  const CUdeviceptr base = as_device_address(range.base);
  Status first_failure;
  for (const Mapping& mapping : mappings.mappings()) {
    Status status = unmap_granules(base + mapping.range_offset, mapping.bytes / granularity_);
    if (first_failure.ok()) first_failure = status;
  }
  Status freed = driver_.check(driver_.memory_address_free(base, range.size), "cuMemAddressFree",
                               "freeing an address range");
  return first_failure.ok() ? freed : first_failure;
}

Result<CudaMemoryPrimitives::Memory> CudaMemoryPrimitives::create(size_t bytes) {
  Memory memory;
  FOLIO_RETURN_IF_ERROR(create_granules(bytes / granularity_, memory.granules));
  return memory;
}

Status CudaMemoryPrimitives::grow(Memory& memory, PhysicalMemoryId /*id*/, size_t old_bytes,
                                  size_t new_bytes) {
  return create_granules((new_bytes - old_bytes) / granularity_, memory.granules);
}

Status CudaMemoryPrimitives::release_memory(const Memory& memory, PhysicalMemoryId /*id*/) {
  return release_granules(memory.granules);
}

Status CudaMemoryPrimitives::map(std::byte* address_pointer, const Memory& memory,
                                 PhysicalMemoryId id, size_t memory_offset, size_t bytes) {
  const CUdeviceptr address = as_device_address(address_pointer);
  const size_t first_granule = memory_offset / granularity_;
  const size_t count = bytes / granularity_;
  for (size_t i = 0; i < count; ++i) {
    Status status = driver_.check(
        driver_.memory_map(address + i * granularity_, granularity_, 0,
                           memory.granules[first_granule + i], 0),
        "cuMemMap", fmt::format("mapping granule {} of physical memory {}", first_granule + i, id));
    if (!status.ok()) {
      unmap_granules(address, i).ignore();
      return status;
    }
  }
  if (Status status = set_access(address_pointer, bytes, Access::kReadWrite); !status.ok()) {
    unmap_granules(address, count).ignore();
    return status;
  }
  return Status::ok_status();
}

Status CudaMemoryPrimitives::unmap(std::byte* address, size_t bytes) {
  return unmap_granules(as_device_address(address), bytes / granularity_);
}

Status CudaMemoryPrimitives::set_access(std::byte* address, size_t bytes, Access access) {
  CUmemAccessDesc description{};
  description.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  description.location.id = device_;
  description.flags = access_flags_of(access);
  return driver_.check(
      driver_.memory_set_access(as_device_address(address), bytes, &description, 1),
      "cuMemSetAccess", fmt::format("setting access of {} bytes", bytes));
}

Result<size_t> CudaMemoryPrimitives::resident_bytes(const Memory& memory,
                                                    PhysicalMemoryId /*id*/) const {
  return memory.granules.size() * granularity_;
}

}  // namespace cuda
}  // namespace folio::device
