#include "folio/exec/multi_shape_arena.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "folio/base/log.h"
#include "folio/exec/host_buffer.h"

namespace folio::exec {

MultiShapeArena::MultiShapeArena(std::unique_ptr<ArenaMemorySource> source, ArenaSharing sharing)
    : sharing_(sharing), granule_(source->granule()), source_(std::move(source)) {}

std::unique_ptr<MultiShapeArena> MultiShapeArena::create(std::unique_ptr<ArenaMemorySource> source,
                                                         ArenaSharing sharing) {
  FOLIO_CHECK(source != nullptr, "graph arena without a memory source");
  return std::unique_ptr<MultiShapeArena>(new MultiShapeArena(std::move(source), sharing));
}

MultiShapeArena::~MultiShapeArena() {
  FOLIO_CHECK(users_ == 0, "graph arena destroyed while {} executors still use it", users_);
  for (const device::AddressRange& range : ranges_) {
    const Status released = source_->virtual_memory().release(range);
    if (!released.ok()) log::warn("graph arena: releasing a view failed: {}", released.to_string());
  }
  source_.reset();
}

Result<std::vector<PhysicalRun>> MultiShapeArena::runs_for_view(size_t bytes) {
  switch (sharing_) {
    case ArenaSharing::kShared: {
      // Grow the one physical arena to the view's size; a smaller view maps a prefix of it.
      if (physical_bytes_ < bytes) {
        FOLIO_ASSIGN_OR_RETURN(PhysicalRun run, source_->acquire(bytes - physical_bytes_));
        shared_runs_.push_back(run);
        physical_bytes_ += run.bytes;
      }
      return shared_runs_;
    }
    case ArenaSharing::kPrivatePerView: {
      FOLIO_ASSIGN_OR_RETURN(PhysicalRun run, source_->acquire(bytes));
      physical_bytes_ += run.bytes;
      return std::vector<PhysicalRun>{run};
    }
  }
  return internal_error("unknown arena sharing mode");
}

Result<ArenaView> MultiShapeArena::map_view(const std::vector<PhysicalRun>& runs, size_t bytes) {
  device::VirtualMemory& vm = source_->virtual_memory();
  FOLIO_ASSIGN_OR_RETURN(const device::AddressRange range, vm.reserve(bytes));
  size_t mapped = 0;
  for (const PhysicalRun& run : runs) {
    if (mapped == bytes) break;
    const size_t length = std::min(run.bytes, bytes - mapped);
    const Status status = vm.map(range, mapped, run.memory, run.offset, length);
    if (!status.ok()) {
      const Status released = vm.release(range);  // unmaps what this view mapped so far
      if (!released.ok()) log::warn("graph arena: {}", released.to_string());
      return status.with_context("mapping a graph arena view");
    }
    mapped += length;
  }
  FOLIO_CHECK(mapped == bytes, "graph arena view of {} bytes found only {} physical bytes", bytes,
              mapped);
  ranges_.push_back(range);
  return ArenaView{range.base, bytes, static_cast<int32_t>(views_.size())};
}

Result<ArenaView> MultiShapeArena::create_view(size_t bytes) {
  MutexLock lock(state_mutex_);
  if (bytes == 0) {
    views_.push_back(ArenaView{nullptr, 0, static_cast<int32_t>(views_.size())});
    return views_.back();
  }
  const size_t rounded = round_up(bytes, granule_);
  FOLIO_ASSIGN_OR_RETURN(const std::vector<PhysicalRun> runs, runs_for_view(rounded));
  FOLIO_ASSIGN_OR_RETURN(const ArenaView view, map_view(runs, rounded));
  views_.push_back(view);
  return view;
}

ArenaReplayLock MultiShapeArena::lock_for_replay() const {
  std::unique_lock<std::mutex> lock(replay_mutex_);
  replays_.fetch_add(1, std::memory_order_relaxed);
  return ArenaReplayLock(std::move(lock), this);
}

ArenaStats MultiShapeArena::stats() const {
  MutexLock lock(state_mutex_);
  ArenaStats stats;
  stats.num_views = static_cast<int32_t>(views_.size());
  stats.physical_bytes = physical_bytes_;
  for (const ArenaView& view : views_) {
    stats.virtual_bytes += view.bytes;
    stats.largest_view_bytes = std::max(stats.largest_view_bytes, view.bytes);
  }
  stats.replays = replays_.load(std::memory_order_relaxed);
  return stats;
}

Result<size_t> MultiShapeArena::measured_physical_bytes() const {
  MutexLock lock(state_mutex_);
  return source_->measured_bytes();
}

std::vector<ArenaView> MultiShapeArena::views() const {
  MutexLock lock(state_mutex_);
  return views_;
}

void MultiShapeArena::scribble(uint64_t seed) {
  const ArenaReplayLock replay = lock_for_replay();
  MutexLock lock(state_mutex_);
  std::mt19937_64 random(seed);
  for (const ArenaView& view : views_) {
    for (size_t offset = 0; offset + sizeof(uint64_t) <= view.bytes; offset += sizeof(uint64_t)) {
      const uint64_t word = random();
      std::memcpy(view.base + offset, &word, sizeof(word));
    }
  }
}

void MultiShapeArena::attach() {
  MutexLock lock(state_mutex_);
  ++users_;
}

void MultiShapeArena::detach() {
  MutexLock lock(state_mutex_);
  FOLIO_CHECK(users_ > 0, "graph arena detached more often than attached");
  --users_;
}

}  // namespace folio::exec
