// Helpers for page pool tests: a host VirtualMemory with a pool on it, and an eviction listener
// that records what it is told.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <vector>

#include "folio/device/host_virtual_memory.h"
#include "folio/memory/page_pool.h"

namespace folio::memory::testing {

inline constexpr size_t kSmallPage = 4096;

// Owns the VirtualMemory and the pool on it; the pool goes first.
struct TestPool {
  std::unique_ptr<device::VirtualMemory> vm;
  std::unique_ptr<PagePool> pool;
  PagePool* operator->() const { return pool.get(); }
  PagePool& operator*() const { return *pool; }
};

inline PagePoolOptions small_options(int64_t num_pages) {
  PagePoolOptions options;
  options.name = "test";
  options.page_size = kSmallPage;
  options.num_pages = num_pages;
  return options;
}

inline TestPool make_pool(const PagePoolOptions& options) {
  TestPool result;
  Result<std::unique_ptr<device::VirtualMemory>> vm = device::make_host_virtual_memory();
  EXPECT_TRUE(vm.ok()) << vm.status().to_string();
  result.vm = std::move(*vm);
  Result<std::unique_ptr<PagePool>> pool = PagePool::create(*result.vm, options);
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  if (pool.ok()) result.pool = std::move(*pool);
  return result;
}

inline PageAllocationRequest request(int64_t pages, ContentType content = ContentType::kTemporary,
                                     bool pinned = true, EvictionListener* listener = nullptr,
                                     uint64_t owner = 0) {
  PageAllocationRequest result;
  result.num_pages = pages;
  result.content = content;
  result.pinned = pinned;
  result.listener = listener;
  result.owner = owner;
  return result;
}

// Records every notice; thread-safe.
class RecordingListener : public EvictionListener {
 public:
  void on_evict(const EvictionNotice& notice) override {
    std::lock_guard lock(mutex_);
    notices_.push_back(notice);
  }
  std::vector<EvictionNotice> notices() const {
    std::lock_guard lock(mutex_);
    return notices_;
  }
  size_t count() const {
    std::lock_guard lock(mutex_);
    return notices_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::vector<EvictionNotice> notices_;
};

}  // namespace folio::memory::testing
