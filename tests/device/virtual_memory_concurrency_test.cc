// Multi-threaded stress of host VirtualMemory, meant for ThreadSanitizer (label `concurrency`);
// not a benchmark. Threads run whole reserve / map / write / read / unmap / release lifecycles
// at once over their own ranges and slices of one shared physical memory, while another thread
// grows a memory the others map from; racing releases of one handle must succeed exactly once.
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "folio/device/host_virtual_memory.h"

namespace folio::device {
namespace {

constexpr int kThreads = 4;

std::unique_ptr<VirtualMemory> make_vm() {
  Result<std::unique_ptr<VirtualMemory>> made = make_host_virtual_memory();
  FOLIO_CHECK(made.ok(), "{}", made.status().to_string());
  return std::move(made).value();
}

// One thread's lifecycle loop: two views of its own two pages of `shared`, plus a page of the
// grown memory when it has one; checks every byte it wrote arrives through the other view.
// Returns the number of failed checks.
int run_lifecycles(VirtualMemory& vm, const PhysicalMemory& shared, const PhysicalMemory& growing,
                   std::atomic<size_t>& growing_pages, int thread_index, int iterations) {
  const size_t page = vm.granularity();
  int failures = 0;
  for (int iteration = 0; iteration < iterations; ++iteration) {
    Result<AddressRange> first = vm.reserve(3 * page);
    Result<AddressRange> second = vm.reserve(2 * page);
    if (!first.ok() || !second.ok()) return failures + 1;
    const size_t slice = static_cast<size_t>(thread_index) * 2 * page;
    failures += !vm.map(*first, 0, shared, slice, 2 * page).ok();
    failures += !vm.map(*second, 0, shared, slice, 2 * page).ok();
    // The grower publishes the size with release after grow() returns; acquire here makes
    // every page below it mappable.
    const size_t pages_now = growing_pages.load(std::memory_order_acquire);
    const size_t growing_page = static_cast<size_t>(iteration) % pages_now;
    failures += !vm.map(*first, 2 * page, growing, growing_page * page, page).ok();
    const uint64_t word = (uint64_t{static_cast<uint32_t>(thread_index)} << 32) | iteration;
    std::memcpy(first->base + page, &word, sizeof(word));
    uint64_t seen = 0;
    std::memcpy(&seen, second->base + page, sizeof(seen));
    failures += seen != word;
    failures += !vm.unmap(*first, 0, 3 * page).ok();
    failures += !vm.release(*first).ok();
    failures += !vm.release(*second).ok();  // releases with its mapping still in place
  }
  return failures;
}

TEST(VirtualMemoryConcurrencyTest, ConcurrentLifecyclesOnDifferentRangesStayConsistent) {
  std::unique_ptr<VirtualMemory> vm = make_vm();
  const size_t page = vm->granularity();
  const PhysicalMemory shared = *vm->create(kThreads * 2 * page);
  PhysicalMemory growing = *vm->create(page);
  std::atomic<size_t> growing_pages{1};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  // Workers get their own copy of the handle: grow() writes the size of the one it is given.
  const PhysicalMemory growing_handle = growing;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back(
        [&, t] { failures += run_lifecycles(*vm, shared, growing_handle, growing_pages, t, 200); });
  }
  threads.emplace_back([&] {
    for (size_t pages = 2; pages <= 64; ++pages) {
      if (!vm->grow(growing, pages * page).ok()) ++failures;
      growing_pages.store(pages, std::memory_order_release);
    }
  });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(vm->resident_bytes(growing_handle).value_or(0), 64 * page);
  EXPECT_TRUE(vm->release(shared).ok());
  EXPECT_TRUE(vm->release(growing).ok());
}

TEST(VirtualMemoryConcurrencyTest, RacingReleasesOfOneHandleSucceedExactlyOnce) {
  std::unique_ptr<VirtualMemory> vm = make_vm();
  const size_t page = vm->granularity();
  for (int round = 0; round < 50; ++round) {
    const AddressRange range = *vm->reserve(page);
    const PhysicalMemory memory = *vm->create(page);
    ASSERT_TRUE(vm->map(range, 0, memory, 0, page).ok());
    std::atomic<int> range_successes{0};
    std::atomic<int> memory_successes{0};
    std::atomic<int> wrong_codes{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        const Status range_status = vm->release(range);
        const Status memory_status = vm->release(memory);
        range_successes += range_status.ok();
        memory_successes += memory_status.ok();
        for (const Status& status : {range_status, memory_status}) {
          if (!status.ok() && status.code() != StatusCode::kFailedPrecondition) ++wrong_codes;
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    EXPECT_EQ(range_successes.load(), 1);
    EXPECT_EQ(memory_successes.load(), 1);
    EXPECT_EQ(wrong_codes.load(), 0);
    // Whoever won, both handles are gone now.
    EXPECT_EQ(vm->release(range).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(vm->release(memory).code(), StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace folio::device
