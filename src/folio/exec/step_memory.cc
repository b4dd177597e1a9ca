#include "folio/exec/step_memory.h"

#include <algorithm>
#include <cstring>

#include "folio/base/log.h"

namespace folio::exec {

Result<memory::PageAllocation> allocate_step_memory(memory::PagePool& pool, size_t bytes,
                                                    memory::ContentType content,
                                                    std::string_view purpose) {
  FOLIO_DCHECK(bytes > 0);
  memory::PageAllocationRequest request;
  request.num_pages = static_cast<int64_t>((bytes + pool.page_size() - 1) / pool.page_size());
  request.content = content;
  request.pinned = true;
  request.owner = kExecutorPoolOwner;
  if (request.num_pages > pool.num_pages()) {
    // Larger than the whole budget: no capacity, now or later, but not a malformed request.
    return resource_exhausted(
        "the executor needs {} pages ({} B) of the page pool '{}' for {}, but the pool has {} "
        "pages in all; raise the memory budget or lower the step size",
        request.num_pages, bytes, pool.options().name, purpose, pool.num_pages());
  }
  Result<memory::PageAllocation> allocation = pool.allocate(request);
  if (!allocation.ok()) {
    return allocation.status().with_context(
        fmt::format("the executor needs {} pages ({} B) of the page pool for {}", request.num_pages,
                    bytes, purpose));
  }
  // The bytes asked for start zeroed (the pages may hold a previous owner's data); the rest of
  // the last page is never read, and left untouched so that it costs no resident memory.
  std::memset(allocation->data(), 0, bytes);
  return allocation;
}

PoolRegion::~PoolRegion() {
  if (range_.base != nullptr) {
    // Unmaps every page before the pages go back to the pool (runs_ is destroyed after).
    const Status released = pool_.virtual_memory().release(range_);
    if (!released.ok()) log::warn("executor memory: {}", released.to_string());
  }
}

Status PoolRegion::append(memory::PageAllocation allocation) {
  FOLIO_RETURN_IF_ERROR(pool_.virtual_memory().map(range_, mapped_bytes_, pool_.physical_memory(),
                                                   pool_.physical_offset(allocation.first_page()),
                                                   allocation.size_bytes()));
  mapped_bytes_ += allocation.size_bytes();
  runs_.push_back(std::move(allocation));
  return Status();
}

Status PoolRegion::grow_to(size_t bytes) {
  const size_t page = pool_.page_size();
  const size_t target = round_up(bytes, page);
  if (target <= mapped_bytes_) return Status();
  const size_t pool_bytes = static_cast<size_t>(pool_.num_pages()) * page;
  const auto missing = static_cast<int64_t>((target - mapped_bytes_) / page);
  if (target > pool_bytes) {
    return resource_exhausted(
        "the executor needs {} B of the page pool '{}' for {}, but the pool has {} B in all; "
        "raise the memory budget or lower the step size",
        target, pool_.options().name, purpose_, pool_bytes);
  }
  if (range_.base == nullptr) {
    // As large as the pool: the region can never need more, and address space is cheap.
    FOLIO_ASSIGN_OR_RETURN(range_, pool_.virtual_memory().reserve(pool_bytes));
  }
  const size_t before = mapped_bytes_;
  memory::PageAllocationRequest request;
  request.content = content_;
  request.pinned = true;
  request.owner = kExecutorPoolOwner;
  // One run when the pool has a free one that long; otherwise single pages, which any free
  // page can give (asking for a long run would evict until one appears).
  const bool contiguous = missing == 1 || pool_.stats().largest_free_extent >= missing;
  const int64_t run_pages = contiguous ? missing : 1;
  for (int64_t taken = 0; taken < missing; taken += run_pages) {
    request.num_pages = run_pages;
    Result<memory::PageAllocation> run = pool_.allocate(request);
    Status status = run.ok() ? append(std::move(run).value()) : run.status();
    if (!status.ok()) {
      truncate_to(before);
      return status.with_context(
          fmt::format("the executor needs {} more pages ({} B) of the "
                      "page pool for {}",
                      missing, target - before, purpose_));
    }
  }
  std::memset(range_.base + before, 0, bytes - before);
  return Status();
}

void PoolRegion::truncate_to(size_t bytes) {
  while (!runs_.empty() && mapped_bytes_ - runs_.back().size_bytes() >= bytes) {
    const size_t run_bytes = runs_.back().size_bytes();
    const Status unmapped =
        pool_.virtual_memory().unmap(range_, mapped_bytes_ - run_bytes, run_bytes);
    FOLIO_CHECK(unmapped.ok(), "executor memory: unmapping {} B failed: {}", run_bytes,
                unmapped.to_string());
    mapped_bytes_ -= run_bytes;
    runs_.pop_back();  // frees the pages
  }
}

const OutputBuffers::Slot* OutputBuffers::slot(std::string_view name) const {
  for (const Slot& slot : slots_) {
    if (slot.name == name) return &slot;
  }
  return nullptr;
}

PoolSlice OutputBuffers::find(std::string_view name) const {
  const Slot* found = slot(name);
  if (found == nullptr) return PoolSlice();
  return PoolSlice(region_.data() + found->offset, found->bytes);
}

void OutputBuffers::truncate_to(size_t bytes) {
  region_.truncate_to(bytes);
  for (const Slot& slot : slots_) {
    if (slot.offset + slot.bytes > region_.size_bytes()) {
      slots_.clear();
      return;
    }
  }
}

Result<std::vector<std::byte*>> OutputBuffers::bind(const ir::Graph& graph, bool grow) {
  bool fits = true;
  for (const ir::TensorInfo& tensor : graph.tensors()) {
    if (tensor.residency != ir::Residency::kOutput) continue;
    const Slot* found = slot(tensor.name);
    const auto bytes = static_cast<size_t>(tensor.bytes());
    if (found != nullptr && found->bytes >= bytes) continue;
    if (!grow) {
      return invalid_argument(
          "output '{}' needs {} bytes but its persistent buffer, sized for the largest bucket, "
          "has {}",
          tensor.name, bytes, found == nullptr ? 0 : found->bytes);
    }
    fits = false;
  }
  if (!fits) {
    // Lay every buffer out again: the old ones at their sizes, grown where this graph needs more.
    std::vector<Slot> slots = slots_;
    for (const ir::TensorInfo& tensor : graph.tensors()) {
      if (tensor.residency != ir::Residency::kOutput) continue;
      const auto bytes = static_cast<size_t>(tensor.bytes());
      auto found = std::find_if(slots.begin(), slots.end(),
                                [&](const Slot& slot) { return slot.name == tensor.name; });
      if (found == slots.end()) {
        slots.push_back(Slot{tensor.name, 0, bytes});
      } else {
        found->bytes = std::max(found->bytes, bytes);
      }
    }
    SliceLayout layout;
    for (Slot& slot : slots) slot.offset = layout.add(slot.bytes);
    FOLIO_RETURN_IF_ERROR(region_.grow_to(layout.total()));
    slots_ = std::move(slots);
  }
  std::vector<std::byte*> addresses(static_cast<size_t>(graph.num_tensors()), nullptr);
  for (const ir::TensorInfo& tensor : graph.tensors()) {
    if (tensor.residency != ir::Residency::kOutput) continue;
    addresses[static_cast<size_t>(tensor.id.value())] = find(tensor.name).data();
  }
  return addresses;
}

}  // namespace folio::exec
