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
// sequences by recompute (supports_swap() is false).
//
// As a KvCache (kv_cache.h) the group answers admission per member: n tokens fit when each
// member they span can take its share (min(tokens_per_group, n - g * tokens_per_group) tokens)
// above its own watermark; a failed append names the group that had no block.
//
// Thread-safety: one thread (the scheduler's), like the block managers it drives.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "folio/base/result.h"
#include "folio/kv/block_manager.h"
#include "folio/kv/kv_cache.h"

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

class KvParallelCache final : public KvCache {
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
  Status mark_computed(SeqId seq, int32_t num_computed_tokens) override;
  Status free(SeqId seq) override;
  Status fork(SeqId parent, SeqId child) override;

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

  bool contains(SeqId seq) const override { return sequences_.contains(seq); }
  Result<int32_t> num_tokens(SeqId seq) const override;
  // Groups holding part of seq: [0, result).
  Result<int32_t> num_groups_spanned(SeqId seq) const;

  // --- KvCache (kv_cache.h).
  int32_t cache_block_size() const override {
    return groups_.front()->options().geometry.block_size;
  }
  int64_t context_limit() const override { return max_context_tokens(); }
  int32_t num_members() const override { return num_groups(); }
  int32_t members_spanned(int64_t num_tokens) const override {
    return num_tokens <= 0 ? 0 : std::min(groups_for(num_tokens), num_groups());
  }
  bool fits_ever(int32_t num_tokens, bool apply_watermark) const override;
  bool has_room_for(const RoomQuery& query) const override;
  // As allocate(), with the request's watermark and prefix-hit limit; a sequence beyond the
  // group's context is kNeverFits rather than an error.
  Result<AllocateOutcome> allocate_sequence(SeqId seq,
                                            const BlockAllocationRequest& request) override;
  Result<AppendedToken> append_token(SeqId seq, int32_t token) override;
  Result<bool> is_swapped(SeqId seq) const override;
  int64_t num_sequences() const override { return static_cast<int64_t>(sequences_.size()); }
  bool supports_swap() const override { return false; }
  Result<SwapOutcome> swap_out(std::span<const SeqId> seqs) override;
  Result<SwapOutcome> swap_in(std::span<const SeqId> seqs, bool apply_watermark) override;
  Status apply_pending_copies() override;
  BlockCounts total_counts() const override;
  PrefixCacheStats total_prefix_stats() const override;
  int64_t total_sequence_blocks() const override;
  int64_t total_reserved_blocks() const override;
  // Every group's invariants, and every sequence held by exactly the groups it spans with its
  // share of the tokens.
  void check_cache_invariants() const override;

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
  // The tokens of a sequence of num_tokens that group g holds.
  int32_t share_of(int64_t num_tokens, int32_t group) const {
    return static_cast<int32_t>(
        std::clamp<int64_t>(num_tokens - int64_t{group} * tokens_per_group_, 0, tokens_per_group_));
  }
  Result<KvpAllocateOutcome> allocate_spread(SeqId seq, const BlockAllocationRequest& request);

  std::vector<BlockManager*> groups_;
  int32_t tokens_per_group_;
  std::unordered_map<SeqId, Sequence> sequences_;
};

}  // namespace folio::kv
