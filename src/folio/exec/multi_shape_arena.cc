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
  for (const ViewRecord& record : views_) {
    if (record.range.base == nullptr) continue;
    const Status released = source_->virtual_memory().release(record.range);
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

Result<MultiShapeArena::ViewRecord> MultiShapeArena::map_view(const std::vector<PhysicalRun>& runs,
                                                              size_t bytes) {
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
  ViewRecord record;
  record.view = ArenaView{range.base, bytes, next_view_index_++};
  record.range = range;
  return record;
}

Result<ArenaView> MultiShapeArena::create_view(size_t bytes) {
  MutexLock lock(state_mutex_);
  if (bytes == 0) {
    ViewRecord record;
    record.view = ArenaView{nullptr, 0, next_view_index_++};
    views_.push_back(record);
    return record.view;
  }
  const size_t rounded = round_up(bytes, granule_);
  FOLIO_ASSIGN_OR_RETURN(const std::vector<PhysicalRun> runs, runs_for_view(rounded));
  Result<ViewRecord> record = map_view(runs, rounded);
  if (!record.ok()) {
    if (sharing_ == ArenaSharing::kPrivatePerView) {
      // The run acquired for this view serves no other: give it back.
      physical_bytes_ -= runs.front().bytes;
      const Status released = source_->release(runs.front());
      if (!released.ok()) log::warn("graph arena: {}", released.to_string());
    }
    return record.status();
  }
  if (sharing_ == ArenaSharing::kPrivatePerView) record->private_run = runs.front();
  views_.push_back(*record);
  return record->view;
}

Status MultiShapeArena::release_view(const ArenaView& view) {
  MutexLock lock(state_mutex_);
  const auto found = std::find_if(views_.begin(), views_.end(), [&](const ViewRecord& record) {
    return record.view.index == view.index;
  });
  if (found == views_.end() || found->view.base != view.base) {
    return invalid_argument("graph arena: view {} is not live in this arena", view.index);
  }
  const ViewRecord record = *found;
  views_.erase(found);
  if (record.range.base != nullptr) {
    FOLIO_RETURN_IF_ERROR(source_->virtual_memory().release(record.range));
  }
  if (record.private_run.bytes > 0) {
    physical_bytes_ -= record.private_run.bytes;
    FOLIO_RETURN_IF_ERROR(source_->release(record.private_run));
  }
  return Status();
}

Status MultiShapeArena::remap_views(size_t offset, const PhysicalRun& old_run,
                                    const PhysicalRun& new_run) {
  device::VirtualMemory& vm = source_->virtual_memory();
  for (const ViewRecord& record : views_) {
    if (record.view.bytes <= offset) continue;
    const size_t length = record.view.bytes - offset;
    FOLIO_CHECK(length <= new_run.bytes && length <= old_run.bytes,
                "graph arena: view of {} bytes beyond the run it is remapped to",
                record.view.bytes);
    FOLIO_RETURN_IF_ERROR(vm.unmap(record.range, offset, length));
    const Status mapped = vm.map(record.range, offset, new_run.memory, new_run.offset, length);
    if (!mapped.ok()) {
      // Put the old pages back, so that the view stays usable, and report the failure.
      const Status restored = vm.map(record.range, offset, old_run.memory, old_run.offset, length);
      FOLIO_CHECK(restored.ok(), "graph arena: a view lost its memory while being remapped: {}",
                  restored.to_string());
      return mapped.with_context("remapping a graph arena view");
    }
  }
  return Status();
}

Result<size_t> MultiShapeArena::shrink_to_largest_view() {
  const ArenaReplayLock replay = lock_for_replay();  // no replay while pages move
  MutexLock lock(state_mutex_);
  switch (sharing_) {
    case ArenaSharing::kPrivatePerView:
      return size_t{0};
    case ArenaSharing::kShared:
      break;
  }
  size_t target = 0;  // view sizes are multiples of the granule already
  for (const ViewRecord& record : views_) target = std::max(target, record.view.bytes);
  if (physical_bytes_ <= target) return size_t{0};
  // Runs that lie wholly below the target stay.
  size_t kept_runs = 0;
  size_t kept_bytes = 0;
  while (kept_runs < shared_runs_.size() && kept_bytes + shared_runs_[kept_runs].bytes <= target) {
    kept_bytes += shared_runs_[kept_runs].bytes;
    ++kept_runs;
  }
  size_t released = 0;
  if (kept_bytes < target) {
    // The run straddling the target: live views map part of it. Replace it by a run of just
    // the bytes below the target and move those views over; keep it whole when the source
    // cannot give the smaller run.
    const PhysicalRun straddling = shared_runs_[kept_runs];
    Result<PhysicalRun> smaller = source_->acquire(target - kept_bytes);
    if (smaller.ok()) {
      FOLIO_RETURN_IF_ERROR(remap_views(kept_bytes, straddling, *smaller));
      FOLIO_RETURN_IF_ERROR(source_->release(straddling));
      released += straddling.bytes - smaller->bytes;
      physical_bytes_ -= straddling.bytes - smaller->bytes;
      shared_runs_[kept_runs] = *smaller;
      kept_bytes = target;
    } else {
      log::debug("graph arena: keeping a run of {} bytes whole: {}", straddling.bytes,
                 smaller.status().to_string());
      kept_bytes += straddling.bytes;
    }
    ++kept_runs;
  }
  // No live view reaches the runs above: give them back.
  while (shared_runs_.size() > kept_runs) {
    const PhysicalRun run = shared_runs_.back();
    shared_runs_.pop_back();
    physical_bytes_ -= run.bytes;
    released += run.bytes;
    FOLIO_RETURN_IF_ERROR(source_->release(run));
  }
  FOLIO_DCHECK(physical_bytes_ == kept_bytes);
  return released;
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
  for (const ViewRecord& record : views_) {
    stats.virtual_bytes += record.view.bytes;
    stats.largest_view_bytes = std::max(stats.largest_view_bytes, record.view.bytes);
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
  std::vector<ArenaView> views;
  views.reserve(views_.size());
  for (const ViewRecord& record : views_) views.push_back(record.view);
  return views;
}

void MultiShapeArena::scribble(uint64_t seed) {
  const ArenaReplayLock replay = lock_for_replay();
  MutexLock lock(state_mutex_);
  std::mt19937_64 random(seed);
  for (const ViewRecord& record : views_) {
    const ArenaView& view = record.view;
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
