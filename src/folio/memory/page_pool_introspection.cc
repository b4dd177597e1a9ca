// PagePool: statistics, the page metadata table row of one page, and the debug walks
// (check_invariants, debug_state) that tests run after every operation.
#include <algorithm>

#include "folio/memory/page_pool.h"

namespace folio::memory {

PoolStats PagePool::stats() const {
  PoolStats stats;
  stats.page_size = options_.page_size;
  stats.num_pages = num_pages_;
  stats.step = step();
  stats.pages_free = free_pages_.load(std::memory_order_relaxed);
  stats.pages_thread_held = thread_caches_.held_pages();
  stats.pages_reserved = pages_reserved_.sum();
  stats.pages_releasing = pages_releasing_.sum();
  for (int content = 0; content < kNumContentTypes; ++content) {
    ContentStats& entry = stats.per_content[content];
    entry.pages_pinned = pages_pinned_[content].sum();
    entry.pages_evictable = pages_unpinned_[content].sum();
    entry.pages_in_use = entry.pages_pinned + entry.pages_evictable;
    entry.evictions = evictions_[content].load(std::memory_order_relaxed);
    entry.pages_evicted = pages_evicted_[content].load(std::memory_order_relaxed);
    stats.pages_pinned += entry.pages_pinned;
    stats.pages_unpinned += entry.pages_evictable;
    stats.evictions += entry.evictions;
    stats.pages_evicted += entry.pages_evicted;
  }
  stats.utilization = static_cast<double>(num_pages_ - stats.pages_free - stats.pages_thread_held) /
                      static_cast<double>(num_pages_);
  {
    MutexLock lock(free_mutex_);
    stats.largest_free_extent = free_index_.largest_extent();
  }
  stats.fragmentation_ratio =
      stats.pages_free > 0
          ? static_cast<double>(stats.largest_free_extent) / static_cast<double>(stats.pages_free)
          : 1.0;
  stats.allocations = allocations_.sum();
  stats.failed_allocations = failed_allocations_.load(std::memory_order_relaxed);
  stats.pin_contention = pin_contention_.sum();
  stats.thread_cache_drains = thread_cache_drains_.load(std::memory_order_relaxed);
  stats.allocation_latency = allocation_latency_.snapshot();
  return stats;
}

void PagePool::walk_runs(
    FunctionRef<void(uint32_t first, uint32_t pages, PageWord word)> visit) const {
  uint32_t page = 0;
  while (page < num_pages_) {
    const PageSlot& slot = table_[page];
    const PageWord word(slot.word.load(std::memory_order_acquire));
    uint32_t pages = 0;
    switch (word.state()) {
      case PageState::kFree:
        pages = slot.extent_pages;
        FOLIO_CHECK(pages > 0, "page {} is free but heads no free extent", page);
        break;
      case PageState::kThreadHeld:
        pages = 1;
        break;
      case PageState::kReserved:
      case PageState::kUnpinned:
      case PageState::kPinned:
      case PageState::kReleasing:
        pages = slot.allocation_pages.load(std::memory_order_relaxed);
        FOLIO_CHECK(pages > 0, "allocation at page {} has no length", page);
        break;
    }
    FOLIO_CHECK(uint64_t{page} + pages <= num_pages_,
                "run at page {} of {} pages overflows the "
                "pool of {}",
                page, pages, num_pages_);
    visit(page, pages, word);
    page += pages;
  }
}

Result<PageInfo> PagePool::page_info(PageId page) const {
  if (page.value() < 0 || page.value() >= num_pages()) {
    return out_of_range("page pool '{}': page {} of {}", options_.name, page, num_pages_);
  }
  const auto target = static_cast<uint32_t>(page.value());
  PageInfo info;
  MutexLock lock(free_mutex_);
  walk_runs([&](uint32_t first, uint32_t pages, PageWord word) {
    if (target < first || target >= first + pages) return;
    const PageSlot& slot = table_[first];
    info.state = word.state();
    info.run_first_page = PageId(static_cast<int32_t>(first));
    info.run_pages = pages;
    info.generation = word.generation();
    switch (word.state()) {
      case PageState::kFree:
      case PageState::kThreadHeld:
        break;
      case PageState::kReserved:
      case PageState::kUnpinned:
      case PageState::kPinned:
      case PageState::kReleasing:
        info.content = static_cast<ContentType>(slot.content.load(std::memory_order_relaxed));
        info.pin_count = word.pins();
        info.last_use = slot.last_use.load(std::memory_order_relaxed);
        info.owner = word.state() == PageState::kReserved ? 0 : slot.owner;
        break;
    }
  });
  return info;
}

// What the invariant walk counts, to compare with the pool's counters.
struct PagePool::RunCensus {
  std::array<int64_t, kNumPageStates> pages_in_state{};
  std::array<int64_t, kNumContentTypes> pinned{};
  std::array<int64_t, kNumContentTypes> unpinned{};
  uint32_t linked = 0;
  int64_t pages(PageState state) const { return pages_in_state[static_cast<int>(state)]; }
};

void PagePool::check_invariants() const {
  // Each thread-held page, and which cache holds it.
  std::vector<int> cache_of(num_pages_, -1);
  int64_t held_by_thread_caches = 0;
  int cache_number = 0;
  thread_caches_.for_each_cache([&](const ThreadCache& cache) {
    cache.for_each_page([&](uint32_t page) {
      FOLIO_CHECK(page < num_pages_ && cache_of[page] < 0,
                  "page {} is in two thread caches (or twice in one)", page);
      cache_of[page] = cache_number;
      ++held_by_thread_caches;
    });
    ++cache_number;
  });
  // Free before index, as in debug_state(): the only places the two nest, so always in this
  // order (std::scoped_lock's deadlock avoidance is not needed, and the analysis cannot see
  // through it).
  MutexLock free_lock(free_mutex_);
  MutexLock index_lock(index_mutex_);
  free_index_.check_invariants();
  const uint32_t indexed = eviction_index_.check_invariants();
  const RunCensus census = take_census(cache_of);
  FOLIO_CHECK(census.linked == indexed, "{} allocations are marked linked, the index holds {}",
              census.linked, indexed);
  check_counters(census, held_by_thread_caches);
}

PagePool::RunCensus PagePool::take_census(const std::vector<int>& cache_of) const {
  RunCensus census;
  // The analysis checks the callback as a function of its own; it runs inside walk_runs, under
  // the index lock this function holds, and says so.
  walk_runs([&](uint32_t first, uint32_t pages, PageWord word) FOLIO_REQUIRES(index_mutex_) {
    census.pages_in_state[static_cast<int>(word.state())] += pages;
    for (uint32_t interior = first + 1; interior < first + pages; ++interior) {
      FOLIO_CHECK(PageWord(table_[interior].word.load(std::memory_order_relaxed)).state() ==
                      PageState::kFree,
                  "interior page {} of the run at {} has a head's state", interior, first);
    }
    const int content = table_[first].content.load(std::memory_order_relaxed);
    switch (word.state()) {
      case PageState::kFree:
        return;
      case PageState::kThreadHeld:
        FOLIO_CHECK(cache_of[first] >= 0, "page {} is kThreadHeld but in no thread cache", first);
        return;
      case PageState::kReserved:
        FOLIO_CHECK(word.pins() == 0 && !word.linked(), "reserved run at {} is pinned or indexed",
                    first);
        return;
      case PageState::kUnpinned:
        FOLIO_CHECK(word.pins() == 0 && word.linked(),
                    "evictable allocation at {} is not in the eviction index", first);
        census.unpinned[content] += pages;
        break;
      case PageState::kPinned:
        FOLIO_CHECK(word.pins() >= 1, "pinned allocation at {} has no pins", first);
        census.pinned[content] += pages;
        break;
      case PageState::kReleasing:
        FOLIO_CHECK(false, "allocation at {} is being released in a quiescent pool", first);
        return;
    }
    if (word.linked()) {
      FOLIO_CHECK(eviction_index_.contains(first), "page {} is marked linked but not indexed",
                  first);
      ++census.linked;
    }
  });
  return census;
}

void PagePool::check_counters(const RunCensus& census, int64_t held_by_thread_caches) const {
  FOLIO_CHECK(census.pages(PageState::kFree) == static_cast<int64_t>(free_index_.free_pages()) &&
                  census.pages(PageState::kFree) == free_pages_.load(std::memory_order_relaxed),
              "walk finds {} free pages, the free index counts {}", census.pages(PageState::kFree),
              free_index_.free_pages());
  FOLIO_CHECK(census.pages(PageState::kThreadHeld) == held_by_thread_caches,
              "walk finds {} thread-held pages, thread caches hold {}",
              census.pages(PageState::kThreadHeld), held_by_thread_caches);
  FOLIO_CHECK(census.pages(PageState::kReserved) == pages_reserved_.sum(),
              "walk finds {} reserved pages, counted {}", census.pages(PageState::kReserved),
              pages_reserved_.sum());
  FOLIO_CHECK(pages_releasing_.sum() == 0, "pages counted as being released in a quiescent pool");
  for (int content = 0; content < kNumContentTypes; ++content) {
    FOLIO_CHECK(census.pinned[content] == pages_pinned_[content].sum() &&
                    census.unpinned[content] == pages_unpinned_[content].sum(),
                "content {}: walk finds {} pinned and {} evictable pages, counted {} and {}",
                content_type_name(static_cast<ContentType>(content)), census.pinned[content],
                census.unpinned[content], pages_pinned_[content].sum(),
                pages_unpinned_[content].sum());
  }
}

PoolDebugState PagePool::debug_state() const {
  PoolDebugState state;
  // Empty caches are left out: whether a thread has made its (empty) cache yet is not state.
  thread_caches_.for_each_cache([&](const ThreadCache& cache) {
    std::vector<uint32_t> pages;
    cache.for_each_page([&](uint32_t page) { pages.push_back(page); });
    if (!pages.empty()) state.thread_caches.push_back(std::move(pages));
  });
  MutexLock free_lock(free_mutex_);  // free before index, as in check_invariants()
  MutexLock index_lock(index_mutex_);
  state.pages.resize(num_pages_);
  for (uint32_t page = 0; page < num_pages_; ++page) {
    const PageSlot& slot = table_[page];
    PoolDebugState::Page& entry = state.pages[page];
    entry.word = slot.word.load(std::memory_order_relaxed);
    entry.extent_pages = slot.extent_pages;
    entry.extent_first = slot.extent_first;
  }
  // As in take_census, the callback says it runs under the index lock.
  walk_runs([&](uint32_t first, uint32_t pages, PageWord word) FOLIO_REQUIRES(index_mutex_) {
    if (word.state() == PageState::kFree || word.state() == PageState::kThreadHeld) return;
    const PageSlot& slot = table_[first];
    PoolDebugState::Page& entry = state.pages[first];
    entry.allocation_pages = pages;
    entry.content = slot.content.load(std::memory_order_relaxed);
    if (word.state() != PageState::kReserved) {
      entry.owner = slot.owner;
      entry.last_use = slot.last_use.load(std::memory_order_relaxed);
    }
    if (eviction_index_.contains(first)) state.eviction_index.push_back(first);
  });
  free_index_.for_each_extent(
      [&](uint32_t first, uint32_t pages) { state.free_extents.emplace_back(first, pages); });
  std::sort(state.free_extents.begin(), state.free_extents.end());
  state.counters = {static_cast<int64_t>(free_index_.free_pages()), pages_reserved_.sum(),
                    pages_releasing_.sum(), allocations_.sum(),
                    failed_allocations_.load(std::memory_order_relaxed)};
  for (int content = 0; content < kNumContentTypes; ++content) {
    state.counters.push_back(pages_pinned_[content].sum());
    state.counters.push_back(pages_unpinned_[content].sum());
    state.counters.push_back(evictions_[content].load(std::memory_order_relaxed));
  }
  return state;
}

}  // namespace folio::memory
