#include "folio/kv/host_swap_space.h"

#include <new>

#include "folio/base/check.h"

namespace folio::kv {

namespace {
constexpr std::align_val_t kAlignment{64};
}  // namespace

HostSwapSpace::HostSwapSpace(int64_t block_bytes, int32_t num_blocks)
    : block_bytes_(block_bytes), ref_counts_(static_cast<size_t>(num_blocks), 0) {
  FOLIO_CHECK(block_bytes > 0 && num_blocks >= 0);
  if (num_blocks > 0) {
    base_ = static_cast<std::byte*>(::operator new(
        static_cast<size_t>(block_bytes) * static_cast<size_t>(num_blocks), kAlignment));
  }
  free_blocks_.reserve(static_cast<size_t>(num_blocks));
  for (int32_t block = num_blocks - 1; block >= 0; --block) free_blocks_.push_back(block);
}

HostSwapSpace::~HostSwapSpace() {
  if (base_ != nullptr) ::operator delete(base_, kAlignment);
}

bool HostSwapSpace::allocate(int32_t count, std::vector<int32_t>& blocks) {
  FOLIO_CHECK(count >= 0);
  if (count > num_free()) return false;
  for (int32_t index = 0; index < count; ++index) {
    const int32_t block = free_blocks_.back();
    free_blocks_.pop_back();
    ref_counts_[block] = 1;
    blocks.push_back(block);
  }
  return true;
}

void HostSwapSpace::add_reference(int32_t block) {
  FOLIO_CHECK(ref_counts_[block] >= 1, "host swap block {} is not in use", block);
  ++ref_counts_[block];
}

void HostSwapSpace::release(int32_t block) {
  FOLIO_CHECK(ref_counts_[block] >= 1, "host swap block {} released twice", block);
  if (--ref_counts_[block] == 0) free_blocks_.push_back(block);
}

void HostSwapSpace::check_invariants(std::span<const int32_t> expected_ref_counts) const {
  FOLIO_CHECK(expected_ref_counts.size() == ref_counts_.size());
  std::vector<int32_t> on_stack(ref_counts_.size(), 0);
  for (int32_t block : free_blocks_) ++on_stack[block];
  for (size_t block = 0; block < ref_counts_.size(); ++block) {
    FOLIO_CHECK(ref_counts_[block] == expected_ref_counts[block],
                "host swap block {} has {} references but {} tables hold it", block,
                ref_counts_[block], expected_ref_counts[block]);
    FOLIO_CHECK(on_stack[block] == (ref_counts_[block] == 0 ? 1 : 0),
                "host swap block {} is on the free stack {} times", block, on_stack[block]);
  }
}

}  // namespace folio::kv
