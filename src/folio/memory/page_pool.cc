// PagePool: creation, storage, and the allocation paths (allocate, prepare, commit, rollback and
// where their pages come from). Handle operations are in page_pool_handles.cc, eviction in
// page_pool_eviction.cc, statistics and invariant walks in page_pool_introspection.cc.
#include "folio/memory/page_pool.h"

#include <bit>
#include <chrono>
#include <cmath>
#include <optional>

#include "folio/base/log.h"
#include "folio/memory/pool_metrics.h"

namespace folio::memory {
namespace {

constexpr size_t kMinPageSize = size_t{4} << 10;
constexpr size_t kMaxPageSize = size_t{4} << 20;
constexpr int64_t kMaxPages = INT32_MAX - 1;
constexpr int kMaxThreadCachePages = 4096;

std::atomic<uint64_t> g_next_pool_serial{1};

// Scratch for batches of single pages, so refills and spills do not allocate.
thread_local std::vector<uint32_t> t_page_batch;
// Counts this thread's allocations for latency sampling.
thread_local uint32_t t_allocations_since_sample = 0;

Status validate_options(const device::VirtualMemory& vm, const PagePoolOptions& options) {
  if (options.name.empty()) return invalid_argument("page pool name is empty");
  const size_t page_size = options.page_size;
  if (!std::has_single_bit(page_size) || page_size < kMinPageSize || page_size > kMaxPageSize) {
    return invalid_argument(
        "page pool '{}': page size {} is not a power of two between 4 KiB "
        "and 4 MiB",
        options.name, page_size);
  }
  if (page_size % vm.granularity() != 0) {
    return invalid_argument(
        "page pool '{}': page size {} is not a multiple of the device's "
        "mapping granularity {}",
        options.name, page_size, vm.granularity());
  }
  if (options.num_pages < 1 || options.num_pages > kMaxPages) {
    return invalid_argument("page pool '{}': num_pages {} is not between 1 and {}", options.name,
                            options.num_pages, kMaxPages);
  }
  if (options.reserved_pages != 0 &&
      (options.reserved_pages < options.num_pages || options.reserved_pages > kMaxPages)) {
    return invalid_argument("page pool '{}': reserved_pages {} is not between num_pages {} and {}",
                            options.name, options.reserved_pages, options.num_pages, kMaxPages);
  }
  const double high = options.high_watermark;
  const double low = options.low_watermark;
  if (!(low > 0 && low <= high && high <= 1)) {
    return invalid_argument(
        "page pool '{}': watermarks low {} and high {} must satisfy "
        "0 < low <= high <= 1",
        options.name, low, high);
  }
  if (options.thread_cache_pages < 0 || options.thread_cache_pages > kMaxThreadCachePages) {
    return invalid_argument("page pool '{}': thread_cache_pages {} is not between 0 and {}",
                            options.name, options.thread_cache_pages, kMaxThreadCachePages);
  }
  const EvictionWeights& weights = options.eviction_weights;
  for (double weight : {weights.recency, weights.size, weights.priority}) {
    if (!std::isfinite(weight) || weight < 0) {
      return invalid_argument("page pool '{}': eviction weights must be finite and >= 0",
                              options.name);
    }
  }
  for (int priority : options.content_priority) {
    if (priority < 0 || priority > 1000) {
      return invalid_argument("page pool '{}': content priority {} is not between 0 and 1000",
                              options.name, priority);
    }
  }
  if (options.latency_sample_period < 1) {
    return invalid_argument("page pool '{}': latency_sample_period {} must be >= 1", options.name,
                            options.latency_sample_period);
  }
  return Status();
}

}  // namespace

Result<std::unique_ptr<PagePool>> PagePool::create(device::VirtualMemory& vm,
                                                   PagePoolOptions options) {
  FOLIO_RETURN_IF_ERROR(validate_options(vm, options));
  if (options.reserved_pages == 0) options.reserved_pages = options.num_pages;
  const size_t budget_bytes = static_cast<size_t>(options.num_pages) * options.page_size;
  const size_t reserved_bytes = static_cast<size_t>(options.reserved_pages) * options.page_size;
  const std::string context = fmt::format("creating page pool '{}'", options.name);

  Result<device::AddressRange> range = vm.reserve(reserved_bytes);
  if (!range.ok()) return range.status().with_context(context);
  Result<device::PhysicalMemory> memory = vm.create(budget_bytes);
  if (!memory.ok()) {
    vm.release(*range).ignore();
    return memory.status().with_context(context);
  }
  if (Status mapped = vm.map(*range, 0, *memory, 0, budget_bytes); !mapped.ok()) {
    vm.release(*range).ignore();
    vm.release(*memory).ignore();
    return mapped.with_context(context);
  }
  metrics::Registry* registry = options.metrics;
  std::unique_ptr<PagePool> pool(new PagePool(vm, std::move(options), *range, *memory));
  if (registry != nullptr) {
    Result<std::unique_ptr<PoolMetrics>> exported = PoolMetrics::create(*registry, *pool);
    if (!exported.ok()) return exported.status().with_context(context);
    pool->metrics_ = std::move(*exported);
  }
  return pool;
}

PagePool::PagePool(device::VirtualMemory& vm, PagePoolOptions options, device::AddressRange range,
                   device::PhysicalMemory memory)
    : vm_(vm),
      options_(std::move(options)),
      range_(range),
      memory_(memory),
      num_pages_(static_cast<uint32_t>(options_.num_pages)),
      serial_(g_next_pool_serial.fetch_add(1, std::memory_order_relaxed)),
      table_(num_pages_),
      free_index_(table_, options_.fit_policy),
      eviction_index_(table_, options_.eviction_weights, options_.content_priority),
      thread_caches_(this, static_cast<uint32_t>(options_.thread_cache_pages)) {
  MutexLock lock(free_mutex_);
  free_index_.insert(0, num_pages_);
  free_pages_.store(num_pages_, std::memory_order_relaxed);
}

PagePool::~PagePool() {
  // First, so that no render calls into a pool being torn down.
  metrics_.reset();
  thread_caches_.detach_all();
  int64_t pinned = 0;
  int64_t unpinned = 0;
  for (int content = 0; content < kNumContentTypes; ++content) {
    pinned += pages_pinned_[content].sum();
    unpinned += pages_unpinned_[content].sum();
  }
  const int64_t reserved = pages_reserved_.sum();
  const int64_t releasing = pages_releasing_.sum();
  FOLIO_CHECK(pinned + unpinned + reserved + releasing == 0,
              "page pool '{}' destroyed with pages still allocated: {} pinned, {} unpinned, {} "
              "reserved, {} being released; destroy every PageAllocation, PinGuard and "
              "PreparedAllocation (and free every released ref) before the pool",
              options_.name, pinned, unpinned, reserved, releasing);
  // release() of the range unmaps the physical memory too; the memory's bytes go with it.
  if (Status status = vm_.release(range_); !status.ok()) {
    log::error("page pool '{}': releasing its address range: {}", options_.name, status);
  }
  if (Status status = vm_.release(memory_); !status.ok()) {
    log::error("page pool '{}': releasing its physical memory: {}", options_.name, status);
  }
}

std::byte* PagePool::page_address(PageId page) const {
  FOLIO_DCHECK(page.value() >= 0 && page.value() < num_pages(), "page {}", page);
  return range_.base + static_cast<size_t>(page.value()) * options_.page_size;
}

size_t PagePool::physical_offset(PageId page) const {
  FOLIO_DCHECK(page.value() >= 0 && page.value() < num_pages(), "page {}", page);
  return static_cast<size_t>(page.value()) * options_.page_size;
}

// ---- Allocation ---------------------------------------------------------------------------

Status PagePool::validate_request(const PageAllocationRequest& request,
                                  std::string_view verb) const {
  if (request.num_pages < 1 || request.num_pages > num_pages()) {
    return invalid_argument("page pool '{}': {} of {} pages; a request takes 1 to {} pages",
                            options_.name, verb, request.num_pages, num_pages());
  }
  if (content_index(request.content) < 0 || content_index(request.content) >= kNumContentTypes) {
    return invalid_argument("page pool '{}': {} with unknown content type {}", options_.name, verb,
                            content_index(request.content));
  }
  if (in_own_eviction_listener()) {
    return failed_precondition(
        "page pool '{}': {} called from inside one of its eviction "
        "listeners; listeners must not allocate from the pool that "
        "evicts",
        options_.name, verb);
  }
  return Status();
}

Result<PageAllocation> PagePool::allocate(const PageAllocationRequest& request) {
  FOLIO_RETURN_IF_ERROR(validate_request(request, "allocate"));
  std::optional<std::chrono::steady_clock::time_point> started;
  if (++t_allocations_since_sample >= static_cast<uint32_t>(options_.latency_sample_period)) {
    t_allocations_since_sample = 0;
    started = std::chrono::steady_clock::now();
  }
  const auto pages = static_cast<uint32_t>(request.num_pages);
  FOLIO_ASSIGN_OR_RETURN(Reservation reservation, reserve(pages, /*refill_thread_cache=*/true));
  const AllocationRef ref = publish(reservation.first, pages, request);
  if (started) {
    const std::chrono::duration<double, std::nano> elapsed =
        std::chrono::steady_clock::now() - *started;
    allocation_latency_.observe(elapsed.count());
    if (metrics_ != nullptr) metrics_->observe_allocation_latency(elapsed.count());
  }
  return PageAllocation(this, ref);
}

Result<PreparedAllocation> PagePool::prepare(const PageAllocationRequest& request) {
  FOLIO_RETURN_IF_ERROR(validate_request(request, "prepare"));
  const auto pages = static_cast<uint32_t>(request.num_pages);
  FOLIO_ASSIGN_OR_RETURN(Reservation reservation, reserve(pages, /*refill_thread_cache=*/false));
  PageSlot& slot = table_[reservation.first];
  const PageWord old_word(slot.word.load(std::memory_order_relaxed));
  slot.allocation_pages.store(pages, std::memory_order_relaxed);
  slot.content.store(static_cast<uint8_t>(request.content), std::memory_order_relaxed);
  // Relaxed: the pages are this thread's alone until commit, whose release store publishes
  // them; a stale-handle check reading this word needs only to see that it is not committed.
  slot.word.store(PageWord::make(PageState::kReserved, false, 0, old_word.generation()).bits(),
                  std::memory_order_relaxed);
  pages_reserved_.add(pages);
  PreparedAllocation prepared;
  prepared.pool_ = this;
  prepared.first_page_ = reservation.first;
  prepared.num_pages_ = pages;
  prepared.request_ = request;
  prepared.cache_ = reservation.cache;
  prepared.made_room_ = reservation.made_room;
  return prepared;
}

Result<PageAllocation> PagePool::commit(PreparedAllocation&& prepared) {
  if (prepared.pool_ != this) {
    return failed_precondition(
        "page pool '{}': commit of an allocation that is not pending here "
        "(already committed or rolled back, or prepared by another pool)",
        options_.name);
  }
  const AllocationRef ref = publish(prepared.first_page_, prepared.num_pages_, prepared.request_);
  pages_reserved_.add(-static_cast<int64_t>(prepared.num_pages_));
  prepared.pool_ = nullptr;
  return PageAllocation(this, ref);
}

Status PagePool::rollback(PreparedAllocation&& prepared) {
  if (prepared.pool_ != this) {
    return failed_precondition(
        "page pool '{}': rollback of an allocation that is not pending "
        "here (already committed or rolled back, or prepared by another "
        "pool)",
        options_.name);
  }
  prepared.pool_ = nullptr;
  const uint32_t first = prepared.first_page_;
  const uint32_t pages = prepared.num_pages_;
  const uint64_t generation =
      PageWord(table_[first].word.load(std::memory_order_relaxed)).generation();
  const bool back_to_cache = prepared.cache_ != nullptr && thread_caches_enabled() &&
                             &thread_caches_.local() == prepared.cache_;
  release_pages(first, pages, generation, back_to_cache);
  pages_reserved_.add(-static_cast<int64_t>(pages));
  return Status();
}

AllocationRef PagePool::publish(uint32_t first, uint32_t pages,
                                const PageAllocationRequest& request) {
  PageSlot& slot = table_[first];
  const uint64_t generation =
      PageWord::next_generation(PageWord(slot.word.load(std::memory_order_relaxed)).generation());
  const int content = content_index(request.content);
  slot.allocation_pages.store(pages, std::memory_order_relaxed);
  slot.content.store(static_cast<uint8_t>(content), std::memory_order_relaxed);
  slot.owner = request.owner;
  slot.listener = request.listener;
  slot.last_use.store(step(), std::memory_order_relaxed);
  // Release (both branches): publishes the metadata above, and whatever the caller wrote to the
  // pages, to every thread that acquires this word with the new generation: pin, unpin, free
  // and touch through the ref (their acquire loads and CASes), and the evictor (its acquire load
  // in EvictionIndex::repaired_top and its claiming CAS).
  if (request.pinned) {
    slot.word.store(PageWord::make(PageState::kPinned, false, 1, generation).bits(),
                    std::memory_order_release);
    pages_pinned_[content].add(pages);
  } else {
    MutexLock lock(index_mutex_);
    slot.word.store(PageWord::make(PageState::kUnpinned, true, 0, generation).bits(),
                    std::memory_order_release);
    eviction_index_.link(first);
    pages_unpinned_[content].add(pages);
  }
  allocations_.add(1);
  return AllocationRef(first, pages, generation, serial_);
}

// ---- Where pages come from ----------------------------------------------------------------

Result<PagePool::Reservation> PagePool::reserve(uint32_t pages, bool refill_thread_cache) {
  if (pages == 1 && thread_caches_enabled()) {
    ThreadCache& cache = thread_caches_.local();
    uint32_t page = cache.pop();
    if (page == kNoPage && refill_thread_cache) page = refill_and_pop(cache);
    if (page != kNoPage) return Reservation{page, &cache, false};
  }
  return reserve_from_free_index(pages);
}

uint32_t PagePool::refill_and_pop(ThreadCache& cache) {
  const uint32_t batch = std::max<uint32_t>(1, cache.capacity() / 2);
  // Evict for the page asked for, not the whole batch: the rest of the batch is whatever is
  // free, and stays free (in this cache) until asked for.
  evict_for_watermark(1);
  std::vector<uint32_t>& pages = t_page_batch;
  pages.clear();
  {
    MutexLock lock(free_mutex_);
    free_index_.take_single_pages(batch, pages);
    free_pages_.store(static_cast<int64_t>(free_index_.free_pages()), std::memory_order_relaxed);
  }
  if (pages.empty()) return kNoPage;
  const uint32_t page = pages.back();
  pages.pop_back();
  for (uint32_t cached : pages) {
    std::atomic<uint64_t>& word = table_[cached].word;
    const uint64_t generation = PageWord(word.load(std::memory_order_relaxed)).generation();
    // Relaxed: the page passes between threads only through the cache's and the free index's
    // mutexes; the word publishes nothing.
    word.store(PageWord::make(PageState::kThreadHeld, false, 0, generation).bits(),
               std::memory_order_relaxed);
  }
  cache.push_batch(pages);
  return page;
}

uint32_t PagePool::take_from_free_index(uint32_t pages) {
  MutexLock lock(free_mutex_);
  const uint32_t first = free_index_.take(pages);
  free_pages_.store(static_cast<int64_t>(free_index_.free_pages()), std::memory_order_relaxed);
  return first;
}

Result<PagePool::Reservation> PagePool::reserve_from_free_index(uint32_t pages) {
  Reservation reservation;
  reservation.made_room = evict_for_watermark(pages) > 0;
  reservation.first = take_from_free_index(pages);
  if (reservation.first == kNoPage && thread_caches_enabled() && drain_thread_caches() > 0) {
    reservation.made_room = true;
    reservation.first = take_from_free_index(pages);
  }
  if (reservation.first == kNoPage) {
    int64_t evicted = 0;
    reservation.first = evict_until_taken(pages, &evicted);
    reservation.made_room = reservation.made_room || evicted > 0;
  }
  if (reservation.first == kNoPage) {
    failed_allocations_.fetch_add(1, std::memory_order_relaxed);
    if (metrics_ != nullptr) metrics_->count_failed_allocation();
    return exhausted(pages);
  }
  return reservation;
}

int64_t PagePool::drain_thread_caches() {
  std::vector<uint32_t> pages;
  thread_caches_.drain_all(pages);
  thread_cache_drains_.fetch_add(1, std::memory_order_relaxed);
  if (!pages.empty()) insert_into_free_index(pages);
  return static_cast<int64_t>(pages.size());
}

void PagePool::flush_thread_caches() {
  if (thread_caches_enabled()) drain_thread_caches();
}

Status PagePool::exhausted(uint32_t pages) {
  int64_t pinned = 0;
  for (const StripedCounter& counter : pages_pinned_) pinned += counter.sum();
  uint32_t largest = 0;
  {
    MutexLock lock(free_mutex_);
    largest = free_index_.largest_extent();
  }
  return resource_exhausted(
      "page pool '{}' cannot allocate {} contiguous pages: {} free (longest free run {}), {} in "
      "thread caches, {} evictable, {} pinned, {} reserved, of {} pages",
      options_.name, pages, free_pages_.load(std::memory_order_relaxed), largest,
      thread_caches_.held_pages(), evictable_pages(), pinned, pages_reserved_.sum(), num_pages_);
}

// ---- Where pages go back --------------------------------------------------------------------

void PagePool::release_pages(uint32_t first, uint32_t pages, uint64_t generation,
                             bool to_thread_cache) {
  std::atomic<uint64_t>& word = table_[first].word;
  if (pages == 1 && to_thread_cache && thread_caches_enabled()) {
    // Relaxed here and below: the page's next owner synchronizes with this thread through the
    // cache's or the free index's mutex; the word only has to stop matching old handles.
    word.store(PageWord::make(PageState::kThreadHeld, false, 0, generation).bits(),
               std::memory_order_relaxed);
    std::vector<uint32_t>& spill = t_page_batch;
    spill.clear();
    if (thread_caches_.local().push(first, spill)) insert_into_free_index(spill);
    return;
  }
  MutexLock lock(free_mutex_);
  word.store(PageWord::make(PageState::kFree, false, 0, generation).bits(),
             std::memory_order_relaxed);
  free_index_.insert(first, pages);
  free_pages_.store(static_cast<int64_t>(free_index_.free_pages()), std::memory_order_relaxed);
}

void PagePool::insert_into_free_index(const std::vector<uint32_t>& single_pages) {
  MutexLock lock(free_mutex_);
  for (uint32_t page : single_pages) {
    std::atomic<uint64_t>& word = table_[page].word;
    const uint64_t generation = PageWord(word.load(std::memory_order_relaxed)).generation();
    word.store(PageWord::make(PageState::kFree, false, 0, generation).bits(),
               std::memory_order_relaxed);
    free_index_.insert(page, 1);
  }
  free_pages_.store(static_cast<int64_t>(free_index_.free_pages()), std::memory_order_relaxed);
}

void PagePool::return_pages_at_thread_exit(const std::vector<uint32_t>& pages) {
  insert_into_free_index(pages);
}

}  // namespace folio::memory
