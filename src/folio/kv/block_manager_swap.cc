// BlockManager: swapping sequences out to the host swap space and back.
#include <unordered_map>

#include "folio/base/check.h"
#include "folio/kv/block_manager.h"

namespace folio::kv {

Status BlockManager::validate_swap_set(std::span<const SeqId> seqs, bool want_swapped) const {
  const char* operation = want_swapped ? "swap_in" : "swap_out";
  if (swap_space_ == nullptr) {
    return failed_precondition("{}: this block manager has no host swap space", operation);
  }
  for (size_t index = 0; index < seqs.size(); ++index) {
    const auto entry = sequences_.find(seqs[index]);
    if (entry == sequences_.end()) {
      return not_found("{}: sequence {} is not in the KV cache", operation, seqs[index]);
    }
    if (entry->second.swapped != want_swapped) {
      return failed_precondition("{}: sequence {} is already {}", operation, seqs[index],
                                 want_swapped ? "resident" : "swapped out");
    }
    for (size_t earlier = 0; earlier < index; ++earlier) {
      if (seqs[earlier] == seqs[index]) {
        return invalid_argument("{}: sequence {} is listed twice", operation, seqs[index]);
      }
    }
  }
  return Status();
}

// Blocks shared by several of the sequences (forks) are copied once and stay shared on the host.
Result<SwapOutcome> BlockManager::swap_out(std::span<const SeqId> seqs) {
  FOLIO_RETURN_IF_ERROR(begin_operation());
  FOLIO_RETURN_IF_ERROR(validate_swap_set(seqs, /*want_swapped=*/false));
  // Queued copy-on-write pairs may target these blocks: their bytes must be final first.
  FOLIO_RETURN_IF_ERROR(apply_pending_copies());
  std::unordered_map<int32_t, int32_t> host_of_device;
  std::vector<BlockCopy> copies;
  for (SeqId seq : seqs) {
    for (int32_t block : sequences_.at(seq).blocks) {
      if (host_of_device.emplace(block, -1).second) copies.push_back(BlockCopy{block, -1});
    }
  }
  std::vector<int32_t> host_blocks;
  if (!swap_space_->allocate(static_cast<int32_t>(copies.size()), host_blocks)) {
    return SwapOutcome{SwapStatus::kNoCapacityNow, 0};
  }
  for (size_t index = 0; index < copies.size(); ++index) {
    copies[index].destination = host_blocks[index];
    host_of_device[copies[index].source] = host_blocks[index];
  }
  if (Status status = copier_.copy_to_host(layout(), *swap_space_, copies); !status.ok()) {
    for (int32_t host_block : host_blocks) swap_space_->release(host_block);
    return status.with_context("swap_out");
  }
  // Each host block starts with one reference; every further table holding it adds one.
  std::unordered_map<int32_t, int32_t> seen;
  for (SeqId seq : seqs) {
    Sequence& sequence = sequences_.at(seq);
    for (auto block = sequence.blocks.rbegin(); block != sequence.blocks.rend(); ++block) {
      release_block(*block);
    }
    for (int32_t& block : sequence.blocks) {
      const int32_t host_block = host_of_device.at(block);
      if (!seen.emplace(host_block, 0).second) swap_space_->add_reference(host_block);
      block = host_block;
    }
    sequence.swapped = true;
  }
  allocator_->release_surplus_pages(options_.keep_empty_pages);
  return SwapOutcome{SwapStatus::kSwapped, static_cast<int32_t>(copies.size())};
}

Result<SwapOutcome> BlockManager::swap_in(std::span<const SeqId> seqs, bool apply_watermark) {
  FOLIO_RETURN_IF_ERROR(begin_operation());
  FOLIO_RETURN_IF_ERROR(validate_swap_set(seqs, /*want_swapped=*/true));
  FOLIO_RETURN_IF_ERROR(flush_copies_if_needed());
  std::unordered_map<int32_t, int32_t> device_of_host;
  std::vector<BlockCopy> copies;
  for (SeqId seq : seqs) {
    for (int32_t host_block : sequences_.at(seq).blocks) {
      if (device_of_host.emplace(host_block, -1).second) copies.push_back({host_block, -1});
    }
  }
  AcquireRequest request;
  request.num_blocks = static_cast<int32_t>(copies.size());
  // A preempted sequence is admitted anew, under the watermark unless the caller says not.
  request.watermark_blocks = apply_watermark ? watermark_blocks_ : 0;
  int32_t num_hits = 0;
  allocator_->begin();
  if (allocator_->acquire(request, scratch_blocks_, num_hits) != AcquireStatus::kAcquired) {
    allocator_->rollback();
    return SwapOutcome{SwapStatus::kNoCapacityNow, 0};
  }
  for (size_t index = 0; index < copies.size(); ++index) {
    copies[index].destination = scratch_blocks_[index].value();
    device_of_host[copies[index].source] = copies[index].destination;
  }
  if (Status status = copier_.copy_to_device(layout(), *swap_space_, copies); !status.ok()) {
    allocator_->rollback();
    return status.with_context("swap_in");
  }
  allocator_->commit();
  std::unordered_map<int32_t, int32_t> seen;
  for (SeqId seq : seqs) {
    Sequence& sequence = sequences_.at(seq);
    for (int32_t& block : sequence.blocks) {
      const int32_t device_block = device_of_host.at(block);
      if (!seen.emplace(device_block, 0).second) allocator_->add_reference(BlockId(device_block));
      swap_space_->release(block);
      block = device_block;
    }
    sequence.swapped = false;
    // The copies hold the same KV as before: offer the computed full blocks to the index again.
    sequence.num_registered = 0;
    register_computed_blocks(sequence);
  }
  return SwapOutcome{SwapStatus::kSwapped, static_cast<int32_t>(copies.size())};
}

}  // namespace folio::kv
