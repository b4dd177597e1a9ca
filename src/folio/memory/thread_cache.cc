#include "folio/memory/thread_cache.h"

#include <algorithm>

#include "folio/base/check.h"
#include "folio/memory/page_table.h"

namespace folio::memory {

// The calling thread's caches, one per pool it has allocated from. The destructor runs at thread
// exit and gives every cache's pages back to its pool, unless the pool has gone.
struct ThreadLocalCaches {
  struct Entry {
    uint64_t serial;
    std::shared_ptr<ThreadCache> cache;
  };
  std::vector<Entry> entries;
  // The last pool looked up, so that the common case (one pool) is one compare.
  uint64_t last_serial = 0;
  ThreadCache* last_cache = nullptr;

  ~ThreadLocalCaches() {
    for (Entry& entry : entries) {
      ThreadCache& cache = *entry.cache;
      MutexLock lock(cache.mutex_);
      if (cache.home_ != nullptr && !cache.pages_.empty()) {
        cache.home_->return_pages_at_thread_exit(cache.pages_);
      }
      cache.pages_.clear();
      cache.orphaned_.store(true, std::memory_order_relaxed);
    }
  }
};

namespace {
thread_local ThreadLocalCaches t_caches;
std::atomic<uint64_t> g_next_registry_serial{1};
}  // namespace

ThreadCache::ThreadCache(ThreadCacheHome* home, uint32_t capacity)
    : home_(home), capacity_(capacity) {
  pages_.reserve(capacity + 1);
}

uint32_t ThreadCache::pop() {
  MutexLock lock(mutex_);
  if (pages_.empty()) return kNoPage;
  const uint32_t page = pages_.back();
  pages_.pop_back();
  return page;
}

bool ThreadCache::push(uint32_t page, std::vector<uint32_t>& overflow) {
  MutexLock lock(mutex_);
  pages_.push_back(page);
  if (pages_.size() <= capacity_) return false;
  const size_t spill = pages_.size() / 2;
  overflow.insert(overflow.end(), pages_.begin(), pages_.begin() + static_cast<ptrdiff_t>(spill));
  pages_.erase(pages_.begin(), pages_.begin() + static_cast<ptrdiff_t>(spill));
  return true;
}

void ThreadCache::push_batch(const std::vector<uint32_t>& pages) {
  MutexLock lock(mutex_);
  FOLIO_DCHECK(pages_.size() + pages.size() <= capacity_);
  pages_.insert(pages_.end(), pages.begin(), pages.end());
}

void ThreadCache::take_all(std::vector<uint32_t>& out) {
  MutexLock lock(mutex_);
  out.insert(out.end(), pages_.begin(), pages_.end());
  pages_.clear();
}

size_t ThreadCache::size() const {
  MutexLock lock(mutex_);
  return pages_.size();
}

void ThreadCache::for_each_page(FunctionRef<void(uint32_t page)> visit) const {
  MutexLock lock(mutex_);
  for (uint32_t page : pages_) visit(page);
}

ThreadCacheRegistry::ThreadCacheRegistry(ThreadCacheHome* home, uint32_t capacity)
    : home_(home),
      capacity_(capacity),
      serial_(g_next_registry_serial.fetch_add(1, std::memory_order_relaxed)) {}

ThreadCacheRegistry::~ThreadCacheRegistry() {
  MutexLock lock(mutex_);
  FOLIO_CHECK(detached_, "thread cache registry destroyed before detach_all()");
}

ThreadCache& ThreadCacheRegistry::local() {
  if (t_caches.last_serial == serial_) return *t_caches.last_cache;
  return register_local();
}

ThreadCache& ThreadCacheRegistry::register_local() {
  std::vector<ThreadLocalCaches::Entry>& entries = t_caches.entries;
  // Forget the caches of pools that are gone.
  std::erase_if(entries, [](const ThreadLocalCaches::Entry& entry) {
    return entry.cache->detached_.load(std::memory_order_relaxed);
  });
  ThreadCache* found = nullptr;
  for (const ThreadLocalCaches::Entry& entry : entries) {
    if (entry.serial == serial_) found = entry.cache.get();
  }
  if (found == nullptr) {
    auto cache = std::make_shared<ThreadCache>(home_, capacity_);
    {
      MutexLock lock(mutex_);
      FOLIO_CHECK(!detached_, "thread cache requested from a pool being destroyed");
      std::erase_if(caches_, [](const std::shared_ptr<ThreadCache>& candidate) {
        return candidate->orphaned_.load(std::memory_order_relaxed);
      });
      caches_.push_back(cache);
    }
    found = cache.get();
    entries.push_back({serial_, std::move(cache)});
  }
  t_caches.last_serial = serial_;
  t_caches.last_cache = found;
  return *found;
}

void ThreadCacheRegistry::drain_all(std::vector<uint32_t>& out) {
  MutexLock lock(mutex_);
  std::erase_if(caches_, [](const std::shared_ptr<ThreadCache>& cache) {
    return cache->orphaned_.load(std::memory_order_relaxed);
  });
  for (const std::shared_ptr<ThreadCache>& cache : caches_) cache->take_all(out);
}

void ThreadCacheRegistry::detach_all() {
  MutexLock lock(mutex_);
  for (const std::shared_ptr<ThreadCache>& cache : caches_) {
    MutexLock cache_lock(cache->mutex_);
    cache->pages_.clear();
    cache->home_ = nullptr;
    cache->detached_.store(true, std::memory_order_relaxed);
  }
  caches_.clear();
  detached_ = true;
}

void ThreadCacheRegistry::for_each_cache(FunctionRef<void(const ThreadCache&)> visit) const {
  MutexLock lock(mutex_);
  for (const std::shared_ptr<ThreadCache>& cache : caches_) {
    if (!cache->orphaned_.load(std::memory_order_relaxed)) visit(*cache);
  }
}

int64_t ThreadCacheRegistry::held_pages() const {
  int64_t total = 0;
  for_each_cache([&](const ThreadCache& cache) { total += static_cast<int64_t>(cache.size()); });
  return total;
}

}  // namespace folio::memory
