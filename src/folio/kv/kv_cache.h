// KvCache: what the scheduler and the engine need of a sequences' KV cache, whether it is one
// block manager (BlockManager) or a KV-parallel group of them (KvParallelCache, dist.md
// "KV-parallel groups"), so that one scheduler code path serves both.
//
// Admission is asked in tokens, not blocks: a group holds a sequence's tokens by range over
// several members, each with its own capacity and watermark, so "n tokens fit" means each
// spanned member can take its share. For one block manager the questions reduce to its block
// arithmetic (blocks = ceil(tokens / block_size) against obtainable blocks and the watermark).
//
// Growth names the member that holds (or lacked room for) the new token, so a scheduler that
// preempts on a failed append knows whose blocks it needs (AppendedToken::member).
//
// Swap is optional (supports_swap()): a group preempts by recompute only.
//
// Thread-safety: one thread (the scheduler's), like the block managers behind it.
#pragma once

#include <cstdint>
#include <span>

#include "folio/base/result.h"
#include "folio/kv/block_allocator.h"
#include "folio/kv/kv_types.h"

namespace folio::kv {

struct BlockAllocationRequest;
struct AllocateOutcome;
struct SwapOutcome;
enum class AppendStatus;

// A question about room for a sequence of num_tokens right now: every member that would hold
// part of it must keep, after taking its share, at least the largest of: its watermark (when
// apply_watermark), reserve_blocks, and ceil(reserve_fraction * its max_sequence_blocks).
struct RoomQuery {
  int32_t num_tokens = 0;
  bool apply_watermark = true;
  int64_t reserve_blocks = 0;
  double reserve_fraction = 0.0;
};

// One token appended to a sequence (KvCache::append_token).
struct AppendedToken {
  AppendStatus status;
  // The member that holds the new token (0 for one block manager); on kNoCapacityNow, the
  // member that had no block for it.
  int32_t member = 0;
};

class KvCache {
 public:
  virtual ~KvCache() = default;

  // --- Shape.
  virtual int32_t cache_block_size() const = 0;
  // The longest sequence accepted (over every member of a group).
  virtual int64_t context_limit() const = 0;
  // 1 for one block manager, P for a group of P members.
  virtual int32_t num_members() const = 0;
  // Members holding part of a sequence of num_tokens: [0, result). A preemption victim frees
  // blocks in member m only if it spans it.
  virtual int32_t members_spanned(int64_t num_tokens) const = 0;

  // --- Admission arithmetic, in tokens (ignoring prefix hits).
  // Whether a sequence of num_tokens could ever be held (while nothing else is), keeping each
  // spanned member's watermark free when apply_watermark. False beyond context_limit().
  virtual bool fits_ever(int32_t num_tokens, bool apply_watermark) const = 0;
  // Whether a sequence could be given room now (see RoomQuery).
  virtual bool has_room_for(const RoomQuery& query) const = 0;

  // --- Sequences.
  // Allocates request.tokens for seq, all or nothing (over every spanned member of a group);
  // kNeverFits when it could never be held (fits_ever), kNoCapacityNow when a member is short
  // now. request.parent_hash must be the root (the cache chains its members itself).
  virtual Result<AllocateOutcome> allocate_sequence(SeqId seq,
                                                    const BlockAllocationRequest& request) = 0;
  virtual Result<AppendedToken> append_token(SeqId seq, int32_t token) = 0;
  virtual Status mark_computed(SeqId seq, int32_t num_computed_tokens) = 0;
  virtual Status free(SeqId seq) = 0;
  virtual Status fork(SeqId parent, SeqId child) = 0;
  virtual bool contains(SeqId seq) const = 0;
  virtual Result<int32_t> num_tokens(SeqId seq) const = 0;
  virtual Result<bool> is_swapped(SeqId seq) const = 0;
  virtual int64_t num_sequences() const = 0;

  // --- Swap (only when supports_swap(); otherwise kFailedPrecondition).
  virtual bool supports_swap() const = 0;
  virtual Result<SwapOutcome> swap_out(std::span<const SeqId> seqs) = 0;
  virtual Result<SwapOutcome> swap_in(std::span<const SeqId> seqs, bool apply_watermark) = 0;

  // Runs every member's queued copy-on-write pairs (BlockManager::apply_pending_copies).
  virtual Status apply_pending_copies() = 0;

  // --- Metrics: sums over the members.
  virtual BlockCounts total_counts() const = 0;
  virtual PrefixCacheStats total_prefix_stats() const = 0;
  // Blocks sequences may ever own, over every member (BlockManager::max_sequence_blocks).
  virtual int64_t total_sequence_blocks() const = 0;
  virtual int64_t total_reserved_blocks() const = 0;  // padding (dummy) blocks

  // Aborts unless every member's invariants hold.
  virtual void check_cache_invariants() const = 0;
};

}  // namespace folio::kv
