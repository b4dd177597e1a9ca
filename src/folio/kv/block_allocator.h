// BlockAllocator: the life of KV blocks and of the pages that hold them, below the level of
// sequences (block_manager.h owns sequences and block tables).
//
// Block states (DESIGN.md): FREE -> OWNED (ref >= 1) -> CACHED (ref = 0, hashed, evictable)
// -> FREE, plus UNBACKED for block ids whose page the allocator does not hold. A block that
// drops to ref 0 becomes CACHED if it is registered in the prefix index (a full, computed block)
// and FREE otherwise. CACHED blocks sit on an intrusive LRU list, oldest first, so eviction is
// O(1); FREE blocks sit on their page's free list.
//
// Pages: the allocator grows by taking pages from a KvPageSource and shrinks by giving empty
// pages back (keeping a few as slack). A page is pinned while it holds an OWNED block and
// unpinned otherwise, so the source may evict it; the eviction notice (KvEvictionHandler) is
// queued and processed by the owner thread at the start of its next operation, which drops the
// page's CACHED and FREE blocks. Pages with free blocks sit on one of three lists: pinned pages
// (preferred, no pin call), unpinned pages that also hold CACHED blocks, and empty pages.
//
// Transactions: every acquisition of blocks is a transaction (begin, acquire, then commit or
// rollback). acquire() first takes whatever pages it needs from the source (phase A, the only
// phase that may call allocate_page and process eviction notices), then takes blocks (phase B):
// prefix hits, then free blocks, then LRU CACHED blocks. Every mutation in a transaction is
// logged; rollback() undoes the log in reverse, restoring states, reference counts, the prefix
// index, the LRU order, the free lists and the held pages exactly (pages taken in phase A go
// back to the source). Evicting a CACHED block for reuse drops its prefix-index entry only at
// commit, so a rollback keeps it cached.
//
// Invariants (check_invariants walks them):
// - every block of a held page is FREE, OWNED or CACHED; free + owned + cached = total =
//   held pages * blocks_per_page, per page and overall;
// - OWNED <=> ref >= 1; CACHED <=> ref = 0, registered in the prefix index and on the LRU;
//   FREE <=> ref = 0 and on its page's free list;
// - outside transactions a page is pinned iff it holds an OWNED block;
// - the prefix index maps each key to one OWNED or CACHED block registered under that key.
//
// Thread-safety: owned by one thread (the scheduler's); only on_kv_page_evicted may be called
// from other threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "folio/base/mutex.h"
#include "folio/kv/index_list.h"
#include "folio/kv/kv_page_source.h"
#include "folio/kv/kv_types.h"

namespace folio::kv {

enum class BlockState : uint8_t { kUnbacked, kFree, kOwned, kCached };

struct BlockCounts {
  int64_t total = 0;  // blocks of held pages
  int64_t free = 0;
  int64_t owned = 0;
  int64_t cached = 0;
  // OWNED blocks with more than one reference: held by several block tables (forked choices of
  // one request, or sequences sharing a prefix-cache hit). A subset of `owned`.
  int64_t shared = 0;
  int32_t held_pages = 0;
  int32_t pinned_pages = 0;
};

struct PrefixCacheStats {
  int64_t queried_blocks = 0;  // full prompt blocks looked up
  int64_t hit_blocks = 0;
  int64_t missed_blocks = 0;
  int64_t hit_tokens = 0;
  int64_t evicted_blocks = 0;  // CACHED blocks dropped (reused, their page evicted, or lost)
};

// What one acquisition needs.
struct AcquireRequest {
  // Chain hashes of the leading full blocks that may be served from the prefix cache, in order,
  // and their tokens (hit_candidates.size() * block_size of them). The caller may stop the list
  // at its first miss (see has_verified_hit); num_queried_blocks is the count that counts as
  // looked up in the statistics (hits + misses).
  std::span<const uint64_t> hit_candidates;
  std::span<const int32_t> candidate_tokens;
  int32_t num_queried_blocks = 0;
  uint64_t parent_hash = 0;  // the key of the block before the first candidate
  CacheNamespace cache_namespace;
  int32_t num_blocks = 0;  // hits + new blocks
  // The acquisition is refused unless at least this many blocks stay obtainable afterwards.
  int64_t watermark_blocks = 0;
};

enum class AcquireStatus { kAcquired, kNoCapacityNow };

class BlockAllocator final : public KvEvictionHandler {
 public:
  // Registers itself as `source`'s eviction handler. Requires: blocks_per_page >= 1,
  // block_size >= 1.
  BlockAllocator(KvPageSource& source, int32_t blocks_per_page, int32_t block_size);
  // Gives every held page back to the source.
  ~BlockAllocator();
  BlockAllocator(const BlockAllocator&) = delete;
  BlockAllocator& operator=(const BlockAllocator&) = delete;

  int32_t blocks_per_page() const { return blocks_per_page_; }
  int32_t block_size() const { return block_size_; }
  // Blocks the whole budget of the source could hold.
  int64_t capacity_blocks() const { return int64_t{capacity_pages_} * blocks_per_page_; }
  // Blocks the KV cache may hold at once: the source's page cap (KvPageSource::max_pages_held).
  int64_t max_held_blocks() const;
  // FREE + CACHED blocks plus the blocks of pages the source has available now.
  int64_t num_obtainable_blocks() const;

  // --- Transactions (one open at a time).
  void begin();
  // On kAcquired, `blocks` holds the hits (each gained a reference) followed by the new blocks
  // (ref 1), and `num_hits` their count. On kNoCapacityNow the caller must roll back.
  AcquireStatus acquire(const AcquireRequest& request, std::vector<BlockId>& blocks,
                        int32_t& num_hits);
  void commit();
  void rollback();
  bool in_transaction() const { return in_transaction_; }

  // --- Outside transactions.
  // A FREE block of a page that is already pinned, or -1 when there is none: the one
  // acquisition that cannot fail halfway, so it needs no transaction (appends use it).
  int32_t take_block_from_pinned_page();
  // Requires: the block is OWNED.
  void add_reference(BlockId block);
  // Drops one reference; at zero the block becomes CACHED (if registered) or FREE. Returns
  // whether that was the last reference. Requires: the block is OWNED.
  bool release_reference(BlockId block);
  // Makes an OWNED full block findable under `hash`; false (and nothing changes) when another
  // block already holds that key. `tokens` has block_size entries.
  bool register_block(BlockId block, uint64_t hash, uint64_t parent_hash,
                      std::span<const int32_t> tokens, const CacheNamespace& cache_namespace);
  // Gives empty pages back to the source until at most `keep_empty_pages` are left.
  void release_surplus_pages(int32_t keep_empty_pages);
  // Drops the blocks of pages the source evicted since the last call.
  void process_evictions();
  // Makes every CACHED block FREE and drops it from the prefix index (OWNED blocks, registered
  // or not, stay as they are). For KV content that was lost (a step runner that lost a worker,
  // engine/step_runner.h): a ref-0 block no sequence will rewrite must never be a hit again.
  // Returns how many blocks it dropped (counted as evicted in stats()).
  int64_t drop_cached_blocks();

  // --- Queries.
  // Whether a registered block holds exactly this key, parent key, tokens and namespace (a
  // prefix hit if acquired now).
  bool has_verified_hit(uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens,
                        const CacheNamespace& cache_namespace) const;
  BlockState state(BlockId block) const { return blocks_[block.value()].state; }
  int32_t ref_count(BlockId block) const { return blocks_[block.value()].ref_count; }
  bool is_registered(BlockId block) const { return blocks_[block.value()].registered; }
  const BlockCounts& counts() const { return counts_; }
  const PrefixCacheStats& stats() const { return stats_; }
  // CACHED blocks in eviction order (oldest first). O(cached); for tests and tools.
  std::vector<int32_t> lru_order() const;
  // Aborts unless the invariants above hold and every block's reference count equals
  // expected_ref_counts[block] (blocks of unheld pages: 0). O(capacity).
  void check_invariants(std::span<const int32_t> expected_ref_counts) const;

  void on_kv_page_evicted(const KvPage& page) override;

 private:
  enum class PageList : uint8_t { kNone, kPinnedWithFree, kUnpinnedWithFree, kEmpty };
  static constexpr int kNumPageLists = 4;

  // Hot per-block state, 12 bytes so that the per-token paths stay in cache.
  struct BlockSlot {
    BlockState state = BlockState::kUnbacked;
    bool registered = false;
    int32_t ref_count = 0;
    int32_t page = 0;  // block / blocks_per_page, stored: a division costs more than a load
  };
  // What a registered block is keyed and verified by (cold).
  struct BlockKey {
    uint64_t hash = 0;
    uint64_t parent_hash = 0;
    CacheNamespace cache_namespace;
  };
  struct PageSlot {
    KvPage page;
    bool held = false;
    bool pinned = false;
    bool doomed = false;  // a pin failed: the source is evicting it; skip until processed
    PageList list = PageList::kNone;
    int32_t num_free = 0;
    int32_t num_owned = 0;
    int32_t num_cached = 0;
    IndexList free_blocks;
  };
  struct UndoEntry {
    enum class Kind : uint8_t {
      kListRemoved,
      kListPushedBack,
      kBlockState,
      kBlockReference,
      kBlockTaken,  // a FREE or CACHED block left `list` and became OWNED with one reference
      kPagePinned,
      kPageInstalled,
      kPageRelinked
    };
    Kind kind = Kind::kBlockState;
    int32_t node = -1;      // block or page index
    int32_t old_value = 0;  // state, reference count or PageList
    IndexList* list = nullptr;
    IndexList::Position position;
  };

  int32_t page_of(int32_t block) const { return blocks_[block].page; }
  PageList page_list_for(const PageSlot& page) const;

  void log_undo(UndoEntry::Kind kind, int32_t node, int32_t old_value = 0,
                IndexList* list = nullptr, IndexList::Position position = {});
  // Updates the counters; never logged.
  void change_state(int32_t block, BlockState state);
  // Primitive mutations; each is logged while a transaction is open.
  void set_state(int32_t block, BlockState state);
  // Removes a FREE or CACHED block from `list` and makes it OWNED with one reference.
  void take_block(int32_t block, IndexList& list);
  void set_reference(int32_t block, int32_t ref_count);
  // Keeps counts_.shared in step with a block's reference count going from `before` to `after`.
  void note_reference_change(int32_t before, int32_t after) {
    counts_.shared += int64_t{after > 1} - int64_t{before > 1};
  }
  void list_push_back(IndexList& list, int32_t node);
  void relink_page(int32_t page);
  bool pin_page(int32_t page);
  void install_page(const KvPage& page);
  void undo(const UndoEntry& entry);

  bool drain_evictions();
  void drop_page(int32_t page, bool give_back);
  void lookup_hits(const AcquireRequest& request, std::vector<int32_t>& hits) const;
  bool verify_candidate(int32_t block, uint64_t parent_hash, std::span<const int32_t> tokens,
                        const CacheNamespace& cache_namespace) const;
  int64_t count_cached(std::span<const int32_t> blocks) const;
  void acquire_pages(const AcquireRequest& request, std::vector<int32_t>& hits);
  bool take_hit(int32_t block);
  int32_t take_free_block();
  int32_t take_cached_block();
  void check_page(int32_t page_index, std::span<const int32_t> expected_ref_counts,
                  BlockCounts& counts) const;

  KvPageSource& source_;
  const int32_t blocks_per_page_;
  const int32_t block_size_;
  const int32_t capacity_pages_;

  std::vector<BlockSlot> blocks_;        // [capacity_blocks]
  std::vector<BlockKey> block_keys_;     // [capacity_blocks]: meaningful while registered
  std::vector<int32_t> block_tokens_;    // [capacity_blocks, block_size]: registered tokens
  std::vector<IndexLinks> block_links_;  // a page's free list or the LRU
  std::vector<PageSlot> pages_;          // [capacity_pages]
  std::vector<IndexLinks> page_links_;
  IndexList page_lists_[kNumPageLists];
  IndexList lru_;  // CACHED blocks, least recently used first
  std::unordered_map<uint64_t, int32_t> prefix_index_;
  BlockCounts counts_;
  PrefixCacheStats stats_;

  bool in_transaction_ = false;
  std::vector<UndoEntry> undo_log_;
  std::vector<int32_t> reclaimed_cached_;  // CACHED blocks taken for reuse in this transaction
  std::vector<int32_t> installed_pages_;   // pages taken from the source in this transaction
  PrefixCacheStats pending_stats_;         // applied at commit
  std::vector<int32_t> scratch_hits_;

  // Eviction notices from the source, possibly from other threads.
  Mutex evicted_mutex_;
  std::vector<KvPage> evicted_pages_ FOLIO_GUARDED_BY(evicted_mutex_);
  // Set (release, after pushing under evicted_mutex_) by on_kv_page_evicted; read (acquire) by
  // drain_evictions on the owner thread, which then takes the mutex to read the queue. A hint
  // that keeps the mutex off the per-operation path; the mutex orders the queue itself.
  std::atomic<bool> has_evicted_pages_{false};
};

}  // namespace folio::kv
