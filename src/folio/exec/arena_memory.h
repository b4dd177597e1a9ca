// ArenaMemorySource: where a graph arena's physical memory comes from. The arena asks for runs
// of physical memory (bytes with no address, device/virtual_memory.h) and maps them into a
// fresh virtual view per capture; the source only hands runs out and measures what it holds.
//
// Two sources:
// - PoolArenaMemory: pages of the unified page pool, allocated with content type kGraphArena
//   and kept pinned (the one memory budget: DESIGN.md, "two granularities, one budget"). A run
//   is one contiguous allocation; its physical bytes are the pool's PhysicalMemory at
//   physical_offset(first page); release() frees it. The pool commits its whole budget up front, so
//   the operating system cannot tell which pages an arena holds: measured_bytes() is the pool's own
//   count of graph-arena pages in use.
// - DedicatedArenaMemory: a PhysicalMemory of its own per run (on the host a memfd, fully
//   allocated at creation). measured_bytes() asks the operating system (fstat blocks of each
//   memfd, which count a byte once however many views map it): the honest physical measurement
//   the arena tests assert on, and the baseline's memory (one private arena per capture).
//
// Thread-safety: a source is used by one arena, under the arena's mutex.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "folio/base/result.h"
#include "folio/device/virtual_memory.h"
#include "folio/memory/page_pool.h"

namespace folio::exec {

// [offset, offset + bytes) of `memory`.
struct PhysicalRun {
  device::PhysicalMemory memory;
  size_t offset = 0;
  size_t bytes = 0;
};

class ArenaMemorySource {
 public:
  virtual ~ArenaMemorySource() = default;

  virtual device::VirtualMemory& virtual_memory() const = 0;
  // Runs are multiples of this many bytes (a multiple of the VirtualMemory's granularity).
  virtual size_t granule() const = 0;
  // One run of `bytes` (a positive multiple of granule()) that nothing else uses; it stays held
  // until release(run) or the source is destroyed. kResourceExhausted when the memory is not
  // there.
  virtual Result<PhysicalRun> acquire(size_t bytes) = 0;
  // Gives a run acquire() returned back (whole; nothing may map it any more).
  // kInvalidArgument for a run this source does not hold.
  virtual Status release(const PhysicalRun& run) = 0;
  // Physical bytes held, measured by the owner of the memory (see above), not by the arena.
  virtual Result<size_t> measured_bytes() const = 0;
};

class PoolArenaMemory final : public ArenaMemorySource {
 public:
  // `pool` must outlive the source. `owner` is recorded on the pool's allocations.
  PoolArenaMemory(memory::PagePool& pool, uint64_t owner) : pool_(pool), owner_(owner) {}

  device::VirtualMemory& virtual_memory() const override { return pool_.virtual_memory(); }
  size_t granule() const override { return pool_.page_size(); }
  Result<PhysicalRun> acquire(size_t bytes) override;
  // Frees the run's pool allocation.
  Status release(const PhysicalRun& run) override;
  // The pool's graph-arena pages in use times the page size: exact when this is the pool's only
  // graph arena.
  Result<size_t> measured_bytes() const override;

 private:
  memory::PagePool& pool_;
  const uint64_t owner_;
  std::vector<memory::PageAllocation> allocations_;  // pinned; freed by release or with the source
};

class DedicatedArenaMemory final : public ArenaMemorySource {
 public:
  // `vm` must outlive the source.
  explicit DedicatedArenaMemory(device::VirtualMemory& vm) : vm_(vm) {}
  ~DedicatedArenaMemory() override;
  DedicatedArenaMemory(const DedicatedArenaMemory&) = delete;
  DedicatedArenaMemory& operator=(const DedicatedArenaMemory&) = delete;

  device::VirtualMemory& virtual_memory() const override { return vm_; }
  size_t granule() const override { return vm_.granularity(); }
  Result<PhysicalRun> acquire(size_t bytes) override;
  Status release(const PhysicalRun& run) override;
  // Sum of VirtualMemory::resident_bytes over the memories created (host: fstat blocks).
  Result<size_t> measured_bytes() const override;

 private:
  device::VirtualMemory& vm_;
  std::vector<device::PhysicalMemory> memories_;
};

}  // namespace folio::exec
