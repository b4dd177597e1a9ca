// BlockManager: block tables and slot mappings for kernels, and the invariant walk.
#include <algorithm>
#include <bit>

#include "folio/base/check.h"
#include "folio/kv/block_manager.h"

namespace folio::kv {

Result<std::span<const int32_t>> BlockManager::block_table(SeqId seq) const {
  FOLIO_ASSIGN_OR_RETURN(const Sequence* sequence, find_resident(seq, "block_table"));
  return std::span<const int32_t>(sequence->blocks);
}

Status BlockManager::fill_block_tables(std::span<const SeqId> seqs, int32_t max_blocks_per_sequence,
                                       std::span<int32_t> out) const {
  if (max_blocks_per_sequence <= 0) {
    return invalid_argument("fill_block_tables: max_blocks_per_sequence must be positive");
  }
  const auto row = static_cast<size_t>(max_blocks_per_sequence);
  if (out.size() < seqs.size() * row) {
    return invalid_argument("fill_block_tables: buffer of {} entries is too small for {} x {}",
                            out.size(), seqs.size(), row);
  }
  for (SeqId seq : seqs) {
    FOLIO_ASSIGN_OR_RETURN(const Sequence* sequence, find_resident(seq, "fill_block_tables"));
    if (sequence->blocks.size() > row) {
      return out_of_range(
          "fill_block_tables: sequence {} has {} blocks, more than the {} a row holds", seq,
          sequence->blocks.size(), row);
    }
  }
  for (size_t index = 0; index < seqs.size(); ++index) {
    const std::vector<int32_t>& blocks = sequences_.at(seqs[index]).blocks;
    int32_t* destination = out.data() + index * row;
    std::copy(blocks.begin(), blocks.end(), destination);
    std::fill(destination + blocks.size(), destination + row, dummy_block_.value());
  }
  return Status();
}

Status BlockManager::fill_slot_mapping(std::span<const StepSegment> segments,
                                       std::span<int32_t> out) const {
  const int32_t block_size = options_.geometry.block_size;
  const int32_t block_shift = std::countr_zero(static_cast<uint32_t>(block_size));
  size_t total = 0;
  for (const StepSegment& segment : segments) {
    FOLIO_ASSIGN_OR_RETURN(const Sequence* sequence,
                           find_resident(segment.seq, "fill_slot_mapping"));
    if (segment.first_position < 0 || segment.num_tokens < 0 ||
        int64_t{segment.first_position} + segment.num_tokens >
            static_cast<int64_t>(sequence->tokens.size())) {
      return out_of_range(
          "fill_slot_mapping: positions [{}, {}) of sequence {} are outside its {} tokens",
          segment.first_position, int64_t{segment.first_position} + segment.num_tokens, segment.seq,
          sequence->tokens.size());
    }
    total += static_cast<size_t>(segment.num_tokens);
  }
  if (total > out.size()) {
    return invalid_argument("fill_slot_mapping: {} step tokens do not fit a buffer of {}", total,
                            out.size());
  }
  size_t index = 0;
  for (const StepSegment& segment : segments) {
    const std::vector<int32_t>& blocks = sequences_.at(segment.seq).blocks;
    for (int32_t position = segment.first_position;
         position < segment.first_position + segment.num_tokens; ++position) {
      // block_size is a power of two: shifts and masks instead of divisions.
      out[index++] = blocks[position >> block_shift] * block_size + (position & (block_size - 1));
    }
  }
  // Padding tokens write to the dummy blocks; spreading them over their (contiguous) slots
  // keeps parallel writes from piling onto one address.
  const int32_t dummy_slots = options_.num_dummy_blocks * block_size;
  for (size_t padding = 0; index < out.size(); ++index, ++padding) {
    out[index] = dummy_block_.value() * block_size + static_cast<int32_t>(padding % dummy_slots);
  }
  return Status();
}

void BlockManager::check_invariants() const {
  FOLIO_CHECK(!reservation_open_, "check_invariants() while a reservation is open");
  const int32_t block_size = options_.geometry.block_size;
  std::vector<int32_t> device_references(static_cast<size_t>(allocator_->capacity_blocks()), 0);
  std::vector<int32_t> host_references(
      swap_space_ != nullptr ? static_cast<size_t>(swap_space_->num_blocks()) : 0, 0);
  for (int32_t dummy = 0; dummy < options_.num_dummy_blocks; ++dummy) {
    ++device_references[dummy_block_.value() + dummy];
  }
  for (const auto& [seq, sequence] : sequences_) {
    const auto num_tokens = static_cast<int64_t>(sequence.tokens.size());
    FOLIO_CHECK(
        static_cast<int64_t>(sequence.blocks.size()) == (num_tokens + block_size - 1) / block_size,
        "sequence {} has {} tokens but {} blocks", seq, num_tokens, sequence.blocks.size());
    FOLIO_CHECK(static_cast<int64_t>(sequence.block_hashes.size()) <= num_tokens / block_size);
    uint64_t parent = sequence.parent_hash;
    for (size_t index = 0; index < sequence.block_hashes.size(); ++index) {
      parent = hash_block(
          parent, std::span<const int32_t>(sequence.tokens).subspan(index * block_size, block_size),
          sequence.cache_namespace);
      FOLIO_CHECK(sequence.block_hashes[index] == parent, "sequence {} block {} has a stale key",
                  seq, index);
    }
    FOLIO_CHECK(sequence.num_registered == sequence.num_computed / block_size,
                "sequence {} offered {} blocks to the prefix index but computed {} tokens", seq,
                sequence.num_registered, sequence.num_computed);
    FOLIO_CHECK(sequence.num_computed <= num_tokens);
    for (int32_t block : sequence.blocks) {
      ++(sequence.swapped ? host_references : device_references)[block];
    }
  }
  allocator_->check_invariants(device_references);
  for (int32_t dummy = 0; dummy < options_.num_dummy_blocks; ++dummy) {
    const BlockId block(dummy_block_.value() + dummy);
    FOLIO_CHECK(allocator_->state(block) == BlockState::kOwned &&
                !allocator_->is_registered(block));
  }
  if (swap_space_ != nullptr) swap_space_->check_invariants(host_references);
  for (const BlockCopy& copy : pending_copies_) {
    FOLIO_CHECK(copy_pending_[copy.source] != 0 && copy_pending_[copy.destination] != 0);
  }
}

}  // namespace folio::kv
