#include "folio/exec/arena_memory.h"

#include "folio/base/log.h"

namespace folio::exec {

Result<PhysicalRun> PoolArenaMemory::acquire(size_t bytes) {
  FOLIO_DCHECK(bytes > 0 && bytes % granule() == 0);
  memory::PageAllocationRequest request;
  request.num_pages = static_cast<int64_t>(bytes / granule());
  request.content = memory::ContentType::kGraphArena;
  // Pinned for the arena's lifetime: captured programs hold addresses into these pages, so the
  // pool must never evict them behind the programs' backs.
  request.pinned = true;
  request.owner = owner_;
  if (request.num_pages > pool_.num_pages()) {
    // Larger than the whole budget: no capacity, now or later, but not a malformed request.
    return resource_exhausted("graph arena needs {} more pages; the page pool '{}' has {} in all",
                              request.num_pages, pool_.options().name, pool_.num_pages());
  }
  Result<memory::PageAllocation> allocation = pool_.allocate(request);
  if (!allocation.ok()) {
    return allocation.status().with_context(
        fmt::format("graph arena needs {} more pages of the page pool", request.num_pages));
  }
  const PhysicalRun run{pool_.physical_memory(), pool_.physical_offset(allocation->first_page()),
                        bytes};
  allocations_.push_back(std::move(allocation).value());
  return run;
}

Status PoolArenaMemory::release(const PhysicalRun& run) {
  for (auto it = allocations_.begin(); it != allocations_.end(); ++it) {
    if (pool_.physical_offset(it->first_page()) != run.offset) continue;
    FOLIO_CHECK(it->size_bytes() == run.bytes, "graph arena run of {} bytes released as {}",
                it->size_bytes(), run.bytes);
    const Status freed = it->free();
    allocations_.erase(it);
    return freed;
  }
  return invalid_argument("graph arena: no pool run at physical offset {} to release", run.offset);
}

Result<size_t> PoolArenaMemory::measured_bytes() const {
  const memory::PoolStats stats = pool_.stats();
  const int64_t pages =
      stats
          .per_content[static_cast<size_t>(memory::content_index(memory::ContentType::kGraphArena))]
          .pages_in_use;
  return static_cast<size_t>(pages) * pool_.page_size();
}

DedicatedArenaMemory::~DedicatedArenaMemory() {
  for (const device::PhysicalMemory& memory : memories_) {
    const Status released = vm_.release(memory);
    if (!released.ok())
      log::warn("graph arena: releasing its memory failed: {}", released.to_string());
  }
}

Result<PhysicalRun> DedicatedArenaMemory::acquire(size_t bytes) {
  FOLIO_DCHECK(bytes > 0 && bytes % granule() == 0);
  FOLIO_ASSIGN_OR_RETURN(device::PhysicalMemory memory, vm_.create(bytes));
  memories_.push_back(memory);
  return PhysicalRun{memory, 0, bytes};
}

Status DedicatedArenaMemory::release(const PhysicalRun& run) {
  for (auto it = memories_.begin(); it != memories_.end(); ++it) {
    if (it->id != run.memory.id) continue;
    const Status released = vm_.release(*it);
    memories_.erase(it);
    return released;
  }
  return invalid_argument("graph arena: no dedicated memory {} to release", run.memory.id);
}

Result<size_t> DedicatedArenaMemory::measured_bytes() const {
  size_t total = 0;
  for (const device::PhysicalMemory& memory : memories_) {
    FOLIO_ASSIGN_OR_RETURN(const size_t bytes, vm_.resident_bytes(memory));
    total += bytes;
  }
  return total;
}

}  // namespace folio::exec
