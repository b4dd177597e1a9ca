// VirtualMemory: the narrow set of virtual-memory verbs Folio's memory runtime is built on,
// with one implementation per device kind (host: memfd + mmap; CUDA: cuMem* driver API).
//
// Terms:
// - An AddressRange is reserved address space: no memory behind it until something is mapped.
// - A PhysicalMemory is memory with no address: bytes that exist once, and can be mapped into
//   any number of ranges at once (seed 000 §4: one physical arena, one virtual view per graph).
// - A mapping places [memory_offset, memory_offset + bytes) of a PhysicalMemory at
//   [range_offset, range_offset + bytes) of an AddressRange. Bytes written through one mapping
//   are read through every other mapping of the same physical bytes.
//
// Contract, for every implementation:
// - Sizes and offsets are multiples of granularity(); anything else is kInvalidArgument, as is
//   a region that overflows its range or memory, and mapping over an already mapped region.
//   unmap() and set_access() take any region whose every granule is mapped (it may span several
//   mappings, or part of one, which is then split); a region with an unmapped granule is
//   kInvalidArgument. grow() below the current size is kInvalidArgument.
// - A failing call leaves no leak and changes nothing: a create that fails halfway releases
//   what it made; a map that fails halfway unmaps what it mapped.
// - release() of a range unmaps everything still mapped in it and never stops halfway: it
//   continues past individual failures and reports the first. Releasing a physical memory
//   while mapped is allowed; its bytes live until the last mapping goes.
// - Using a released or foreign handle is kFailedPrecondition, never a crash. Handle ids are
//   unique across every VirtualMemory in the process, and a range whose base or size differs
//   from what reserve() returned counts as foreign.
// - A failure of the OS or the driver itself carries its error text; running out of memory (or,
//   on the host, out of kernel mappings) is kResourceExhausted.
// See docs/design/device.md for the full statement.
//
// Thread-safety: implementations are safe to call from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "folio/base/result.h"
#include "folio/base/status.h"
#include "folio/base/strong_id.h"

namespace folio::device {

enum class DeviceKind { kHost, kCuda };

struct AddressRangeIdTag {};
using AddressRangeId = StrongId<AddressRangeIdTag, int64_t>;
struct PhysicalMemoryIdTag {};
using PhysicalMemoryId = StrongId<PhysicalMemoryIdTag, int64_t>;

// Reserved address space. `base` is a host pointer for host memory and a device address for
// CUDA memory.
struct AddressRange {
  AddressRangeId id;
  std::byte* base = nullptr;
  size_t size = 0;
};

struct PhysicalMemory {
  PhysicalMemoryId id;
  size_t size = 0;
};

enum class Access { kNone, kReadWrite };

class VirtualMemory {
 public:
  virtual ~VirtualMemory() = default;

  virtual DeviceKind kind() const = 0;
  // Every size and offset passed in must be a multiple of this (host: the OS page; CUDA: the
  // allocation granularity, 2 MiB on current GPUs).
  virtual size_t granularity() const = 0;

  // Address space only; nothing is accessible until mapped.
  virtual Result<AddressRange> reserve(size_t bytes) = 0;
  virtual Status release(const AddressRange& range) = 0;

  virtual Result<PhysicalMemory> create(size_t bytes) = 0;
  // Grows `memory` to new_bytes (>= its size); existing mappings stay valid and keep their bytes.
  virtual Status grow(PhysicalMemory& memory, size_t new_bytes) = 0;
  virtual Status release(const PhysicalMemory& memory) = 0;

  // Maps with read-write access.
  virtual Status map(const AddressRange& range, size_t range_offset, const PhysicalMemory& memory,
                     size_t memory_offset, size_t bytes) = 0;
  virtual Status unmap(const AddressRange& range, size_t range_offset, size_t bytes) = 0;
  // Changes access of a mapped region (kNone turns a guard region into a fault on touch).
  virtual Status set_access(const AddressRange& range, size_t range_offset, size_t bytes,
                            Access access) = 0;

  // Physical bytes actually backing `memory` right now (host: allocated blocks of the memfd,
  // which counts each byte once however many views map it; CUDA: its created size).
  virtual Result<size_t> resident_bytes(const PhysicalMemory& memory) const = 0;
};

}  // namespace folio::device
