#include "folio/device/host/host_memory_primitives.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <limits>
#include <memory>

#include "folio/base/check.h"
#include "folio/device/host_virtual_memory.h"
#include "folio/device/tracked_virtual_memory.h"

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
      std::make_unique<TrackedVirtualMemory<HostMemoryPrimitives>>(static_cast<size_t>(page_size)));
}

HostMemoryPrimitives::HostMemoryPrimitives(size_t page_size) : page_size_(page_size) {
  FOLIO_CHECK(page_size > 0 && (page_size & (page_size - 1)) == 0,
              "page size {} is not a power of two", page_size);
}

Status HostMemoryPrimitives::restore_reservation(std::byte* address, size_t bytes) {
  void* result = mmap(address, bytes, PROT_NONE, kReservationFlags | MAP_FIXED, -1, 0);
  if (result == MAP_FAILED) return mmap_status("restoring reservation after unmap");
  return Status::ok_status();
}

Result<std::byte*> HostMemoryPrimitives::reserve(size_t bytes) {
  void* base = mmap(nullptr, bytes, PROT_NONE, kReservationFlags, -1, 0);
  if (base == MAP_FAILED) {
    return mmap_status(fmt::format("reserving {} bytes of address space", bytes));
  }
  return static_cast<std::byte*>(base);
}

Status HostMemoryPrimitives::release_range(const AddressRange& range,
                                           const MappingTable& /*mappings*/) {
  // One call drops the reservation and every view in it, so there is no halfway point.
  if (munmap(range.base, range.size) != 0) {
    return errno_status("munmap", fmt::format("releasing address range {}", range.id));
  }
  return Status::ok_status();
}

Result<HostMemoryPrimitives::Memory> HostMemoryPrimitives::create(size_t bytes) {
  if (bytes > kMaxFileBytes) return invalid_argument("create: {} bytes is too large", bytes);
  const int fd = memfd_create("folio-physical-memory", MFD_CLOEXEC);
  if (fd < 0) return errno_status("memfd_create", "creating physical memory");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0) {
    Status status = errno_status("ftruncate/fallocate", fmt::format("allocating {} bytes", bytes));
    close(fd);
    return status;
  }
  return Memory{fd};
}

Status HostMemoryPrimitives::grow(Memory& memory, PhysicalMemoryId id, size_t old_bytes,
                                  size_t new_bytes) {
  if (new_bytes > kMaxFileBytes) return invalid_argument("grow: {} bytes is too large", new_bytes);
  if (new_bytes == old_bytes) return Status::ok_status();
  if (ftruncate(memory.fd, static_cast<off_t>(new_bytes)) != 0 ||
      fallocate(memory.fd, 0, static_cast<off_t>(old_bytes),
                static_cast<off_t>(new_bytes - old_bytes)) != 0) {
    Status status = errno_status(
        "ftruncate/fallocate",
        fmt::format("growing physical memory {} from {} to {} bytes", id, old_bytes, new_bytes));
    // Shrinking back frees whatever fallocate allocated past the old end; the bytes below it
    // (the ones views may map) are untouched.
    FOLIO_CHECK(ftruncate(memory.fd, static_cast<off_t>(old_bytes)) == 0,
                "cannot roll back a failed grow of physical memory {}", id);
    return status;
  }
  return Status::ok_status();
}

Status HostMemoryPrimitives::release_memory(const Memory& memory, PhysicalMemoryId id) {
  // Views keep the file alive through their own references; closing only drops ours.
  if (close(memory.fd) != 0) {
    return errno_status("close", fmt::format("releasing physical memory {}", id));
  }
  return Status::ok_status();
}

Status HostMemoryPrimitives::map(std::byte* address, const Memory& memory, PhysicalMemoryId id,
                                 size_t memory_offset, size_t bytes) {
  void* result = mmap(address, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, memory.fd,
                      static_cast<off_t>(memory_offset));
  if (result == MAP_FAILED) {
    Status status = mmap_status(fmt::format("mapping {} bytes of physical memory {}", bytes, id));
    // A failed MAP_FIXED may have removed the reservation underneath; put it back.
    restore_reservation(address, bytes).ignore();
    return status;
  }
  FOLIO_CHECK(result == address, "MAP_FIXED mapped at {} instead of {}", result,
              static_cast<void*>(address));
  return Status::ok_status();
}

Status HostMemoryPrimitives::unmap(std::byte* address, size_t bytes) {
  return restore_reservation(address, bytes);
}

Status HostMemoryPrimitives::set_access(std::byte* address, size_t bytes, Access access) {
  if (mprotect(address, bytes, protection_of(access)) != 0) {
    return errno_status("mprotect", fmt::format("setting access of {} bytes", bytes));
  }
  return Status::ok_status();
}

Result<size_t> HostMemoryPrimitives::resident_bytes(const Memory& memory,
                                                    PhysicalMemoryId id) const {
  struct stat file_status {};
  if (fstat(memory.fd, &file_status) != 0) {
    return errno_status("fstat", fmt::format("measuring physical memory {}", id));
  }
  // st_blocks is in 512-byte units whatever the file system's block size.
  return static_cast<size_t>(file_status.st_blocks) * 512;
}

}  // namespace folio::device
