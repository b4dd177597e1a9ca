// HostSwapSpace: the host-memory pool that swapped-out sequences' KV blocks are copied into.
//
// A fixed budget of `num_blocks` host blocks of `block_bytes` each, in one allocation; host
// block h lives at base + h * block_bytes. Host blocks are reference counted like device blocks
// (sequences forked before being swapped out together share them). Allocation is all or
// nothing.
//
// Invariants: every block is free (ref 0, on the free stack exactly once) or used (ref >= 1).
// Thread-safety: owned by one thread (the block manager's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace folio::kv {

class HostSwapSpace {
 public:
  // Requires: block_bytes > 0, num_blocks >= 0.
  HostSwapSpace(int64_t block_bytes, int32_t num_blocks);
  ~HostSwapSpace();
  HostSwapSpace(const HostSwapSpace&) = delete;
  HostSwapSpace& operator=(const HostSwapSpace&) = delete;

  int64_t block_bytes() const { return block_bytes_; }
  int32_t num_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_blocks_.size()); }
  std::byte* block_address(int32_t block) const { return base_ + block * block_bytes_; }

  // Appends `count` blocks (ref 1 each) to `blocks`, or returns false and changes nothing.
  bool allocate(int32_t count, std::vector<int32_t>& blocks);
  // Requires: the block is used.
  void add_reference(int32_t block);
  void release(int32_t block);
  int32_t ref_count(int32_t block) const { return ref_counts_[block]; }

  // Aborts unless each block's count equals expected_ref_counts[block] and the free stack holds
  // exactly the blocks with count 0.
  void check_invariants(std::span<const int32_t> expected_ref_counts) const;

 private:
  const int64_t block_bytes_;
  std::byte* base_ = nullptr;
  std::vector<int32_t> ref_counts_;
  std::vector<int32_t> free_blocks_;  // a stack
};

}  // namespace folio::kv
