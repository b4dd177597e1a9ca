// CudaVirtualMemory: VirtualMemory on one GPU with the driver's virtual memory management API.
//
// - reserve / release(range): cuMemAddressReserve / cuMemAddressFree.
// - create / grow / release(memory): a PhysicalMemory is a list of one-granule allocations
//   (cuMemCreate of granularity() bytes each), and grow appends to the list. cuMemMap can only
//   map an allocation whole, from its offset 0, so one allocation per granule is what lets any
//   granule of the memory be mapped at any granule of any range.
// - map: cuMemMap of each granule, then cuMemSetAccess (read-write, for this device) on the
//   region. unmap: cuMemUnmap of each granule. set_access: cuMemSetAccess.
// - resident_bytes: the number of granules times granularity(): cuMemCreate commits at once.
//
// Failure: a create or grow that fails partway releases the allocations it made; a map that
// fails partway unmaps the granules it mapped. release of a range or memory, and unmap, go on
// past a driver failure on one granule and report the first one, so they never stop halfway.
// cuMemRelease of an allocation still mapped is legal: the driver frees it when the last
// mapping goes, which is the contract's "released memory lives until its last view goes".
//
// Every verb runs with the device's primary context pushed as current on the calling thread and
// popped afterwards, so callers' own current contexts are left as they were.
//
// Thread-safety: every method may be called from any thread. One mutex guards the tables and is
// held across the driver calls of a verb, as in HostVirtualMemory.
//
// Invariants (under mutex_): every live range is a reservation of exactly `size` bytes at `base`
// owned by this object, and the regions its MappingTable lists are exactly the mapped granules
// in it; every live memory's granule list holds live allocations of granularity() bytes.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "folio/base/mutex.h"
#include "folio/device/cuda/cuda_driver.h"
#include "folio/device/mapping_table.h"
#include "folio/device/virtual_memory.h"

namespace folio::device::cuda {

class CudaVirtualMemory final : public VirtualMemory {
 public:
  // See make_cuda_virtual_memory (folio/device/cuda_virtual_memory.h) for the errors.
  static Result<std::unique_ptr<CudaVirtualMemory>> open(int device_ordinal);
  // Releases every range and memory still live, then the primary context.
  ~CudaVirtualMemory() override;
  CudaVirtualMemory(const CudaVirtualMemory&) = delete;
  CudaVirtualMemory& operator=(const CudaVirtualMemory&) = delete;

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  size_t granularity() const override { return granularity_; }

  Result<AddressRange> reserve(size_t bytes) override;
  Status release(const AddressRange& range) override;

  Result<PhysicalMemory> create(size_t bytes) override;
  Status grow(PhysicalMemory& memory, size_t new_bytes) override;
  Status release(const PhysicalMemory& memory) override;

  Status map(const AddressRange& range, size_t range_offset, const PhysicalMemory& memory,
             size_t memory_offset, size_t bytes) override;
  Status unmap(const AddressRange& range, size_t range_offset, size_t bytes) override;
  Status set_access(const AddressRange& range, size_t range_offset, size_t bytes,
                    Access access) override;

  Result<size_t> resident_bytes(const PhysicalMemory& memory) const override;

  CUdevice device() const { return device_; }
  // The device's primary context, retained for this object's lifetime.
  CUcontext context() const { return context_; }

 private:
  struct RangeRecord {
    CUdeviceptr base = 0;
    size_t size = 0;
    MappingTable mappings;
  };
  struct MemoryRecord {
    std::vector<CUmemGenericAllocationHandle> granules;
  };

  CudaVirtualMemory(const CudaDriver& driver, CUdevice device, CUcontext context,
                    size_t granularity);

  Result<RangeRecord*> find_range(const AddressRange& range, std::string_view verb)
      FOLIO_REQUIRES(mutex_);
  Result<MemoryRecord*> find_memory(const PhysicalMemory& memory, std::string_view verb) const
      FOLIO_REQUIRES(mutex_);
  // Appends `count` new granules to `granules`; on failure releases the ones it appended.
  Status create_granules(size_t count, std::vector<CUmemGenericAllocationHandle>& granules);
  // Releases every handle, going on past failures; returns the first.
  Status release_granules(std::span<const CUmemGenericAllocationHandle> granules);
  // Unmaps `count` granules from `address` on, going on past failures; returns the first.
  Status unmap_granules(CUdeviceptr address, size_t count);
  Status set_region_access(CUdeviceptr address, size_t bytes, Access access);
  Status release_range_locked(const RangeRecord& record) FOLIO_REQUIRES(mutex_);

  const CudaDriver& driver_;
  const CUdevice device_;
  const CUcontext context_;
  const size_t granularity_;
  mutable Mutex mutex_;
  std::unordered_map<AddressRangeId, RangeRecord> ranges_ FOLIO_GUARDED_BY(mutex_);
  std::unordered_map<PhysicalMemoryId, MemoryRecord> memories_ FOLIO_GUARDED_BY(mutex_);
};

}  // namespace folio::device::cuda
