// Step memory: the executor's own memory, taken from the page pool so that every byte a step
// uses counts against the one budget (DESIGN.md, "two granularities, one budget"; issue 14).
//   - persistent input buffers (persistent_inputs.h): one pinned allocation, content kTemporary,
//     for the executor's lifetime (captured programs hold their addresses);
//   - persistent output buffers and the outputs of eager steps (OutputBuffers): a PoolRegion of
//     content kTemporary each; the eager one grows when a larger step needs more;
//   - the activations and workspaces of eager steps: a PoolRegion of content kActivation, grown
//     to the largest eager step seen and kept (pinned) until the executor releases it as idle.
//
// PoolRegion: a virtually contiguous region backed by pinned pool pages that need not be
// contiguous in the pool. It reserves an address range as large as the pool once and maps pool
// pages into it in order (the pool's physical memory at physical_offset(page), as the graph
// arena does), so a region grows without moving and a fragmented pool (the KV cache's pages
// interleaved with free ones) can still give it every free page: growth takes one contiguous
// run when the pool has one, else single pages.
//
// Failures: when the pool cannot give the pages even after evicting, kResourceExhausted, naming
// what the memory was for and the pool's counts; the region is unchanged (pages taken for the
// failed growth are given back).
//
// Thread-safety: a PoolRegion and OutputBuffers belong to one executor's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "folio/base/result.h"
#include "folio/exec/host_buffer.h"
#include "folio/ir/graph.h"
#include "folio/memory/page_pool.h"

namespace folio::exec {

// The owner id the executor's allocations carry in the pool (the arena's is 1, the KV cache's 2).
inline constexpr uint64_t kExecutorPoolOwner = 3;

// `bytes` (> 0) rounded up to whole pages of `pool`, one contiguous run, pinned, the first
// `bytes` zero-filled, content `content`. kResourceExhausted naming `purpose` when the pool
// cannot give them.
Result<memory::PageAllocation> allocate_step_memory(memory::PagePool& pool, size_t bytes,
                                                    memory::ContentType content,
                                                    std::string_view purpose);

// A window [data, data + size) of pool memory; valid while the memory lives.
class PoolSlice {
 public:
  PoolSlice() = default;
  PoolSlice(std::byte* data, size_t bytes) : data_(data), bytes_(bytes) {}
  std::byte* data() const { return data_; }
  size_t size() const { return bytes_; }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data_);
  }

 private:
  std::byte* data_ = nullptr;
  size_t bytes_ = 0;
};

// Offsets of consecutive buffers in one block, each aligned to kBufferAlignment.
class SliceLayout {
 public:
  // The offset of a new buffer of `bytes`.
  size_t add(size_t bytes) {
    const size_t offset = total_;
    total_ += round_up(bytes, kBufferAlignment);
    return offset;
  }
  size_t total() const { return total_; }

 private:
  size_t total_ = 0;
};

// Invariant: [data(), data() + size_bytes()) is mapped onto pages_, in order; every page is
// pinned and of content content_.
class PoolRegion {
 public:
  PoolRegion(memory::PagePool& pool, memory::ContentType content, std::string purpose)
      : pool_(pool), content_(content), purpose_(std::move(purpose)) {}
  ~PoolRegion();
  PoolRegion(const PoolRegion&) = delete;
  PoolRegion& operator=(const PoolRegion&) = delete;

  // Grows the region to at least `bytes` (whole pages); bytes up to `bytes` that were not part
  // of the region before start zeroed. Existing bytes keep their addresses and contents.
  // kResourceExhausted when the pool cannot give the pages (the region is unchanged); the
  // VirtualMemory's errors otherwise.
  Status grow_to(size_t bytes);
  // Gives back the pages beyond the first `bytes` that growth added as whole runs (so it may
  // keep a little more than `bytes`); truncate_to(0) gives back everything.
  void truncate_to(size_t bytes);

  std::byte* data() const { return range_.base; }
  // Bytes mapped (whole pages).
  size_t size_bytes() const { return mapped_bytes_; }

 private:
  // Maps `allocation` at the end of the region.
  Status append(memory::PageAllocation allocation);

  memory::PagePool& pool_;
  const memory::ContentType content_;
  const std::string purpose_;
  device::AddressRange range_;  // reserved on first growth: the pool's size
  std::vector<memory::PageAllocation> runs_;
  size_t mapped_bytes_ = 0;
};

// Output buffers by tensor name, laid out in one PoolRegion (content kTemporary).
class OutputBuffers {
 public:
  OutputBuffers(memory::PagePool& pool, std::string purpose)
      : region_(pool, memory::ContentType::kTemporary, std::move(purpose)) {}

  // Addresses (indexed by tensor id, null for non-outputs) of every output of `graph`. When an
  // output is missing or too small: with `grow`, every buffer is laid out again in a grown
  // region (earlier addresses and contents are gone); without, kInvalidArgument. Errors of
  // growing: the region's (kResourceExhausted), leaving the buffers as they were.
  Result<std::vector<std::byte*>> bind(const ir::Graph& graph, bool grow);
  // The buffer named `name`, or an empty slice.
  PoolSlice find(std::string_view name) const;
  // Pool bytes held (whole pages).
  size_t pool_bytes() const { return region_.size_bytes(); }
  // Gives back the pages beyond `bytes` (see PoolRegion::truncate_to); the layout is kept only
  // when it still fits.
  void truncate_to(size_t bytes);

 private:
  struct Slot {
    std::string name;
    size_t offset = 0;
    size_t bytes = 0;
  };
  const Slot* slot(std::string_view name) const;

  PoolRegion region_;
  std::vector<Slot> slots_;
};

}  // namespace folio::exec
