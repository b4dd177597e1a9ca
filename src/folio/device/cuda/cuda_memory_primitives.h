// CudaMemoryPrimitives: the CUDA backend's calls into the driver's virtual memory management API
// on one GPU; TrackedVirtualMemory<CudaMemoryPrimitives> is CUDA virtual memory (made by
// make_cuda_virtual_memory, folio/device/cuda_virtual_memory.h), and keeps the tables and checks.
//
// A Memory is a list of one-granule allocations (cuMemCreate of granularity() bytes each), and
// grow appends to the list. cuMemMap can only map an allocation whole, from its offset 0, so one
// allocation per granule is what lets any granule of the memory be mapped at any granule of any
// range. Each verb's driver calls are named on its declaration below.
//
// Failure: a create or grow that fails partway releases the allocations it made; a map that
// fails partway unmaps the granules it mapped. release of a range or memory, and unmap, go on
// past a driver failure on one granule and report the first one, so they never stop halfway.
// cuMemRelease of an allocation still mapped is legal: the driver frees it when the last
// mapping goes, which is the contract's "released memory lives until its last view goes".
//
// Every verb's calls run in a CallScope: the device's primary context pushed as current on the
// calling thread and popped afterwards, so callers' own current contexts are left as they were.
//
// Thread-safety: calls are serialized by the owning TrackedVirtualMemory's mutex, which is held
// across the driver calls of a verb.
//
// Invariants (kept with the owning tables): the regions a range's MappingTable lists are exactly
// the mapped granules in it; every live Memory's granule list holds live allocations of
// granularity() bytes.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <span>
#include <vector>

#include "folio/base/result.h"
#include "folio/base/status.h"
#include "folio/device/cuda/cuda_driver.h"
#include "folio/device/mapping_table.h"
#include "folio/device/virtual_memory.h"

namespace folio::device::cuda {

class CudaMemoryPrimitives {
 public:
  static constexpr DeviceKind kKind = DeviceKind::kCuda;
  // unmap goes on past a granule the driver refuses, so part of the region may be unmapped.
  static constexpr bool kForgetRegionOnFailedUnmap = true;

  // One physical memory: its one-granule allocations, in order.
  struct Memory {
    std::vector<CUmemGenericAllocationHandle> granules;
  };

  // Makes the primitives' context current on this thread for the scope's lifetime, then
  // restores the previous one.
  class CallScope {
   public:
    explicit CallScope(const CudaMemoryPrimitives& primitives);
    ~CallScope();
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;
    const Status& status() const { return status_; }

   private:
    const CudaDriver& driver_;
    Status status_;
  };

  // Takes over one retain of `device`'s primary context `context`, released by the destructor.
  // Requires: granularity > 0 (the driver's minimum allocation granularity for `device`).
  CudaMemoryPrimitives(const CudaDriver& driver, CUdevice device, CUcontext context,
                       size_t granularity);
  ~CudaMemoryPrimitives();
  CudaMemoryPrimitives(const CudaMemoryPrimitives&) = delete;
  CudaMemoryPrimitives& operator=(const CudaMemoryPrimitives&) = delete;

  size_t granularity() const { return granularity_; }
  CUdevice device() const { return device_; }
  // The device's primary context, retained for this object's lifetime.
  CUcontext context() const { return context_; }

  // cuMemAddressReserve.
  Result<std::byte*> reserve(size_t bytes);
  // cuMemUnmap of every mapped granule, then cuMemAddressFree.
  Status release_range(const AddressRange& range, const MappingTable& mappings);

  // cuMemCreate of each granule.
  Result<Memory> create(size_t bytes);
  // cuMemCreate of each new granule, appended to the list.
  Status grow(Memory& memory, PhysicalMemoryId id, size_t old_bytes, size_t new_bytes);
  // cuMemRelease of each granule.
  Status release_memory(const Memory& memory, PhysicalMemoryId id);

  // cuMemMap of each granule, then cuMemSetAccess (read-write, for this device) on the region.
  Status map(std::byte* address, const Memory& memory, PhysicalMemoryId id, size_t memory_offset,
             size_t bytes);
  // cuMemUnmap of each granule.
  Status unmap(std::byte* address, size_t bytes);
  // cuMemSetAccess, for this device.
  Status set_access(std::byte* address, size_t bytes, Access access);

  // The number of granules times granularity(): cuMemCreate commits at once. No driver call.
  Result<size_t> resident_bytes(const Memory& memory, PhysicalMemoryId id) const;

 private:
  // Appends `count` new granules to `granules`; on failure releases the ones it appended.
  Status create_granules(size_t count, std::vector<CUmemGenericAllocationHandle>& granules);
  // Releases every handle, going on past failures; returns the first.
  Status release_granules(std::span<const CUmemGenericAllocationHandle> granules);
  // Unmaps `count` granules from `address` on, going on past failures; returns the first.
  Status unmap_granules(CUdeviceptr address, size_t count);

  const CudaDriver& driver_;
  const CUdevice device_;
  const CUcontext context_;
  const size_t granularity_;
};

}  // namespace folio::device::cuda
