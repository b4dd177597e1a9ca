#include "folio/device/host/host_virtual_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <limits>

#include "folio/base/check.h"
#include "folio/device/host_virtual_memory.h"

namespace folio::device {
namespace {

constexpr int kReservationFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

// The limit past which file sizes and offsets no longer fit off_t.
constexpr size_t kMaxFileBytes = static_cast<size_t>(std::numeric_limits<off_t>::max());

int protection_of(Access access) {
  switch (access) {
    case Access::kNone:
      return PROT_NONE;
    case Access::kReadWrite:
      return PROT_READ | PROT_WRITE;
  }
  FOLIO_UNREACHABLE("unknown Access {}", static_cast<int>(access));
}

// mmap's ENOMEM on a fixed mapping usually means the process hit vm.max_map_count (each view is
// a kernel mapping); say so, since it is the one thing the user can change.
Status mmap_status(std::string_view what) {
  const int error = errno;
  Status status = errno_status("mmap", what);
  if (error == ENOMEM) {
    return resource_exhausted("{} (out of memory or of kernel mappings; see vm.max_map_count)",
                              status.message());
  }
  return status;
}

}  // namespace

Result<std::unique_ptr<VirtualMemory>> make_host_virtual_memory() {
  const long page_size = sysconf(_SC_PAGESIZE);
  if (page_size <= 0) return errno_status("sysconf(_SC_PAGESIZE)", "reading the OS page size");
  return std::unique_ptr<VirtualMemory>(
      std::make_unique<HostVirtualMemory>(static_cast<size_t>(page_size)));
}

HostVirtualMemory::HostVirtualMemory(size_t page_size) : page_size_(page_size) {
  FOLIO_CHECK(page_size > 0 && (page_size & (page_size - 1)) == 0,
              "page size {} is not a power of two", page_size);
}

HostVirtualMemory::~HostVirtualMemory() {
  MutexLock lock(mutex_);
  for (auto& [id, range] : ranges_) munmap(range.base, range.size);
  for (auto& [id, memory] : memories_) close(memory.fd);
}

Result<HostVirtualMemory::RangeRecord*> HostVirtualMemory::find_range(const AddressRange& range,
                                                                      std::string_view verb) {
  auto it = ranges_.find(range.id);
  if (it == ranges_.end() || it->second.base != range.base || it->second.size != range.size) {
    return failed_precondition(
        "{}: address range {} is not live in this VirtualMemory (released already, or from "
        "another instance)",
        verb, range.id);
  }
  return &it->second;
}

Result<HostVirtualMemory::MemoryRecord*> HostVirtualMemory::find_memory(
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

Status HostVirtualMemory::restore_reservation(std::byte* address, size_t bytes) {
  void* result = mmap(address, bytes, PROT_NONE, kReservationFlags | MAP_FIXED, -1, 0);
  if (result == MAP_FAILED) return mmap_status("restoring reservation after unmap");
  return Status::ok_status();
}

Result<AddressRange> HostVirtualMemory::reserve(size_t bytes) {
  FOLIO_RETURN_IF_ERROR(check_granular_size(bytes, page_size_, "reserve"));
  void* base = mmap(nullptr, bytes, PROT_NONE, kReservationFlags, -1, 0);
  if (base == MAP_FAILED) {
    return mmap_status(fmt::format("reserving {} bytes of address space", bytes));
  }
  const AddressRange range{AddressRangeId(next_virtual_memory_handle_id()),
                           static_cast<std::byte*>(base), bytes};
  MutexLock lock(mutex_);
  ranges_.emplace(range.id, RangeRecord{range.base, range.size, MappingTable()});
  return range;
}

Status HostVirtualMemory::release(const AddressRange& range) {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(RangeRecord * record, find_range(range, "release(range)"));
  std::byte* base = record->base;
  const size_t size = record->size;
  ranges_.erase(range.id);
  // One call drops the reservation and every view in it, so there is no halfway point.
  if (munmap(base, size) != 0) {
    return errno_status("munmap", fmt::format("releasing address range {}", range.id));
  }
  return Status::ok_status();
}

Result<PhysicalMemory> HostVirtualMemory::create(size_t bytes) {
  FOLIO_RETURN_IF_ERROR(check_granular_size(bytes, page_size_, "create"));
  if (bytes > kMaxFileBytes) return invalid_argument("create: {} bytes is too large", bytes);
  const int fd = memfd_create("folio-physical-memory", MFD_CLOEXEC);
  if (fd < 0) return errno_status("memfd_create", "creating physical memory");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0) {
    Status status = errno_status("ftruncate/fallocate", fmt::format("allocating {} bytes", bytes));
    close(fd);
    return status;
  }
  const PhysicalMemory memory{PhysicalMemoryId(next_virtual_memory_handle_id()), bytes};
  MutexLock lock(mutex_);
  memories_.emplace(memory.id, MemoryRecord{fd, bytes});
  return memory;
}

Status HostVirtualMemory::grow(PhysicalMemory& memory, size_t new_bytes) {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(MemoryRecord * record, find_memory(memory, "grow"));
  FOLIO_RETURN_IF_ERROR(check_granular_size(new_bytes, page_size_, "grow"));
  if (new_bytes < record->size) {
    return invalid_argument("grow: new size {} is below the current size {}; memory never shrinks",
                            new_bytes, record->size);
  }
  if (new_bytes > kMaxFileBytes) return invalid_argument("grow: {} bytes is too large", new_bytes);
  const size_t old_bytes = record->size;
  if (new_bytes > old_bytes) {
    if (ftruncate(record->fd, static_cast<off_t>(new_bytes)) != 0 ||
        fallocate(record->fd, 0, static_cast<off_t>(old_bytes),
                  static_cast<off_t>(new_bytes - old_bytes)) != 0) {
      Status status = errno_status("ftruncate/fallocate",
                                   fmt::format("growing physical memory {} from {} to {} bytes",
                                               memory.id, old_bytes, new_bytes));
      // Shrinking back frees whatever fallocate allocated past the old end; the bytes below it
      // (the ones views may map) are untouched.
      FOLIO_CHECK(ftruncate(record->fd, static_cast<off_t>(old_bytes)) == 0,
                  "cannot roll back a failed grow of physical memory {}", memory.id);
      return status;
    }
  }
  record->size = new_bytes;
  memory.size = new_bytes;
  return Status::ok_status();
}

Status HostVirtualMemory::release(const PhysicalMemory& memory) {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(MemoryRecord * record, find_memory(memory, "release(memory)"));
  const int fd = record->fd;
  memories_.erase(memory.id);
  // Views keep the file alive through their own references; closing only drops ours.
  if (close(fd) != 0) {
    return errno_status("close", fmt::format("releasing physical memory {}", memory.id));
  }
  return Status::ok_status();
}

Status HostVirtualMemory::map(const AddressRange& range, size_t range_offset,
                              const PhysicalMemory& memory, size_t memory_offset, size_t bytes) {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(RangeRecord * range_record, find_range(range, "map"));
  FOLIO_ASSIGN_OR_RETURN(MemoryRecord * memory_record, find_memory(memory, "map"));
  FOLIO_RETURN_IF_ERROR(check_region(range_offset, bytes, range_record->size, page_size_,
                                     "map: region of the address range"));
  FOLIO_RETURN_IF_ERROR(check_region(memory_offset, bytes, memory_record->size, page_size_,
                                     "map: region of the physical memory"));
  if (!range_record->mappings.is_unmapped(range_offset, bytes)) {
    return invalid_argument(
        "map: [{}, {}) of address range {} is already mapped, in part or whole; unmap it first",
        range_offset, range_offset + bytes, range.id);
  }
  std::byte* address = range_record->base + range_offset;
  void* result = mmap(address, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                      memory_record->fd, static_cast<off_t>(memory_offset));
  if (result == MAP_FAILED) {
    Status status =
        mmap_status(fmt::format("mapping {} bytes of physical memory {}", bytes, memory.id));
    // A failed MAP_FIXED may have removed the reservation underneath; put it back.
    restore_reservation(address, bytes).ignore();
    return status;
  }
  FOLIO_CHECK(result == address, "MAP_FIXED mapped at {} instead of {}", result,
              static_cast<void*>(address));
  range_record->mappings.insert(Mapping{range_offset, bytes, memory.id, memory_offset});
  return Status::ok_status();
}

Status HostVirtualMemory::unmap(const AddressRange& range, size_t range_offset, size_t bytes) {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(RangeRecord * record, find_range(range, "unmap"));
  FOLIO_RETURN_IF_ERROR(check_region(range_offset, bytes, record->size, page_size_, "unmap"));
  if (!record->mappings.is_fully_mapped(range_offset, bytes)) {
    return invalid_argument("unmap: [{}, {}) of address range {} is not fully mapped", range_offset,
                            range_offset + bytes, range.id);
  }
  FOLIO_RETURN_IF_ERROR(restore_reservation(record->base + range_offset, bytes));
  record->mappings.erase(range_offset, bytes);
  return Status::ok_status();
}

Status HostVirtualMemory::set_access(const AddressRange& range, size_t range_offset, size_t bytes,
                                     Access access) {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(RangeRecord * record, find_range(range, "set_access"));
  FOLIO_RETURN_IF_ERROR(check_region(range_offset, bytes, record->size, page_size_, "set_access"));
  // Opening up unmapped reservation would turn it into private zero pages; refuse.
  if (!record->mappings.is_fully_mapped(range_offset, bytes)) {
    return invalid_argument("set_access: [{}, {}) of address range {} is not fully mapped",
                            range_offset, range_offset + bytes, range.id);
  }
  if (mprotect(record->base + range_offset, bytes, protection_of(access)) != 0) {
    return errno_status("mprotect", fmt::format("setting access of {} bytes", bytes));
  }
  return Status::ok_status();
}

Result<size_t> HostVirtualMemory::resident_bytes(const PhysicalMemory& memory) const {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(MemoryRecord * record, find_memory(memory, "resident_bytes"));
  struct stat file_status {};
  if (fstat(record->fd, &file_status) != 0) {
    return errno_status("fstat", fmt::format("measuring physical memory {}", memory.id));
  }
  // st_blocks is in 512-byte units whatever the file system's block size.
  return static_cast<size_t>(file_status.st_blocks) * 512;
}

}  // namespace folio::device
