// MultiShapeArena: the activation memory of captured programs (seed 000 §4.2.2). Every capture
// gets a fresh virtual view (a reserved address range of its own) onto one shared physical
// arena, so each program keeps stable addresses of its own while all of them share physical
// memory: physical bytes are the largest view (rounded up to the source's granule), virtual
// bytes grow by one view per capture, and a new capture never remaps or moves an existing view.
//
// Sharing physical memory is safe only because programs never run at the same time and never
// read what an earlier replay left in the arena (nothing persistent lives there). The first is
// enforced here, not assumed: replaying requires an ArenaReplayLock, which only
// lock_for_replay() makes, and the lock serializes replays of every program on this arena (two
// executors sharing an arena, two threads, one at a time).
//
// kPrivatePerView is the baseline the design improves on: each view gets physical memory of
// its own, so physical bytes are the sum of the views (what a per-capture memory pool costs).
//
// Lifetime: a view lives until release_view() or until the arena is destroyed (captured
// programs hold its addresses; the executor releases a view only after dropping its program).
// Physical memory is given back by shrink_to_largest_view(): in kShared mode the physical arena
// shrinks to the largest view still alive, remapping the views that used the pages it keeps
// (their addresses do not change; what they held is lost, which is fine because nothing
// persistent lives in the arena), so "physical bytes = the largest view" holds again. Users
// (executors) attach() and detach(); destroying an arena with users attached aborts.
//
// Thread-safety: every method may be called from any thread. state_mutex_ guards the views and
// the source; replay_mutex_ is the replay lock. create_view never takes replay_mutex_: a new
// view maps memory that existing programs may be using, but writes nothing to it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "folio/base/mutex.h"
#include "folio/base/result.h"
#include "folio/exec/arena_memory.h"

namespace folio::exec {

enum class ArenaSharing : uint8_t {
  kShared,          // every view maps the same physical memory from offset 0
  kPrivatePerView,  // baseline: every view has physical memory of its own
};

// One capture's view: [base, base + bytes), valid until released. `index` is unique within the
// arena (never reused).
struct ArenaView {
  std::byte* base = nullptr;
  size_t bytes = 0;
  int32_t index = -1;
};

class MultiShapeArena;

// Proof that the holder has the arena's replay lock. Movable, not copyable.
class ArenaReplayLock {
 public:
  const MultiShapeArena* arena() const { return arena_; }

 private:
  friend class MultiShapeArena;
  ArenaReplayLock(std::unique_lock<std::mutex> lock, const MultiShapeArena* arena)
      : lock_(std::move(lock)), arena_(arena) {}

  std::unique_lock<std::mutex> lock_;
  const MultiShapeArena* arena_;
};

struct ArenaStats {
  int32_t num_views = 0;      // live views
  size_t physical_bytes = 0;  // acquired from the source (the arena's own count)
  size_t virtual_bytes = 0;   // sum of the live views
  size_t largest_view_bytes = 0;
  int64_t replays = 0;
};

class MultiShapeArena {
 public:
  static std::unique_ptr<MultiShapeArena> create(std::unique_ptr<ArenaMemorySource> source,
                                                 ArenaSharing sharing = ArenaSharing::kShared);
  // Releases every view, then the memory. Requires: no user attached.
  ~MultiShapeArena();
  MultiShapeArena(const MultiShapeArena&) = delete;
  MultiShapeArena& operator=(const MultiShapeArena&) = delete;

  // A fresh view of `bytes` (rounded up to the granule; 0 gives an empty view with a null
  // base). In kShared mode the physical arena first grows to the view's size. Errors: the
  // source's (kResourceExhausted when its memory is short) or the VirtualMemory's; a failure
  // leaves every existing view untouched, and memory already acquired is kept for later views.
  Result<ArenaView> create_view(size_t bytes);

  // Unmaps `view` and forgets it; in kPrivatePerView mode its physical memory goes back to the
  // source at once, in kShared mode at the next shrink_to_largest_view(). Requires: nothing
  // replays or will replay through the view. kInvalidArgument for a view this arena does not
  // hold (released already).
  Status release_view(const ArenaView& view);
  // kShared: gives back the physical memory beyond the largest live view (rounded up to the
  // granule), remapping the live views onto what stays; returns the bytes given back. Takes the
  // replay lock (no replay runs while pages move). When the source cannot give the smaller run
  // a straddling run is replaced by, that run is kept whole (the bytes returned say so).
  // kPrivatePerView: 0 (release_view gave the memory back already). Errors: the
  // VirtualMemory's or the source's.
  Result<size_t> shrink_to_largest_view();

  // Blocks until no other replay on this arena is in flight.
  ArenaReplayLock lock_for_replay() const;

  ArenaStats stats() const;
  ArenaSharing sharing() const { return sharing_; }
  // The source's granule, fixed at construction (so read without the lock).
  size_t granule() const { return granule_; }
  // The source's own measurement of the physical bytes held (see arena_memory.h).
  Result<size_t> measured_physical_bytes() const;
  std::vector<ArenaView> views() const;

  // Writes pseudo-random bytes through every view (for tests: nothing may depend on what a
  // previous replay left). Takes the replay lock.
  void scribble(uint64_t seed);

  void attach();
  void detach();

 private:
  // A live view, the range it was reserved as, and (kPrivatePerView) its own physical run.
  struct ViewRecord {
    ArenaView view;
    device::AddressRange range;
    PhysicalRun private_run;
  };

  MultiShapeArena(std::unique_ptr<ArenaMemorySource> source, ArenaSharing sharing);
  // The runs a new view of `bytes` maps, in order.
  Result<std::vector<PhysicalRun>> runs_for_view(size_t bytes) FOLIO_REQUIRES(state_mutex_);
  // Reserves a range and maps `runs` into it, covering `bytes`.
  Result<ViewRecord> map_view(const std::vector<PhysicalRun>& runs, size_t bytes)
      FOLIO_REQUIRES(state_mutex_);

  const ArenaSharing sharing_;
  const size_t granule_;
  mutable Mutex state_mutex_;
  // Set by the constructor and never reassigned; the source it points to is used under the
  // mutex.
  std::unique_ptr<ArenaMemorySource> source_ FOLIO_PT_GUARDED_BY(state_mutex_);
  // Remaps [offset, view bytes) of every live view from `old_run` to `new_run` (which starts at
  // arena offset `offset`). FOLIO_CHECKs that a view it unmapped is mapped again.
  Status remap_views(size_t offset, const PhysicalRun& old_run, const PhysicalRun& new_run)
      FOLIO_REQUIRES(state_mutex_);

  // kShared: the physical arena, in offset order.
  std::vector<PhysicalRun> shared_runs_ FOLIO_GUARDED_BY(state_mutex_);
  std::vector<ViewRecord> views_ FOLIO_GUARDED_BY(state_mutex_);  // live views
  int32_t next_view_index_ FOLIO_GUARDED_BY(state_mutex_) = 0;
  size_t physical_bytes_ FOLIO_GUARDED_BY(state_mutex_) = 0;
  int32_t users_ FOLIO_GUARDED_BY(state_mutex_) = 0;
  // Not a folio::Mutex: it guards no member but the replays themselves, and is held by an
  // ArenaReplayLock that moves between functions (the analysis follows a lock within one).
  mutable std::mutex replay_mutex_;
  // Replay locks handed out. Relaxed: a statistic, publishing nothing.
  mutable std::atomic<int64_t> replays_{0};
};

}  // namespace folio::exec
