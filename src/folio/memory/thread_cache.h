// Thread caches of the page pool (seed 001 §8.3): each thread keeps a few free single pages of
// each pool it uses, so that allocating and freeing one page (a KV page, the common case) takes
// only its own cache's lock, which no other thread contends for.
//
// Terms:
// - ThreadCache: one thread's cache for one pool: a bounded LIFO stack of page indices whose
//   words are kThreadHeld. It is filled in batches from the pool's free index, and when a push
//   overflows it the older half goes back to the free index (returned by push()).
// - ThreadCacheRegistry: the pool's list of its caches. The pool drains every cache into its
//   free index when a request cannot be met otherwise, so pages are never stranded in a cache.
// - ThreadCacheHome: what a cache calls at thread exit to give its pages back (the pool).
//
// Lifetime: a cache is shared (std::shared_ptr) by its thread's thread-local list and the
// pool's registry. At thread exit the thread hands its pages home and marks the cache orphaned;
// the registry drops orphaned caches later. When the pool is destroyed first, it marks each cache
// detached (under the cache's lock), and the thread's list forgets detached caches; so neither
// side ever calls into the other after it is gone. The seed's lock-free list, whose push
// publishes a pointer to a node on the pusher's stack, has no counterpart here: a cache stores
// page indices by value under a lock.
//
// Lock order: registry mutex, then a cache's mutex, then the pool's free mutex (thread exit takes
// the last two).
//
// Thread-safety: every method may be called from any thread; each takes the locks it needs.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "folio/base/function_ref.h"
#include "folio/base/mutex.h"

namespace folio::memory {

class ThreadCacheHome {
 public:
  // Called at thread exit with the cache's pages (their words are still kThreadHeld) and the
  // cache's mutex held; must take only locks after it in the lock order.
  virtual void return_pages_at_thread_exit(const std::vector<uint32_t>& pages) = 0;

 protected:
  ~ThreadCacheHome() = default;
};

class ThreadCache {
 public:
  ThreadCache(ThreadCacheHome* home, uint32_t capacity);

  // A thread-held page, or kNoPage (from page_table.h) when empty.
  uint32_t pop();
  // Adds `page`. When that overflows the capacity, moves the older half of the cache into
  // `overflow` (which the caller must return to the free index) and returns true.
  bool push(uint32_t page, std::vector<uint32_t>& overflow);
  // Adds pages fetched in a batch. Requires: they fit.
  void push_batch(const std::vector<uint32_t>& pages);
  // Moves every page into `out`.
  void take_all(std::vector<uint32_t>& out);
  size_t size() const;
  uint32_t capacity() const { return capacity_; }
  // Calls visit(page) for each page, oldest first (invariant checks, debug state).
  void for_each_page(FunctionRef<void(uint32_t page)> visit) const;

 private:
  friend class ThreadCacheRegistry;
  friend struct ThreadLocalCaches;

  mutable Mutex mutex_;
  std::vector<uint32_t> pages_ FOLIO_GUARDED_BY(mutex_);
  ThreadCacheHome* home_ FOLIO_GUARDED_BY(mutex_);  // null once detached
  // Set under mutex_; read without it by the thread's list (to forget a dead pool's cache) and
  // by the registry (to drop a dead thread's cache). Relaxed: the decision it drives takes the
  // mutex before touching anything the flag protects.
  std::atomic<bool> detached_{false};
  std::atomic<bool> orphaned_{false};
  const uint32_t capacity_;
};

class ThreadCacheRegistry {
 public:
  ThreadCacheRegistry(ThreadCacheHome* home, uint32_t capacity);
  // Requires: detach_all() was called (the pool does it first thing in its destructor).
  ~ThreadCacheRegistry();
  ThreadCacheRegistry(const ThreadCacheRegistry&) = delete;
  ThreadCacheRegistry& operator=(const ThreadCacheRegistry&) = delete;

  // The calling thread's cache for this pool, created on first use.
  ThreadCache& local();
  // Moves the pages of every cache into `out` and drops orphaned caches.
  void drain_all(std::vector<uint32_t>& out);
  // Detaches every cache, dropping their pages. After this, no thread calls the home.
  void detach_all();
  // Calls visit(cache) for every live cache, holding the registry's lock.
  void for_each_cache(FunctionRef<void(const ThreadCache&)> visit) const;
  int64_t held_pages() const;
  uint32_t capacity() const { return capacity_; }

 private:
  ThreadCache& register_local();

  ThreadCacheHome* const home_;
  const uint32_t capacity_;
  // Unique for the process's lifetime, so a thread's list never mistakes a new pool at a dead
  // pool's address for the old one.
  const uint64_t serial_;
  mutable Mutex mutex_;
  std::vector<std::shared_ptr<ThreadCache>> caches_ FOLIO_GUARDED_BY(mutex_);
  bool detached_ FOLIO_GUARDED_BY(mutex_) = false;
};

}  // namespace folio::memory
