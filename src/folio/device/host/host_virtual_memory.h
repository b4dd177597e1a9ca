// HostVirtualMemory: VirtualMemory on Linux, one-to-one onto system calls.
//
// - reserve: mmap(PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE): address space with no
//   memory and no commit charge; touching it faults.
// - create / grow: memfd_create + ftruncate + fallocate. The bytes are allocated at create (and
//   grow) time, as cuMemCreate does on a GPU, so running out of memory is a Status from create
//   and never a SIGBUS on first touch later. resident_bytes() is fstat's st_blocks * 512: the
//   file's allocated bytes, counted once however many views map them.
// - map: mmap(MAP_SHARED | MAP_FIXED) of the memfd over the reserved region; every view of the
//   same file offset is the same physical page.
// - unmap: mmap(PROT_NONE, MAP_FIXED | MAP_NORESERVE) over the region. It replaces the view
//   with reservation in one call, so the region never becomes a hole another mmap could take.
// - release of a range: munmap of the whole reservation, which drops every view in it at once.
// - release of a memory: close() of the memfd at once. Each mmap holds its own reference to the
//   file, so the bytes stay valid through existing views and are freed when the last goes.
//
// Thread-safety: every method may be called from any thread. One mutex guards the handle tables
// and is held across the system calls of a verb, so the tables and the kernel's view of the
// address space change together; verbs on different ranges therefore serialize (each is a few
// microseconds of system call).
//
// Invariants (under mutex_): every live range's base..base+size is a reservation owned by this
// object; each region its MappingTable lists is a MAP_SHARED view of a memfd and every other
// page of it is PROT_NONE reservation; every live memory's fd is open with size `size` bytes,
// all allocated.
#pragma once

#include <cstddef>
#include <unordered_map>

#include "folio/base/mutex.h"
#include "folio/device/mapping_table.h"
#include "folio/device/virtual_memory.h"

namespace folio::device {

class HostVirtualMemory final : public VirtualMemory {
 public:
  // Requires: page_size is a power of two (the OS page size).
  explicit HostVirtualMemory(size_t page_size);
  // Releases every range and memory still live.
  ~HostVirtualMemory() override;
  HostVirtualMemory(const HostVirtualMemory&) = delete;
  HostVirtualMemory& operator=(const HostVirtualMemory&) = delete;

  DeviceKind kind() const override { return DeviceKind::kHost; }
  size_t granularity() const override { return page_size_; }

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

 private:
  struct RangeRecord {
    std::byte* base = nullptr;
    size_t size = 0;
    MappingTable mappings;
  };
  struct MemoryRecord {
    int fd = -1;
    size_t size = 0;
  };

  // kFailedPrecondition unless `range` is live here with the same base and size. Requires: mutex_.
  Result<RangeRecord*> find_range(const AddressRange& range, std::string_view verb)
      FOLIO_REQUIRES(mutex_);
  Result<MemoryRecord*> find_memory(const PhysicalMemory& memory, std::string_view verb) const
      FOLIO_REQUIRES(mutex_);
  // Turns [address, address + bytes) back into PROT_NONE reservation.
  static Status restore_reservation(std::byte* address, size_t bytes);

  const size_t page_size_;
  mutable Mutex mutex_;
  std::unordered_map<AddressRangeId, RangeRecord> ranges_ FOLIO_GUARDED_BY(mutex_);
  std::unordered_map<PhysicalMemoryId, MemoryRecord> memories_ FOLIO_GUARDED_BY(mutex_);
};

}  // namespace folio::device
