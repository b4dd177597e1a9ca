#include "folio/device/cuda/cuda_virtual_memory.h"

#include <cstdint>

#include "folio/base/check.h"
#include "folio/device/cuda_virtual_memory.h"

namespace folio::device {

Result<std::unique_ptr<VirtualMemory>> make_cuda_virtual_memory(int device_ordinal) {
  FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaVirtualMemory> memory,
                         cuda::CudaVirtualMemory::open(device_ordinal));
  return std::unique_ptr<VirtualMemory>(std::move(memory));
}

namespace cuda {
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

CUmemAccess_flags access_flags_of(Access access) {
  switch (access) {
    case Access::kNone:
      return CU_MEM_ACCESS_FLAGS_PROT_NONE;
    case Access::kReadWrite:
      return CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  FOLIO_UNREACHABLE("unknown Access {}", static_cast<int>(access));
}

// Makes a context current on this thread for the scope's lifetime, then restores the previous.
class ContextScope {
 public:
  ContextScope(const CudaDriver& driver, CUcontext context) : driver_(driver) {
    status_ = driver.check(driver.context_push_current(context), "cuCtxPushCurrent",
                           "making the device's primary context current");
  }
  ~ContextScope() {
    CUcontext popped = nullptr;
    if (status_.ok()) driver_.context_pop_current(&popped);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
  const Status& status() const { return status_; }

 private:
  const CudaDriver& driver_;
  Status status_;
};

Result<CUdevice> find_vmm_device(const CudaDriver& driver, int device_ordinal) {
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

Result<std::unique_ptr<CudaVirtualMemory>> CudaVirtualMemory::open(int device_ordinal) {
  if (device_ordinal < 0) {
    return invalid_argument("CUDA device ordinal {} is negative", device_ordinal);
  }
  FOLIO_ASSIGN_OR_RETURN(const CudaDriver* driver, CudaDriver::get());
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
  return std::unique_ptr<CudaVirtualMemory>(
      new CudaVirtualMemory(*driver, device, context, granularity));
}

CudaVirtualMemory::CudaVirtualMemory(const CudaDriver& driver, CUdevice device, CUcontext context,
                                     size_t granularity)
    : driver_(driver), device_(device), context_(context), granularity_(granularity) {
  FOLIO_CHECK(granularity > 0, "CUDA reported an allocation granularity of 0");
}

CudaVirtualMemory::~CudaVirtualMemory() {
  {
    MutexLock lock(mutex_);
    ContextScope scope(driver_, context_);
    for (auto& [id, range] : ranges_) release_range_locked(range).ignore();
    for (auto& [id, memory] : memories_) release_granules(memory.granules).ignore();
  }
  driver_.primary_context_release(device_);
}

Result<CudaVirtualMemory::RangeRecord*> CudaVirtualMemory::find_range(const AddressRange& range,
                                                                      std::string_view verb) {
  auto it = ranges_.find(range.id);
  if (it == ranges_.end() || as_pointer(it->second.base) != range.base ||
      it->second.size != range.size) {
    return failed_precondition(
        "{}: address range {} is not live in this VirtualMemory (released already, or from "
        "another instance)",
        verb, range.id);
  }
  return &it->second;
}

Result<CudaVirtualMemory::MemoryRecord*> CudaVirtualMemory::find_memory(
    const PhysicalMemory& memory, std::string_view verb) const {
  auto it = memories_.find(memory.id);
  if (it == memories_.end()) {
    return failed_precondition(
        "{}: physical memory {} is not live in this VirtualMemory (released already, or from "
        "another instance)",
        verb, memory.id);
  }
  return const_cast<MemoryRecord*>(&it->second);
}

Status CudaVirtualMemory::create_granules(size_t count,
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

Status CudaVirtualMemory::release_granules(std::span<const CUmemGenericAllocationHandle> granules) {
  Status first_failure;
  for (CUmemGenericAllocationHandle handle : granules) {
    Status status = driver_.check(driver_.memory_release(handle), "cuMemRelease",
                                  "releasing a granule of physical memory");
    if (first_failure.ok()) first_failure = status;
  }
  return first_failure;
}

Status CudaVirtualMemory::unmap_granules(CUdeviceptr address, size_t count) {
  Status first_failure;
  for (size_t i = 0; i < count; ++i) {
    Status status = driver_.check(driver_.memory_unmap(address + i * granularity_, granularity_),
                                  "cuMemUnmap", "unmapping a granule");
    if (first_failure.ok()) first_failure = status;
  }
  return first_failure;
}

Status CudaVirtualMemory::set_region_access(CUdeviceptr address, size_t bytes, Access access) {
  CUmemAccessDesc description{};
  description.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  description.location.id = device_;
  description.flags = access_flags_of(access);
  return driver_.check(driver_.memory_set_access(address, bytes, &description, 1), "cuMemSetAccess",
                       fmt::format("setting access of {} bytes", bytes));
}

Status CudaVirtualMemory::release_range_locked(const RangeRecord& record) {
  Status first_failure;
  for (const Mapping& mapping : record.mappings.mappings()) {
    Status status =
        unmap_granules(record.base + mapping.range_offset, mapping.bytes / granularity_);
    if (first_failure.ok()) first_failure = status;
  }
  Status freed = driver_.check(driver_.memory_address_free(record.base, record.size),
                               "cuMemAddressFree", "freeing an address range");
  return first_failure.ok() ? freed : first_failure;
}

Result<AddressRange> CudaVirtualMemory::reserve(size_t bytes) {
  FOLIO_RETURN_IF_ERROR(check_granular_size(bytes, granularity_, "reserve"));
  MutexLock lock(mutex_);
  ContextScope scope(driver_, context_);
  FOLIO_RETURN_IF_ERROR(scope.status());
  CUdeviceptr base = 0;
  FOLIO_RETURN_IF_ERROR(driver_.check(driver_.memory_address_reserve(&base, bytes, 0, 0, 0),
                                      "cuMemAddressReserve",
                                      fmt::format("reserving {} bytes of address space", bytes)));
  const AddressRange range{AddressRangeId(next_virtual_memory_handle_id()), as_pointer(base),
                           bytes};
  ranges_.emplace(range.id, RangeRecord{base, bytes, MappingTable()});
  return range;
}

Status CudaVirtualMemory::release(const AddressRange& range) {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(RangeRecord * record, find_range(range, "release(range)"));
  ContextScope scope(driver_, context_);
  FOLIO_RETURN_IF_ERROR(scope.status());
  const Status status = release_range_locked(*record);
  ranges_.erase(range.id);
  return status;
}

Result<PhysicalMemory> CudaVirtualMemory::create(size_t bytes) {
  FOLIO_RETURN_IF_ERROR(check_granular_size(bytes, granularity_, "create"));
  MutexLock lock(mutex_);
  ContextScope scope(driver_, context_);
  FOLIO_RETURN_IF_ERROR(scope.status());
  MemoryRecord record;
  FOLIO_RETURN_IF_ERROR(create_granules(bytes / granularity_, record.granules));
  const PhysicalMemory memory{PhysicalMemoryId(next_virtual_memory_handle_id()), bytes};
  memories_.emplace(memory.id, std::move(record));
  return memory;
}

Status CudaVirtualMemory::grow(PhysicalMemory& memory, size_t new_bytes) {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(MemoryRecord * record, find_memory(memory, "grow"));
  FOLIO_RETURN_IF_ERROR(check_granular_size(new_bytes, granularity_, "grow"));
  const size_t old_bytes = record->granules.size() * granularity_;
  if (new_bytes < old_bytes) {
    return invalid_argument("grow: new size {} is below the current size {}; memory never shrinks",
                            new_bytes, old_bytes);
  }
  ContextScope scope(driver_, context_);
  FOLIO_RETURN_IF_ERROR(scope.status());
  FOLIO_RETURN_IF_ERROR(create_granules((new_bytes - old_bytes) / granularity_, record->granules));
  memory.size = new_bytes;
  return Status::ok_status();
}

Status CudaVirtualMemory::release(const PhysicalMemory& memory) {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(MemoryRecord * record, find_memory(memory, "release(memory)"));
  ContextScope scope(driver_, context_);
  FOLIO_RETURN_IF_ERROR(scope.status());
  const Status status = release_granules(record->granules);
  memories_.erase(memory.id);
  return status;
}

Status CudaVirtualMemory::map(const AddressRange& range, size_t range_offset,
                              const PhysicalMemory& memory, size_t memory_offset, size_t bytes) {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(RangeRecord * range_record, find_range(range, "map"));
  FOLIO_ASSIGN_OR_RETURN(MemoryRecord * memory_record, find_memory(memory, "map"));
  FOLIO_RETURN_IF_ERROR(check_region(range_offset, bytes, range_record->size, granularity_,
                                     "map: region of the address range"));
  FOLIO_RETURN_IF_ERROR(check_region(memory_offset, bytes,
                                     memory_record->granules.size() * granularity_, granularity_,
                                     "map: region of the physical memory"));
  if (!range_record->mappings.is_unmapped(range_offset, bytes)) {
    return invalid_argument(
        "map: [{}, {}) of address range {} is already mapped, in part or whole; unmap it first",
        range_offset, range_offset + bytes, range.id);
  }
  ContextScope scope(driver_, context_);
  FOLIO_RETURN_IF_ERROR(scope.status());
  const CUdeviceptr address = range_record->base + range_offset;
  const size_t first_granule = memory_offset / granularity_;
  const size_t count = bytes / granularity_;
  for (size_t i = 0; i < count; ++i) {
    Status status = driver_.check(
        driver_.memory_map(address + i * granularity_, granularity_, 0,
                           memory_record->granules[first_granule + i], 0),
        "cuMemMap",
        fmt::format("mapping granule {} of physical memory {}", first_granule + i, memory.id));
    if (!status.ok()) {
      unmap_granules(address, i).ignore();
      return status;
    }
  }
  if (Status status = set_region_access(address, bytes, Access::kReadWrite); !status.ok()) {
    unmap_granules(address, count).ignore();
    return status;
  }
  range_record->mappings.insert(Mapping{range_offset, bytes, memory.id, memory_offset});
  return Status::ok_status();
}

Status CudaVirtualMemory::unmap(const AddressRange& range, size_t range_offset, size_t bytes) {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(RangeRecord * record, find_range(range, "unmap"));
  FOLIO_RETURN_IF_ERROR(check_region(range_offset, bytes, record->size, granularity_, "unmap"));
  if (!record->mappings.is_fully_mapped(range_offset, bytes)) {
    return invalid_argument("unmap: [{}, {}) of address range {} is not fully mapped", range_offset,
                            range_offset + bytes, range.id);
  }
  ContextScope scope(driver_, context_);
  FOLIO_RETURN_IF_ERROR(scope.status());
  // The table forgets the region even if the driver refused a granule: the driver's error is
  // reported, and a later map of that granule fails in the driver rather than in the table.
  const Status status = unmap_granules(record->base + range_offset, bytes / granularity_);
  record->mappings.erase(range_offset, bytes);
  return status;
}

Status CudaVirtualMemory::set_access(const AddressRange& range, size_t range_offset, size_t bytes,
                                     Access access) {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(RangeRecord * record, find_range(range, "set_access"));
  FOLIO_RETURN_IF_ERROR(
      check_region(range_offset, bytes, record->size, granularity_, "set_access"));
  if (!record->mappings.is_fully_mapped(range_offset, bytes)) {
    return invalid_argument("set_access: [{}, {}) of address range {} is not fully mapped",
                            range_offset, range_offset + bytes, range.id);
  }
  ContextScope scope(driver_, context_);
  FOLIO_RETURN_IF_ERROR(scope.status());
  return set_region_access(record->base + range_offset, bytes, access);
}

Result<size_t> CudaVirtualMemory::resident_bytes(const PhysicalMemory& memory) const {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(MemoryRecord * record, find_memory(memory, "resident_bytes"));
  return record->granules.size() * granularity_;
}

}  // namespace cuda
}  // namespace folio::device
