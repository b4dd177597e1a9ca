// TrackedVirtualMemory: the one VirtualMemory implementation, shared by every backend. It keeps
// all the bookkeeping the contract in virtual_memory.h asks for (the tables of live ranges and
// physical memories keyed by handle id, a MappingTable per range, the argument and liveness
// checks, the mutex) and leaves to a backend only what the OS or the driver has to do. So every
// backend refuses the same bad calls with the same messages before any system or driver call,
// and a new backend writes its calls and nothing else.
//
// Terms: a backend's Primitives are its OS or driver verbs on raw addresses and on its own
// handles for one physical memory (Primitives::Memory): host/host_memory_primitives.h (memfd +
// mmap) and cuda/cuda_memory_primitives.h (cuMem*). Primitives keep no tables and check nothing
// the tables can; the concept VirtualMemoryPrimitives below lists them with the rules each keeps.
// Each verb's primitive calls run inside a Primitives::CallScope (CUDA: the device's primary
// context made current on the calling thread), opened after the checks pass.
//
// Thread-safety: every method may be called from any thread. One mutex guards the tables and is
// held across the primitives a verb calls, so the tables and the real address space change
// together; verbs on one instance serialize (control-path calls of a few microseconds each).
//
// Invariants (under mutex_): every live range's [base, base + size) is a reservation made by
// primitives_.reserve and not yet released, and the regions its MappingTable lists are the ones
// mapped in it; every live memory's `memory` holds `size` bytes, allocated. Ids come from
// next_virtual_memory_handle_id(), so they are unique across instances.
#pragma once

#include <concepts>
#include <cstddef>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "folio/base/mutex.h"
#include "folio/base/result.h"
#include "folio/base/status.h"
#include "folio/base/thread_annotations.h"
#include "folio/device/mapping_table.h"
#include "folio/device/virtual_memory.h"

namespace folio::device {

// What a backend supplies. Every call but resident_bytes runs under TrackedVirtualMemory's mutex
// inside a CallScope; sizes and offsets are already checked (granular, inside their range and
// memory, the region unmapped for map and fully mapped for unmap and set_access), and the ids
// passed serve only to name the handle in error messages.
// - kKind: the DeviceKind this backend serves.
// - kForgetRegionOnFailedUnmap: whether the table drops a region whose unmap failed (true when
//   unmap goes on past failures, so part of the region may be unmapped already).
// - Memory: the backend's handles for one physical memory.
// - CallScope(primitives): opened around a verb's calls; status() says whether it could be.
// - reserve(bytes): address space, nothing accessible.
// - release_range(range, mappings): drops every listed mapping and the reservation; never stops
//   halfway (goes on past failures, returns the first).
// - create(bytes): a Memory of `bytes`, allocated now; on failure nothing is left behind.
// - grow(memory, id, old_bytes, new_bytes): new_bytes >= old_bytes; mapped bytes stay valid; on
//   failure `memory` is as before.
// - release_memory(memory, id): drops the handles; mapped bytes live until their last view goes.
// - map(address, memory, id, memory_offset, bytes): a read-write view of the memory's bytes at
//   `address`; on failure the region is reservation again.
// - unmap(address, bytes): the region back to reservation.
// - set_access(address, bytes, access): access of a mapped region.
// - resident_bytes(memory, id): the physical bytes backing `memory` now.
template <typename P>
concept VirtualMemoryPrimitives = requires(P& primitives, const P& const_primitives,
                                           typename P::Memory& memory,
                                           const typename P::Memory& const_memory,
                                           const AddressRange& range, const MappingTable& mappings,
                                           std::byte* address, size_t bytes, PhysicalMemoryId id,
                                           Access access) {
  { P::kKind } -> std::convertible_to<DeviceKind>;
  { P::kForgetRegionOnFailedUnmap } -> std::convertible_to<bool>;
  { typename P::CallScope(const_primitives).status() } -> std::convertible_to<Status>;
  { const_primitives.granularity() } -> std::same_as<size_t>;
  { primitives.reserve(bytes) } -> std::same_as<Result<std::byte*>>;
  { primitives.release_range(range, mappings) } -> std::same_as<Status>;
  { primitives.create(bytes) } -> std::same_as<Result<typename P::Memory>>;
  { primitives.grow(memory, id, bytes, bytes) } -> std::same_as<Status>;
  { primitives.release_memory(const_memory, id) } -> std::same_as<Status>;
  { primitives.map(address, const_memory, id, bytes, bytes) } -> std::same_as<Status>;
  { primitives.unmap(address, bytes) } -> std::same_as<Status>;
  { primitives.set_access(address, bytes, access) } -> std::same_as<Status>;
  { const_primitives.resident_bytes(const_memory, id) } -> std::same_as<Result<size_t>>;
};

template <VirtualMemoryPrimitives Primitives>
class TrackedVirtualMemory final : public VirtualMemory {
 public:
  // Builds the Primitives in place from `args` (they may own a resource, such as CUDA's retained
  // primary context, that must not be copied).
  template <typename... Args>
  requires std::constructible_from<Primitives, Args...>
  explicit TrackedVirtualMemory(Args&&... args) : primitives_(std::forward<Args>(args)...) {}
  // Releases every range and memory still live (errors ignored), then the Primitives.
  ~TrackedVirtualMemory() override;
  TrackedVirtualMemory(const TrackedVirtualMemory&) = delete;
  TrackedVirtualMemory& operator=(const TrackedVirtualMemory&) = delete;

  DeviceKind kind() const override { return Primitives::kKind; }
  size_t granularity() const override { return primitives_.granularity(); }

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

  // The backend, for callers that need its native handles (e.g. the CUDA device and context).
  const Primitives& primitives() const { return primitives_; }

 private:
  using CallScope = typename Primitives::CallScope;
  struct RangeRecord {
    std::byte* base = nullptr;
    size_t size = 0;
    MappingTable mappings;
  };
  struct MemoryRecord {
    typename Primitives::Memory memory;
    size_t size = 0;
  };

  // kFailedPrecondition unless `range` is live here with the same base and size.
  Result<RangeRecord*> find_range(const AddressRange& range, std::string_view verb)
      FOLIO_REQUIRES(mutex_);
  // kFailedPrecondition unless `memory` is live here.
  Result<MemoryRecord*> find_memory(const PhysicalMemory& memory, std::string_view verb) const
      FOLIO_REQUIRES(mutex_);

  Primitives primitives_;
  mutable Mutex mutex_;
  std::unordered_map<AddressRangeId, RangeRecord> ranges_ FOLIO_GUARDED_BY(mutex_);
  std::unordered_map<PhysicalMemoryId, MemoryRecord> memories_ FOLIO_GUARDED_BY(mutex_);
};

template <VirtualMemoryPrimitives Primitives>
TrackedVirtualMemory<Primitives>::~TrackedVirtualMemory() {
  MutexLock lock(mutex_);
  // Released even when the scope cannot be opened: nothing else would release them.
  CallScope scope(primitives_);
  for (auto& [id, range] : ranges_) {
    primitives_.release_range(AddressRange{id, range.base, range.size}, range.mappings).ignore();
  }
  for (auto& [id, memory] : memories_) primitives_.release_memory(memory.memory, id).ignore();
}

template <VirtualMemoryPrimitives Primitives>
auto TrackedVirtualMemory<Primitives>::find_range(const AddressRange& range, std::string_view verb)
    -> Result<RangeRecord*> {
  auto it = ranges_.find(range.id);
  if (it == ranges_.end() || it->second.base != range.base || it->second.size != range.size) {
    return failed_precondition(
        "{}: address range {} is not live in this VirtualMemory (released already, or from "
        "another instance)",
        verb, range.id);
  }
  return &it->second;
}

template <VirtualMemoryPrimitives Primitives>
auto TrackedVirtualMemory<Primitives>::find_memory(const PhysicalMemory& memory,
                                                   std::string_view verb) const
    -> Result<MemoryRecord*> {
  auto it = memories_.find(memory.id);
  if (it == memories_.end()) {
    return failed_precondition(
        "{}: physical memory {} is not live in this VirtualMemory (released already, or from "
        "another instance)",
        verb, memory.id);
  }
  // One lookup serves const and non-const verbs; the const ones only read the record.
  return const_cast<MemoryRecord*>(&it->second);
}

template <VirtualMemoryPrimitives Primitives>
Result<AddressRange> TrackedVirtualMemory<Primitives>::reserve(size_t bytes) {
  FOLIO_RETURN_IF_ERROR(check_granular_size(bytes, granularity(), "reserve"));
  MutexLock lock(mutex_);
  CallScope scope(primitives_);
  FOLIO_RETURN_IF_ERROR(scope.status());
  FOLIO_ASSIGN_OR_RETURN(std::byte * base, primitives_.reserve(bytes));
  const AddressRange range{AddressRangeId(next_virtual_memory_handle_id()), base, bytes};
  ranges_.emplace(range.id, RangeRecord{range.base, range.size, MappingTable()});
  return range;
}

template <VirtualMemoryPrimitives Primitives>
Status TrackedVirtualMemory<Primitives>::release(const AddressRange& range) {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(RangeRecord * record, find_range(range, "release(range)"));
  CallScope scope(primitives_);
  FOLIO_RETURN_IF_ERROR(scope.status());
  // The handle goes whatever the primitives report: release never stops halfway, and a range
  // left in the table after a partial release could never be released again.
  const Status status = primitives_.release_range(range, record->mappings);
  ranges_.erase(range.id);
  return status;
}

template <VirtualMemoryPrimitives Primitives>
Result<PhysicalMemory> TrackedVirtualMemory<Primitives>::create(size_t bytes) {
  FOLIO_RETURN_IF_ERROR(check_granular_size(bytes, granularity(), "create"));
  MutexLock lock(mutex_);
  CallScope scope(primitives_);
  FOLIO_RETURN_IF_ERROR(scope.status());
  FOLIO_ASSIGN_OR_RETURN(typename Primitives::Memory native, primitives_.create(bytes));
  const PhysicalMemory memory{PhysicalMemoryId(next_virtual_memory_handle_id()), bytes};
  memories_.emplace(memory.id, MemoryRecord{std::move(native), bytes});
  return memory;
}

template <VirtualMemoryPrimitives Primitives>
Status TrackedVirtualMemory<Primitives>::grow(PhysicalMemory& memory, size_t new_bytes) {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(MemoryRecord * record, find_memory(memory, "grow"));
  FOLIO_RETURN_IF_ERROR(check_granular_size(new_bytes, granularity(), "grow"));
  if (new_bytes < record->size) {
    return invalid_argument("grow: new size {} is below the current size {}; memory never shrinks",
                            new_bytes, record->size);
  }
  CallScope scope(primitives_);
  FOLIO_RETURN_IF_ERROR(scope.status());
  FOLIO_RETURN_IF_ERROR(primitives_.grow(record->memory, memory.id, record->size, new_bytes));
  record->size = new_bytes;
  memory.size = new_bytes;
  return Status::ok_status();
}

template <VirtualMemoryPrimitives Primitives>
Status TrackedVirtualMemory<Primitives>::release(const PhysicalMemory& memory) {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(MemoryRecord * record, find_memory(memory, "release(memory)"));
  CallScope scope(primitives_);
  FOLIO_RETURN_IF_ERROR(scope.status());
  const Status status = primitives_.release_memory(record->memory, memory.id);
  memories_.erase(memory.id);
  return status;
}

template <VirtualMemoryPrimitives Primitives>
Status TrackedVirtualMemory<Primitives>::map(const AddressRange& range, size_t range_offset,
                                             const PhysicalMemory& memory, size_t memory_offset,
                                             size_t bytes) {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(RangeRecord * range_record, find_range(range, "map"));
  FOLIO_ASSIGN_OR_RETURN(MemoryRecord * memory_record, find_memory(memory, "map"));
  FOLIO_RETURN_IF_ERROR(check_region(range_offset, bytes, range_record->size, granularity(),
                                     "map: region of the address range"));
  FOLIO_RETURN_IF_ERROR(check_region(memory_offset, bytes, memory_record->size, granularity(),
                                     "map: region of the physical memory"));
  if (!range_record->mappings.is_unmapped(range_offset, bytes)) {
    return invalid_argument(
        "map: [{}, {}) of address range {} is already mapped, in part or whole; unmap it first",
        range_offset, range_offset + bytes, range.id);
  }
  CallScope scope(primitives_);
  FOLIO_RETURN_IF_ERROR(scope.status());
  FOLIO_RETURN_IF_ERROR(primitives_.map(range_record->base + range_offset, memory_record->memory,
                                        memory.id, memory_offset, bytes));
  range_record->mappings.insert(Mapping{range_offset, bytes, memory.id, memory_offset});
  return Status::ok_status();
}

template <VirtualMemoryPrimitives Primitives>
Status TrackedVirtualMemory<Primitives>::unmap(const AddressRange& range, size_t range_offset,
                                               size_t bytes) {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(RangeRecord * record, find_range(range, "unmap"));
  FOLIO_RETURN_IF_ERROR(check_region(range_offset, bytes, record->size, granularity(), "unmap"));
  if (!record->mappings.is_fully_mapped(range_offset, bytes)) {
    return invalid_argument("unmap: [{}, {}) of address range {} is not fully mapped", range_offset,
                            range_offset + bytes, range.id);
  }
  CallScope scope(primitives_);
  FOLIO_RETURN_IF_ERROR(scope.status());
  const Status status = primitives_.unmap(record->base + range_offset, bytes);
  // When the backend may have unmapped part of the region before failing, the table forgets all
  // of it: the error is reported, and a later map of a granule still mapped fails in the OS or
  // driver rather than in the table.
  if (status.ok() || Primitives::kForgetRegionOnFailedUnmap) {
    record->mappings.erase(range_offset, bytes);
  }
  return status;
}

template <VirtualMemoryPrimitives Primitives>
Status TrackedVirtualMemory<Primitives>::set_access(const AddressRange& range, size_t range_offset,
                                                    size_t bytes, Access access) {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(RangeRecord * record, find_range(range, "set_access"));
  FOLIO_RETURN_IF_ERROR(
      check_region(range_offset, bytes, record->size, granularity(), "set_access"));
  // Opening up unmapped reservation would make memory appear where nothing is mapped; refuse.
  if (!record->mappings.is_fully_mapped(range_offset, bytes)) {
    return invalid_argument("set_access: [{}, {}) of address range {} is not fully mapped",
                            range_offset, range_offset + bytes, range.id);
  }
  CallScope scope(primitives_);
  FOLIO_RETURN_IF_ERROR(scope.status());
  return primitives_.set_access(record->base + range_offset, bytes, access);
}

template <VirtualMemoryPrimitives Primitives>
Result<size_t> TrackedVirtualMemory<Primitives>::resident_bytes(
    const PhysicalMemory& memory) const {
  MutexLock lock(mutex_);
  FOLIO_ASSIGN_OR_RETURN(MemoryRecord * record, find_memory(memory, "resident_bytes"));
  // No CallScope: neither backend needs the device to say what it allocated.
  return primitives_.resident_bytes(record->memory, memory.id);
}

}  // namespace folio::device
