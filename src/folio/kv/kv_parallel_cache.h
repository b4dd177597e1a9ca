// KvParallelCache: KV-parallel (KVP) groups, after seed 003's KVP state tracker. A sequence too
// long for one group's capacity is split by token range: group g holds positions
// [g * tokens_per_group, (g + 1) * tokens_per_group), each group being its own block manager
// (usually on its own device). Appends go to the group that owns the new position; the first
// token past a group's range opens the sequence in the next group.
//
// Allocation across groups is all or nothing: every group prepares a reservation (holding its
// blocks, invisible), and only when all succeed are they committed; otherwise every prepared
// reservation is rolled back, leaving every group exactly as it was (block states, reference
// counts, prefix index, LRU order, held pages).
//
// Prefix reuse spans groups: a group's first block is chained to the key of the previous
// group's last block, and a group may serve cached tokens only if every earlier group served
// its whole range (cached KV must be a prefix of the sequence).
//
// Swap is per group (BlockManager) and not coordinated here; the scheduler preempts KVP
// sequences by recompute.
//
// Thread-safety: one thread (the scheduler's), like the block managers it drives.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "folio/base/result.h"
#include "folio/kv/block_manager.h"

namespace folio::kv {

struct KvpAllocateOutcome {
  Admission admission = Admission::kNoCapacityNow;
  int32_t num_cached_tokens = 0;
  int32_t num_groups = 0;  // groups the sequence spans
};

struct KvpAppendOutcome {
  AppendStatus status = AppendStatus::kNoCapacityNow;
  int32_t group = -1;  // the group that holds the new token
  int64_t slot = -1;   // in that group's cache
  std::optional<BlockCopy> copy_on_write;
};

class KvParallelCache {
 public:
  // Requires the groups to outlive the cache. Errors: no groups, groups with different block
  // sizes, or a tokens_per_group that is not a positive multiple of the block size or exceeds
  // a group's context limit.
  static Result<std::unique_ptr<KvParallelCache>> create(std::vector<BlockManager*> groups,
                                                         int32_t tokens_per_group);

  int32_t num_groups() const { return static_cast<int32_t>(groups_.size()); }
  int32_t tokens_per_group() const { return tokens_per_group_; }
  int64_t max_context_tokens() const { return int64_t{tokens_per_group_} * num_groups(); }
  BlockManager& group(int32_t index) { return *groups_[index]; }
  const BlockManager& group(int32_t index) const { return *groups_[index]; }

  Result<KvpAllocateOutcome> allocate(SeqId seq, std::span<const int32_t> tokens,
                                      const CacheNamespace& cache_namespace = {});
  Result<KvpAppendOutcome> append_slot(SeqId seq, int32_t token);
  Status mark_computed(SeqId seq, int32_t num_computed_tokens);
  Status free(SeqId seq);
  Status fork(SeqId parent, SeqId child);

  // --- Export for one member's step (dist.md "KV-parallel groups"): every member runs the same
  // step over its own cache, which holds positions [group * tokens_per_group, (group + 1) *
  // tokens_per_group) of each sequence.
  // Fills i32 [seqs.size(), max_blocks_per_sequence] with each sequence's blocks in `group`
  // (entry 0: the block of the range's first position); rows of sequences that do not reach
  // the group hold its dummy block. Checks every sequence before writing anything.
  Status fill_block_tables(int32_t group, std::span<const SeqId> seqs,
                           int32_t max_blocks_per_sequence, std::span<int32_t> out) const;
  // Fills i32 [out.size()] segment after segment: a token whose position `group` holds gets
  // its slot there, every other token -1 (written by another member); entries past the last
  // segment -1 too.
  Status fill_slot_mapping(int32_t group, std::span<const StepSegment> segments,
                           std::span<int32_t> out) const;

  bool contains(SeqId seq) const { return sequences_.contains(seq); }
  Result<int32_t> num_tokens(SeqId seq) const;
  // Groups holding part of seq: [0, result).
  Result<int32_t> num_groups_spanned(SeqId seq) const;

 private:
  struct Sequence {
    int32_t num_tokens = 0;
    int32_t num_computed = 0;
    CacheNamespace cache_namespace;
  };

  KvParallelCache(std::vector<BlockManager*> groups, int32_t tokens_per_group)
      : groups_(std::move(groups)), tokens_per_group_(tokens_per_group) {}
  int32_t groups_for(int64_t num_tokens) const {
    return static_cast<int32_t>((num_tokens + tokens_per_group_ - 1) / tokens_per_group_);
  }
  Result<KvpAppendOutcome> open_next_group(SeqId seq, Sequence& sequence, int32_t token);

  std::vector<BlockManager*> groups_;
  int32_t tokens_per_group_;
  std::unordered_map<SeqId, Sequence> sequences_;
};

}  // namespace folio::kv
