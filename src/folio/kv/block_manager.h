// BlockManager: sequences' block tables over the paged KV cache.
//
// Each sequence known to the cache has a block table: logical block i (token positions
// [i * block_size, (i + 1) * block_size)) maps to a physical block id (kv_types.h). The manager
// allocates a prompt's blocks in bulk, reusing the longest cached prefix (prefix_hash.h); adds
// one slot per generated token (append_slot), copying a shared last block first
// (copy-on-write); frees; forks (parallel sampling shares blocks by reference count); swaps
// sequences out to a host swap space and back; and exports tables and slot mappings as int32
// arrays for attention kernels. A reserved dummy block receives the writes of padding tokens.
//
// Lifecycle of a sequence: allocate -> RESIDENT -(swap_out)-> SWAPPED -(swap_in)-> RESIDENT;
// free from either. KV of a token is "computed" once the forward pass has written it; the
// caller reports that with mark_computed, and only then do full blocks enter the prefix index
// (a block whose KV is not yet written must not be served to another sequence).
//
// Outcomes: "no capacity right now" is a normal outcome (Admission / AppendStatus / SwapStatus),
// after which nothing changed and the scheduler preempts or waits; errors (bad ids, a sequence
// over the context limit, double free, touching a swapped-out sequence) are Status values that
// also change nothing. The watermark (a fraction of capacity kept obtainable) applies to new
// and preempted sequences (allocate, swap_in), not to appends; both can be told to ignore it
// (BlockAllocationRequest::apply_watermark, swap_in's apply_watermark).
//
// Copies: copy-on-write pairs are queued, not executed, so a step's copies run as one batch:
// call apply_pending_copies() before the forward step that writes the step's KV. The manager
// flushes the queue itself before a queued block could be reused. Swap copies run as one batch
// per swap_out / swap_in call.
//
// Invariants (check_invariants): those of BlockAllocator; every block's reference count equals
// the number of block tables holding it (plus one for the dummy block); a resident table holds
// exactly ceil(num_tokens / block_size) blocks; host swap blocks likewise.
//
// Thread-safety: one thread (the scheduler's) calls everything; no locks on its path. The page
// source may report evictions from any thread (see BlockAllocator).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "folio/base/result.h"
#include "folio/kv/block_allocator.h"
#include "folio/kv/block_copier.h"
#include "folio/kv/host_swap_space.h"
#include "folio/kv/kv_cache.h"
#include "folio/kv/kv_page_source.h"
#include "folio/kv/kv_types.h"
#include "folio/kv/prefix_hash.h"

namespace folio::kv {

struct BlockManagerOptions {
  ir::KvCacheGeometry geometry;
  int32_t max_context_tokens = 0;  // the longest sequence accepted
  double watermark = 0.01;         // fraction of capacity that admission keeps obtainable
  int32_t keep_empty_pages = 1;    // empty pages kept before giving pages back to the source
  // Contiguous blocks reserved for padding tokens' writes (in [1, blocks per page]): a padded
  // step spreads its padding tokens over their slots, so they must hold the executor's largest
  // padding (exec::BucketPolicy::max_padding()).
  int32_t num_dummy_blocks = 1;
};

enum class Admission { kAdmitted, kNoCapacityNow, kNeverFits };

struct AllocateOutcome {
  Admission admission = Admission::kNoCapacityNow;
  int32_t num_cached_tokens = 0;  // leading tokens whose KV came from the prefix cache
};

// One bulk allocation; allocate() fills it for the common case.
struct BlockAllocationRequest {
  std::span<const int32_t> tokens;
  CacheNamespace cache_namespace;
  uint64_t parent_hash = kRootPrefixHash;  // chain key before tokens[0] (KV-parallel groups)
  // Most leading tokens that may come from the prefix cache; -1: all but the last token (its
  // logits must be computed).
  int32_t max_hit_tokens = -1;
  bool apply_watermark = true;
};

enum class AppendStatus { kAppended, kNoCapacityNow };
struct AppendOutcome {
  AppendStatus status = AppendStatus::kNoCapacityNow;
  int64_t slot = -1;                       // where the new token's KV goes
  std::optional<BlockCopy> copy_on_write;  // queued; see apply_pending_copies()
};

enum class SwapStatus { kSwapped, kNoCapacityNow };
struct SwapOutcome {
  SwapStatus status = SwapStatus::kNoCapacityNow;
  int32_t num_blocks_copied = 0;
};

// Tokens of one sequence in a step: positions [first_position, first_position + num_tokens).
struct StepSegment {
  SeqId seq;
  int32_t first_position = 0;
  int32_t num_tokens = 0;
};

class BlockManager final : public KvCache {
 private:
  struct Sequence {
    bool swapped = false;
    CacheNamespace cache_namespace;
    uint64_t parent_hash = kRootPrefixHash;
    std::vector<int32_t> tokens;
    std::vector<int32_t> blocks;  // device block ids; host swap blocks while swapped
    // Chain keys of the leading full blocks, computed on demand (block_hash()): a prompt that
    // misses at its first block and is never computed needs no more.
    std::vector<uint64_t> block_hashes;
    int32_t num_computed = 0;
    int32_t num_registered = 0;  // leading full blocks already offered to the prefix index
  };

 public:
  // An allocation that holds its blocks but is not yet visible (two-phase allocation for
  // KV-parallel groups). Destroying an uncommitted reservation rolls it back. At most one is
  // open per manager, and no other mutating call is accepted while it is.
  class Reservation {
   public:
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&&) = delete;
    ~Reservation();
    const AllocateOutcome& outcome() const { return outcome_; }
    // True while blocks are held (admitted and neither committed nor rolled back).
    bool is_open() const { return manager_ != nullptr; }

   private:
    friend class BlockManager;
    Reservation() = default;
    BlockManager* manager_ = nullptr;
    SeqId seq_;
    Sequence sequence_;
    AllocateOutcome outcome_;
  };

  // Takes one page for the dummy blocks. Errors: bad options, a block that does not fit a page,
  // a swap space of another block size, or no page for the dummy blocks.
  static Result<std::unique_ptr<BlockManager>> create(const BlockManagerOptions& options,
                                                      KvPageSource& source, KvBlockCopier& copier,
                                                      HostSwapSpace* swap_space = nullptr);
  BlockManager(const BlockManager&) = delete;
  BlockManager& operator=(const BlockManager&) = delete;
  ~BlockManager();

  // --- Admission and allocation.
  // Whether a sequence of num_tokens could be admitted now, ignoring prefix hits.
  Admission can_allocate(int32_t num_tokens) const;
  Result<AllocateOutcome> allocate(SeqId seq, std::span<const int32_t> tokens,
                                   const CacheNamespace& cache_namespace = {});
  Result<Reservation> prepare_allocate(SeqId seq, const BlockAllocationRequest& request);
  // Requires: reservation.is_open() and it came from this manager.
  void commit(Reservation&& reservation);
  void rollback(Reservation&& reservation);

  // --- Growth and release.
  Result<AppendOutcome> append_slot(SeqId seq, int32_t token);
  // The first num_computed_tokens tokens of seq now have their KV written.
  Status mark_computed(SeqId seq, int32_t num_computed_tokens) override;
  Status free(SeqId seq) override;
  Status fork(SeqId parent, SeqId child) override;
  Result<SwapOutcome> swap_out(std::span<const SeqId> seqs) override;
  // `apply_watermark` false lets a preempted sequence that grew past what the watermark admits
  // come back (the scheduler decides when that is safe, engine/scheduler.h).
  Result<SwapOutcome> swap_in(std::span<const SeqId> seqs, bool apply_watermark = true) override;
  // Processes the page source's eviction notices now (every mutating call also does first).
  Status process_evictions() { return begin_operation(); }
  // Forgets the KV of every CACHED block (ref 0): they become FREE and leave the prefix index,
  // so no later allocation hits them. Blocks held by sequences stay. For a cache whose content
  // was lost (engine/step_runner.h, recovery); returns the number of blocks dropped.
  Result<int64_t> drop_cached_blocks();
  // Runs the queued copy-on-write pairs as one batch.
  Status apply_pending_copies() override;
  std::span<const BlockCopy> pending_copies() const { return pending_copies_; }

  // --- Export for kernels (int32 block ids, see KvLayoutNumbers).
  Result<std::span<const int32_t>> block_table(SeqId seq) const;
  // Fills i32 [seqs.size(), max_blocks_per_sequence] row by row, padding rows with the dummy
  // block. Checks every sequence before writing anything.
  Status fill_block_tables(std::span<const SeqId> seqs, int32_t max_blocks_per_sequence,
                           std::span<int32_t> out) const;
  // Fills i32 [out.size()] with the slot of each step token, segment after segment; entries
  // past the last segment (padding tokens) get slots of the dummy block.
  Status fill_slot_mapping(std::span<const StepSegment> segments, std::span<int32_t> out) const;

  // --- Queries.
  bool contains(SeqId seq) const override { return sequences_.contains(seq); }
  Result<bool> is_swapped(SeqId seq) const override;
  Result<int32_t> num_tokens(SeqId seq) const override;
  // Chain key of the sequence's last full block (its parent hash when it has none).
  Result<uint64_t> last_block_hash(SeqId seq);
  // The first of num_dummy_blocks() contiguous reserved blocks.
  BlockId dummy_block() const { return dummy_block_; }
  int32_t num_dummy_blocks() const { return options_.num_dummy_blocks; }
  KvLayoutNumbers layout() const;
  const BlockManagerOptions& options() const { return options_; }
  const BlockCounts& counts() const { return allocator_->counts(); }
  const PrefixCacheStats& prefix_stats() const { return allocator_->stats(); }
  int64_t watermark_blocks() const { return watermark_blocks_; }
  // Blocks a sequence may ever own: what the KV cache may hold, less the dummy blocks.
  int64_t max_sequence_blocks() const {
    return allocator_->max_held_blocks() - options_.num_dummy_blocks;
  }
  int64_t num_sequences() const override { return static_cast<int64_t>(sequences_.size()); }
  const BlockAllocator& allocator() const { return *allocator_; }
  // Aborts unless every invariant above holds. O(capacity + total table length).
  void check_invariants() const;

  // --- KvCache (kv_cache.h): this manager as a one-member cache.
  int32_t cache_block_size() const override { return options_.geometry.block_size; }
  int64_t context_limit() const override { return options_.max_context_tokens; }
  int32_t num_members() const override { return 1; }
  int32_t members_spanned(int64_t num_tokens) const override { return num_tokens > 0 ? 1 : 0; }
  bool fits_ever(int32_t num_tokens, bool apply_watermark) const override;
  bool has_room_for(const RoomQuery& query) const override;
  // prepare_allocate + commit.
  Result<AllocateOutcome> allocate_sequence(SeqId seq,
                                            const BlockAllocationRequest& request) override;
  Result<AppendedToken> append_token(SeqId seq, int32_t token) override;
  bool supports_swap() const override { return swap_space_ != nullptr; }
  BlockCounts total_counts() const override { return counts(); }
  PrefixCacheStats total_prefix_stats() const override { return prefix_stats(); }
  int64_t total_sequence_blocks() const override { return max_sequence_blocks(); }
  int64_t total_reserved_blocks() const override { return num_dummy_blocks(); }
  void check_cache_invariants() const override { check_invariants(); }

 private:
  BlockManager(const BlockManagerOptions& options, KvPageSource& source, KvBlockCopier& copier,
               HostSwapSpace* swap_space, int32_t blocks_per_page);

  // Refuses calls while a reservation is open; processes eviction notices.
  Status begin_operation();
  Result<Sequence*> find_resident(SeqId seq, const char* operation);
  Result<const Sequence*> find_resident(SeqId seq, const char* operation) const;
  // Flushes queued copies if a queued block was freed (and so could be reused).
  Status flush_copies_if_needed();
  // One new block outside any reservation (appends); -1 when there is no capacity.
  Result<int32_t> acquire_one_block();
  void release_block(int32_t block);
  // Gives the sequence a private copy of its shared last block and queues the copy; leaves
  // outcome.copy_on_write empty when no block is available.
  Status copy_on_write(Sequence& sequence, AppendOutcome& outcome);
  void register_computed_blocks(Sequence& sequence);
  // The prefix-cache part of an acquisition: the leading full blocks (of the first
  // num_queried) that the cache holds now.
  AcquireRequest prefix_request(Sequence& sequence, int32_t num_queried);
  // The chain key of full block `index` of the sequence. Requires: the block is full.
  uint64_t block_hash(Sequence& sequence, int32_t index) const;
  void recycle(Sequence&& sequence);
  Status validate_swap_set(std::span<const SeqId> seqs, bool want_swapped) const;

  BlockManagerOptions options_;
  KvPageSource& source_;
  KvBlockCopier& copier_;
  HostSwapSpace* swap_space_;
  int32_t blocks_per_page_;
  std::unique_ptr<BlockAllocator> allocator_;
  int64_t watermark_blocks_ = 0;
  BlockId dummy_block_;
  bool reservation_open_ = false;

  std::unordered_map<SeqId, Sequence> sequences_;
  std::vector<BlockCopy> pending_copies_;
  std::vector<uint8_t> copy_pending_;  // [capacity_blocks]: kCopySource | kCopyDestination bits
  bool flush_needed_ = false;          // a queued block dropped to ref 0
  std::vector<BlockId> scratch_blocks_;
  std::vector<Sequence> spare_sequences_;  // freed records, reused with their capacity
};

}  // namespace folio::kv
