// Micro-benchmarks of the page pool against baselines measured in the same run:
// - malloc/free of the same byte sizes (one page, 100 pages);
// - MapPool: a mutex-protected best-fit allocator over std::multimap/std::map with coalescing,
//   the "straightforward" design, with a std::map of pin counts and a std::multimap LRU for the
//   pin/unpin and eviction baselines.
// Run with 1 and 2 threads. Google Benchmark reports, per operation, CPU time of one thread and
// wall time of all threads together (with 2 threads: the inverse of their combined throughput).
// Seed 001's targets: allocate 1 page < 100 ns, 100 pages < 1 us, pin/unpin < 50 ns, evict 1
// page < 10 us.
// Nothing is written to the pages: the pool and the baselines are measured as bookkeeping only.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdlib>
#include <ctime>
#include <map>
#include <mutex>

#include "folio/base/check.h"
#include "folio/device/host_virtual_memory.h"
#include "folio/memory/page_pool.h"

namespace folio::memory {
namespace {

constexpr size_t kPageSize = size_t{2} << 20;
constexpr int64_t kAllocationPoolPages = 512;
constexpr int64_t kEvictionPoolPages = 256;

device::VirtualMemory& bench_vm() {
  static std::unique_ptr<device::VirtualMemory> vm = [] {
    Result<std::unique_ptr<device::VirtualMemory>> made = device::make_host_virtual_memory();
    FOLIO_CHECK(made.ok(), "{}", made.status());
    return std::move(*made);
  }();
  return *vm;
}

std::unique_ptr<PagePool> make_bench_pool(int64_t pages, double high_watermark) {
  PagePoolOptions options;
  options.name = "bench";
  options.page_size = kPageSize;
  options.num_pages = pages;
  options.high_watermark = high_watermark;
  options.low_watermark = high_watermark;
  Result<std::unique_ptr<PagePool>> pool = PagePool::create(bench_vm(), options);
  FOLIO_CHECK(pool.ok(), "{}", pool.status());
  return std::move(*pool);
}

// Allocation benchmarks share one pool with proactive eviction off.
PagePool& allocation_pool() {
  static std::unique_ptr<PagePool> pool = make_bench_pool(kAllocationPoolPages, 1.0);
  return *pool;
}

PageAllocationRequest request(int64_t pages, bool pinned) {
  PageAllocationRequest result;
  result.num_pages = pages;
  result.content = ContentType::kKvCache;
  result.pinned = pinned;
  return result;
}

// ---- The baseline: a mutex-protected ordered-map best-fit allocator -------------------------

class MapPool {
 public:
  explicit MapPool(uint32_t pages) { insert(0, pages); }

  int64_t allocate(uint32_t pages) {
    std::lock_guard lock(mutex_);
    auto fit = by_size_.lower_bound(pages);
    if (fit == by_size_.end()) return -1;
    const uint32_t start = fit->second;
    const uint32_t size = fit->first;
    by_size_.erase(fit);
    by_start_.erase(start);
    if (size > pages) insert(start + pages, size - pages);
    pins_[start] = 0;
    return start;
  }
  void free(uint32_t start, uint32_t pages) {
    std::lock_guard lock(mutex_);
    pins_.erase(start);
    uint32_t first = start;
    uint32_t length = pages;
    auto next = by_start_.lower_bound(start);
    if (next != by_start_.end() && next->first == start + pages) {
      length += next->second;
      erase(next->first, next->second);
    }
    auto previous = by_start_.lower_bound(start);
    if (previous != by_start_.begin()) {
      --previous;
      if (previous->first + previous->second == start) {
        first = previous->first;
        length += previous->second;
        erase(previous->first, previous->second);
      }
    }
    insert(first, length);
  }
  void pin(uint32_t start) {
    std::lock_guard lock(mutex_);
    ++pins_.at(start);
  }
  void unpin(uint32_t start) {
    std::lock_guard lock(mutex_);
    --pins_.at(start);
  }
  // LRU eviction baseline: the oldest unpinned allocation goes back to the free maps.
  void add_to_lru(uint64_t last_use, uint32_t start) {
    std::lock_guard lock(mutex_);
    lru_.emplace(last_use, start);
  }
  bool evict_one() {
    uint32_t start = 0;
    {
      std::lock_guard lock(mutex_);
      if (lru_.empty()) return false;
      start = lru_.begin()->second;
      lru_.erase(lru_.begin());
    }
    free(start, 1);
    return true;
  }

 private:
  void insert(uint32_t start, uint32_t size) {
    by_size_.emplace(size, start);
    by_start_.emplace(start, size);
  }
  void erase(uint32_t start, uint32_t size) {
    auto [begin, end] = by_size_.equal_range(size);
    for (auto it = begin; it != end; ++it) {
      if (it->second == start) {
        by_size_.erase(it);
        break;
      }
    }
    by_start_.erase(start);
  }

  std::mutex mutex_;
  std::multimap<uint32_t, uint32_t> by_size_;
  std::map<uint32_t, uint32_t> by_start_;
  std::map<uint32_t, uint32_t> pins_;
  std::multimap<uint64_t, uint32_t> lru_;
};

MapPool& map_pool() {
  static MapPool pool(kAllocationPoolPages);
  return pool;
}

// ---- Allocate + free ------------------------------------------------------------------------

void BM_PoolAllocateFree(benchmark::State& state) {
  PagePool& pool = allocation_pool();
  const int64_t pages = state.range(0);
  for (auto _ : state) {
    Result<PageAllocation> allocation = pool.allocate(request(pages, true));
    benchmark::DoNotOptimize(allocation->data());
    allocation->free().ignore();
  }
}
BENCHMARK(BM_PoolAllocateFree)->Arg(1)->Arg(100)->Threads(1)->Threads(2)->UseRealTime();

// Unpinned: the allocation enters the eviction index at commit and leaves it at free.
void BM_PoolAllocateFreeEvictable(benchmark::State& state) {
  PagePool& pool = allocation_pool();
  const int64_t pages = state.range(0);
  for (auto _ : state) {
    Result<PageAllocation> allocation = pool.allocate(request(pages, false));
    benchmark::DoNotOptimize(allocation->data());
    allocation->free().ignore();
  }
}
BENCHMARK(BM_PoolAllocateFreeEvictable)->Arg(1)->Arg(100)->Threads(1)->Threads(2)->UseRealTime();

void BM_MallocFree(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) * kPageSize;
  for (auto _ : state) {
    void* memory = std::malloc(bytes);
    benchmark::DoNotOptimize(memory);
    std::free(memory);
  }
}
BENCHMARK(BM_MallocFree)->Arg(1)->Arg(100)->Threads(1)->Threads(2)->UseRealTime();

void BM_MapPoolAllocateFree(benchmark::State& state) {
  MapPool& pool = map_pool();
  const auto pages = static_cast<uint32_t>(state.range(0));
  for (auto _ : state) {
    const int64_t start = pool.allocate(pages);
    benchmark::DoNotOptimize(start);
    pool.free(static_cast<uint32_t>(start), pages);
  }
}
BENCHMARK(BM_MapPoolAllocateFree)->Arg(1)->Arg(100)->Threads(1)->Threads(2)->UseRealTime();

// ---- Pin + unpin ----------------------------------------------------------------------------

// range(0) = pins held before: 1 (the KV cache's case: a page pinned by a running sequence,
// pinned again by another) or 0 (pin count 0 <-> 1: the allocation becomes evictable and back).
void BM_PoolPinUnpin(benchmark::State& state) {
  PagePool& pool = allocation_pool();
  Result<PageAllocation> allocation = pool.allocate(request(1, state.range(0) > 0));
  FOLIO_CHECK(allocation.ok());
  for (auto _ : state) {
    allocation->pin().ignore();
    allocation->unpin().ignore();
  }
}
BENCHMARK(BM_PoolPinUnpin)->Arg(1)->Arg(0)->Threads(1)->Threads(2)->UseRealTime();

void BM_MapPoolPinUnpin(benchmark::State& state) {
  MapPool& pool = map_pool();
  const auto start = static_cast<uint32_t>(pool.allocate(1));
  for (auto _ : state) {
    pool.pin(start);
    pool.unpin(start);
  }
  pool.free(start, 1);
}
BENCHMARK(BM_MapPoolPinUnpin)->Threads(1)->Threads(2)->UseRealTime();

// ---- Evict one page -------------------------------------------------------------------------

// A full pool of evictable single pages. Each iteration evicts kEvictionBatch pages one by one,
// timed together by the thread's CPU clock (so that neither the clock read nor preemption by
// other processes on a shared host counts), and refills them untimed; the counter per_eviction is
// the time per eviction. Made on first use, emptied and destroyed by main().
constexpr int kEvictionBatch = 32;
std::unique_ptr<PagePool> g_eviction_pool;
std::once_flag g_eviction_pool_made;

double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

PagePool& eviction_pool() {
  std::call_once(g_eviction_pool_made, [] {
    g_eviction_pool = make_bench_pool(kEvictionPoolPages, 1.0);
    for (int64_t page = 0; page < kEvictionPoolPages; ++page) {
      g_eviction_pool->allocate(request(1, false))->release();
      g_eviction_pool->advance_step();
    }
  });
  return *g_eviction_pool;
}

// Time per eviction: the batch's time over its evictions.
void count_evictions(benchmark::State& state) {
  state.counters["per_eviction"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * kEvictionBatch,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_PoolEvict(benchmark::State& state) {
  PagePool& pool = eviction_pool();
  for (auto _ : state) {
    const double started = thread_cpu_seconds();
    for (int i = 0; i < kEvictionBatch; ++i) benchmark::DoNotOptimize(pool.evict(1));
    state.SetIterationTime(thread_cpu_seconds() - started);
    for (int i = 0; i < kEvictionBatch; ++i) {
      pool.allocate(request(1, false))->release();
      pool.advance_step();
    }
  }
  count_evictions(state);
}
BENCHMARK(BM_PoolEvict)->Threads(1)->Threads(2)->UseManualTime();

MapPool& map_eviction_pool() {
  static MapPool pool(kEvictionPoolPages);
  static const bool filled = [] {
    for (int64_t page = 0; page < kEvictionPoolPages; ++page) {
      pool.add_to_lru(static_cast<uint64_t>(page), static_cast<uint32_t>(pool.allocate(1)));
    }
    return true;
  }();
  (void)filled;
  return pool;
}

void BM_MapPoolEvict(benchmark::State& state) {
  MapPool& pool = map_eviction_pool();
  static std::atomic<uint64_t> step{kEvictionPoolPages};
  for (auto _ : state) {
    const double started = thread_cpu_seconds();
    for (int i = 0; i < kEvictionBatch; ++i) benchmark::DoNotOptimize(pool.evict_one());
    state.SetIterationTime(thread_cpu_seconds() - started);
    for (int i = 0; i < kEvictionBatch; ++i) {
      pool.add_to_lru(step.fetch_add(1), static_cast<uint32_t>(pool.allocate(1)));
    }
  }
  count_evictions(state);
}
BENCHMARK(BM_MapPoolEvict)->Threads(1)->Threads(2)->UseManualTime();

}  // namespace
}  // namespace folio::memory

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  // The eviction pool is full of evictable allocations whose refs were dropped; evicting them
  // all lets it be destroyed (a pool refuses to die with live allocations).
  if (folio::memory::g_eviction_pool != nullptr) {
    folio::memory::g_eviction_pool->evict(folio::memory::kEvictionPoolPages).status().ignore();
    folio::memory::g_eviction_pool.reset();
  }
  return 0;
}
