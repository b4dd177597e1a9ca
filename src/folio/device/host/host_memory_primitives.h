// HostMemoryPrimitives: the host backend's system calls on Linux, one to one with the verbs of
// VirtualMemory; TrackedVirtualMemory<HostMemoryPrimitives> is host virtual memory (made by
// make_host_virtual_memory, folio/device/host_virtual_memory.h), and keeps the tables and checks.
//
// Each verb is one system call or a few, named on its declaration below. Physical memory is a
// memfd and a view is an mmap of it, so every view of the same file offset is the same page.
//
// Thread-safety: calls are serialized by the owning TrackedVirtualMemory's mutex, which is held
// across the system calls of a verb, so the tables and the kernel's view of the address space
// change together.
//
// Invariants (kept with the owning tables): each region a range's MappingTable lists is a
// MAP_SHARED view of a memfd and every other page of the range is PROT_NONE reservation; every
// live Memory's fd is open with its size in bytes, all allocated.
#pragma once

#include <cstddef>

#include "folio/base/result.h"
#include "folio/base/status.h"
#include "folio/device/mapping_table.h"
#include "folio/device/virtual_memory.h"

namespace folio::device {

class HostMemoryPrimitives {
 public:
  static constexpr DeviceKind kKind = DeviceKind::kHost;
  // The unmap is one mmap call; when it fails the region is left listed as mapped, so the caller
  // may try the unmap again.
  static constexpr bool kForgetRegionOnFailedUnmap = false;

  // One physical memory: the memfd holding its bytes.
  struct Memory {
    int fd = -1;
  };

  // System calls need no per-thread state.
  class CallScope {
   public:
    explicit CallScope(const HostMemoryPrimitives&) {}
    Status status() const { return Status::ok_status(); }
  };

  // Requires: page_size is a power of two (the OS page size).
  explicit HostMemoryPrimitives(size_t page_size);

  size_t granularity() const { return page_size_; }

  // mmap(PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE): address space with no memory
  // and no commit charge; touching it faults.
  Result<std::byte*> reserve(size_t bytes);
  // munmap of the whole reservation, which drops every view in it at once: no halfway point.
  Status release_range(const AddressRange& range, const MappingTable& mappings);

  // memfd_create + ftruncate + fallocate. The bytes are allocated now, as cuMemCreate does on a
  // GPU, so running out of memory is a Status here and never a SIGBUS on first touch later.
  Result<Memory> create(size_t bytes);
  // ftruncate + fallocate of the new tail; on failure ftruncate back to old_bytes.
  Status grow(Memory& memory, PhysicalMemoryId id, size_t old_bytes, size_t new_bytes);
  // close() of the memfd at once. Each mmap holds its own reference to the file, so the bytes
  // stay valid through existing views and are freed when the last goes.
  Status release_memory(const Memory& memory, PhysicalMemoryId id);

  // mmap(MAP_SHARED | MAP_FIXED) of the memfd over the reserved region.
  Status map(std::byte* address, const Memory& memory, PhysicalMemoryId id, size_t memory_offset,
             size_t bytes);
  // mmap(PROT_NONE, MAP_FIXED | MAP_NORESERVE) over the region. It replaces the views with
  // reservation in one call, so the region never becomes a hole another mmap could take.
  Status unmap(std::byte* address, size_t bytes);
  // mprotect.
  Status set_access(std::byte* address, size_t bytes, Access access);

  // fstat's st_blocks * 512: the file's allocated bytes, counted once however many views map
  // them (RSS would count a page once per view).
  Result<size_t> resident_bytes(const Memory& memory, PhysicalMemoryId id) const;

 private:
  // Turns [address, address + bytes) back into PROT_NONE reservation.
  static Status restore_reservation(std::byte* address, size_t bytes);

  const size_t page_size_;
};

}  // namespace folio::device
