#include "folio/kv/block_allocator.h"

#include <algorithm>

#include "folio/base/check.h"

namespace folio::kv {

BlockAllocator::BlockAllocator(KvPageSource& source, int32_t blocks_per_page, int32_t block_size)
    : source_(source),
      blocks_per_page_(blocks_per_page),
      block_size_(block_size),
      capacity_pages_(source.capacity_pages()),
      blocks_(static_cast<size_t>(capacity_blocks())),
      block_keys_(static_cast<size_t>(capacity_blocks())),
      block_tokens_(static_cast<size_t>(capacity_blocks() * block_size)),
      block_links_(static_cast<size_t>(capacity_blocks())),
      pages_(static_cast<size_t>(capacity_pages_)),
      page_links_(static_cast<size_t>(capacity_pages_)),
      lru_(&block_links_) {
  FOLIO_CHECK(blocks_per_page >= 1 && block_size >= 1);
  for (size_t block = 0; block < blocks_.size(); ++block) {
    blocks_[block].page = static_cast<int32_t>(block / static_cast<size_t>(blocks_per_page));
  }
  for (IndexList& list : page_lists_) list = IndexList(&page_links_);
  for (PageSlot& page : pages_) page.free_blocks = IndexList(&block_links_);
  source_.set_eviction_handler(this);
}

BlockAllocator::~BlockAllocator() {
  if (in_transaction_) rollback();
  // After this returns the source makes no more eviction calls; pages it evicted meanwhile
  // answer release_page with a stale-handle error, which is expected here.
  source_.set_eviction_handler(nullptr);
  for (PageSlot& page : pages_) {
    if (page.held) source_.release_page(page.page).ignore();
  }
}

int64_t BlockAllocator::max_held_blocks() const {
  return int64_t{std::min(source_.max_pages_held(), capacity_pages_)} * blocks_per_page_;
}

int64_t BlockAllocator::num_obtainable_blocks() const {
  return counts_.free + counts_.cached + int64_t{source_.num_pages_available()} * blocks_per_page_;
}

BlockAllocator::PageList BlockAllocator::page_list_for(const PageSlot& page) const {
  if (!page.held) return PageList::kNone;
  if (page.pinned) return page.num_free > 0 ? PageList::kPinnedWithFree : PageList::kNone;
  if (page.num_free == blocks_per_page_) return PageList::kEmpty;
  return page.num_free > 0 ? PageList::kUnpinnedWithFree : PageList::kNone;
}

// --- Primitive mutations.

void BlockAllocator::log_undo(UndoEntry::Kind kind, int32_t node, int32_t old_value,
                              IndexList* list, IndexList::Position position) {
  UndoEntry entry;
  entry.kind = kind;
  entry.node = node;
  entry.old_value = old_value;
  entry.list = list;
  entry.position = position;
  undo_log_.push_back(entry);
}

void BlockAllocator::change_state(int32_t block, BlockState state) {
  BlockSlot& slot = blocks_[block];
  PageSlot& page = pages_[page_of(block)];
  const auto adjust = [&](BlockState which, int32_t delta) {
    switch (which) {
      case BlockState::kUnbacked:
        break;
      case BlockState::kFree:
        counts_.free += delta;
        page.num_free += delta;
        break;
      case BlockState::kOwned:
        counts_.owned += delta;
        page.num_owned += delta;
        break;
      case BlockState::kCached:
        counts_.cached += delta;
        page.num_cached += delta;
        break;
    }
  };
  adjust(slot.state, -1);
  adjust(state, +1);
  slot.state = state;
}

void BlockAllocator::set_state(int32_t block, BlockState state) {
  if (in_transaction_) {
    log_undo(UndoEntry::Kind::kBlockState, block, static_cast<int32_t>(blocks_[block].state));
  }
  change_state(block, state);
}

void BlockAllocator::take_block(int32_t block, IndexList& list) {
  const IndexList::Position position = list.remove(block);
  if (in_transaction_) {
    log_undo(UndoEntry::Kind::kBlockTaken, block, static_cast<int32_t>(blocks_[block].state), &list,
             position);
  }
  change_state(block, BlockState::kOwned);
  blocks_[block].ref_count = 1;
}

void BlockAllocator::set_reference(int32_t block, int32_t ref_count) {
  if (in_transaction_) {
    log_undo(UndoEntry::Kind::kBlockReference, block, blocks_[block].ref_count);
  }
  note_reference_change(blocks_[block].ref_count, ref_count);
  blocks_[block].ref_count = ref_count;
}

void BlockAllocator::list_push_back(IndexList& list, int32_t node) {
  list.push_back(node);
  if (in_transaction_) log_undo(UndoEntry::Kind::kListPushedBack, node, 0, &list);
}

void BlockAllocator::relink_page(int32_t page_index) {
  PageSlot& page = pages_[page_index];
  const PageList target = page_list_for(page);
  if (target == page.list) return;
  IndexList::Position position;
  if (page.list != PageList::kNone) {
    position = page_lists_[static_cast<int>(page.list)].remove(page_index);
  }
  if (target != PageList::kNone) page_lists_[static_cast<int>(target)].push_back(page_index);
  if (in_transaction_) {
    log_undo(UndoEntry::Kind::kPageRelinked, page_index, static_cast<int32_t>(page.list), nullptr,
             position);
  }
  page.list = target;
}

bool BlockAllocator::pin_page(int32_t page_index) {
  PageSlot& page = pages_[page_index];
  if (page.pinned) return true;
  if (page.doomed) return false;
  if (!source_.pin(page.page).ok()) {
    // The source is evicting this page; its notice will arrive (or has) and drop it.
    page.doomed = true;
    return false;
  }
  page.pinned = true;
  ++counts_.pinned_pages;
  if (in_transaction_) log_undo(UndoEntry::Kind::kPagePinned, page_index);
  return true;
}

void BlockAllocator::install_page(const KvPage& kv_page) {
  const int32_t page_index = kv_page.page_index;
  FOLIO_CHECK(page_index >= 0 && page_index < capacity_pages_,
              "page source returned page index {} outside [0, {})", page_index, capacity_pages_);
  FOLIO_CHECK(kv_page.address == source_.base() + page_index * source_.page_bytes(),
              "page source returned page {} at an address that breaks the paged layout",
              page_index);
  PageSlot& page = pages_[page_index];
  FOLIO_CHECK(!page.held, "page source handed out KV page {} without an eviction notice",
              page_index);
  page.page = kv_page;
  page.held = true;
  page.pinned = true;  // allocate_page() returns pinned pages
  page.doomed = false;
  ++counts_.held_pages;
  ++counts_.pinned_pages;
  counts_.total += blocks_per_page_;
  if (in_transaction_) {
    log_undo(UndoEntry::Kind::kPageInstalled, page_index);
    installed_pages_.push_back(page_index);
  }
  const int32_t first = page_index * blocks_per_page_;
  for (int32_t block = first; block < first + blocks_per_page_; ++block) {
    set_state(block, BlockState::kFree);
    list_push_back(page.free_blocks, block);
  }
  relink_page(page_index);
}

void BlockAllocator::undo(const UndoEntry& entry) {
  switch (entry.kind) {
    case UndoEntry::Kind::kListRemoved:
      entry.list->restore(entry.node, entry.position);
      break;
    case UndoEntry::Kind::kListPushedBack:
      FOLIO_DCHECK(entry.list->back() == entry.node);
      entry.list->remove(entry.node);
      break;
    case UndoEntry::Kind::kBlockState:
      set_state(entry.node, static_cast<BlockState>(entry.old_value));
      break;
    case UndoEntry::Kind::kBlockReference:
      note_reference_change(blocks_[entry.node].ref_count, entry.old_value);
      blocks_[entry.node].ref_count = entry.old_value;
      break;
    case UndoEntry::Kind::kBlockTaken:
      blocks_[entry.node].ref_count = 0;
      change_state(entry.node, static_cast<BlockState>(entry.old_value));
      entry.list->restore(entry.node, entry.position);
      break;
    case UndoEntry::Kind::kPagePinned: {
      PageSlot& page = pages_[entry.node];
      source_.unpin(page.page);
      page.pinned = false;
      --counts_.pinned_pages;
      break;
    }
    case UndoEntry::Kind::kPageInstalled: {
      PageSlot& page = pages_[entry.node];
      const Status status = source_.release_page(page.page);
      FOLIO_CHECK(status.ok(), "giving back pinned KV page {} failed: {}", entry.node, status);
      page.held = false;
      page.pinned = false;
      page.page = KvPage{};
      --counts_.held_pages;
      --counts_.pinned_pages;
      counts_.total -= blocks_per_page_;
      break;
    }
    case UndoEntry::Kind::kPageRelinked: {
      PageSlot& page = pages_[entry.node];
      if (page.list != PageList::kNone) {
        IndexList& list = page_lists_[static_cast<int>(page.list)];
        FOLIO_DCHECK(list.back() == entry.node);
        list.remove(entry.node);
      }
      page.list = static_cast<PageList>(entry.old_value);
      if (page.list != PageList::kNone) {
        page_lists_[static_cast<int>(page.list)].restore(entry.node, entry.position);
      }
      break;
    }
  }
}

// --- Evictions by the source.

void BlockAllocator::on_kv_page_evicted(const KvPage& page) {
  MutexLock lock(evicted_mutex_);
  evicted_pages_.push_back(page);
  // Release: pairs with the acquire load in drain_evictions.
  has_evicted_pages_.store(true, std::memory_order_release);
}

bool BlockAllocator::drain_evictions() {
  // Acquire: pairs with the release store in on_kv_page_evicted.
  if (!has_evicted_pages_.load(std::memory_order_acquire)) return false;
  std::vector<KvPage> evicted;
  {
    MutexLock lock(evicted_mutex_);
    evicted.swap(evicted_pages_);
    has_evicted_pages_.store(false, std::memory_order_relaxed);
  }
  bool dropped = false;
  for (const KvPage& kv_page : evicted) {
    PageSlot& page = pages_[kv_page.page_index];
    // A notice for a tenure that already ended (we released the page) changes nothing.
    if (!page.held || page.page.handle != kv_page.handle) continue;
    FOLIO_CHECK(!page.pinned && page.num_owned == 0,
                "page source evicted KV page {} while it holds owned blocks", kv_page.page_index);
    drop_page(kv_page.page_index, /*give_back=*/false);
    dropped = true;
  }
  return dropped;
}

void BlockAllocator::process_evictions() {
  FOLIO_CHECK(!in_transaction_, "process_evictions() inside a transaction");
  drain_evictions();
}

// Not logged: dropping a page is never undone. It only touches unpinned pages, which no logged
// operation of an open transaction has touched (they pin every page they take blocks from).
void BlockAllocator::drop_page(int32_t page_index, bool give_back) {
  const bool was_logging = in_transaction_;
  in_transaction_ = false;
  PageSlot& page = pages_[page_index];
  FOLIO_CHECK(page.num_owned == 0 && !page.pinned);
  const int32_t first = page_index * blocks_per_page_;
  for (int32_t block = first; block < first + blocks_per_page_; ++block) {
    BlockSlot& slot = blocks_[block];
    switch (slot.state) {
      case BlockState::kFree:
        page.free_blocks.remove(block);
        break;
      case BlockState::kCached: {
        lru_.remove(block);
        const auto entry = prefix_index_.find(block_keys_[block].hash);
        if (entry != prefix_index_.end() && entry->second == block) prefix_index_.erase(entry);
        slot.registered = false;
        ++stats_.evicted_blocks;
        break;
      }
      case BlockState::kOwned:
      case BlockState::kUnbacked:
        FOLIO_UNREACHABLE("block {} of an unpinned page", block);
    }
    set_state(block, BlockState::kUnbacked);
  }
  if (page.list != PageList::kNone) page_lists_[static_cast<int>(page.list)].remove(page_index);
  page.list = PageList::kNone;
  // A stale handle here means the source is evicting the page right now; its notice is then
  // ignored by drain_evictions because the tenure ended.
  if (give_back) source_.release_page(page.page).ignore();
  page.held = false;
  page.doomed = false;
  page.page = KvPage{};
  --counts_.held_pages;
  counts_.total -= blocks_per_page_;
  in_transaction_ = was_logging;
}

int64_t BlockAllocator::drop_cached_blocks() {
  FOLIO_CHECK(!in_transaction_, "drop_cached_blocks() inside a transaction");
  int64_t dropped = 0;
  for (int32_t block = lru_.front(); block >= 0; block = lru_.front()) {
    lru_.remove(block);
    const auto entry = prefix_index_.find(block_keys_[block].hash);
    FOLIO_CHECK(entry != prefix_index_.end() && entry->second == block,
                "CACHED block {} is not in the prefix index", block);
    prefix_index_.erase(entry);
    blocks_[block].registered = false;
    set_state(block, BlockState::kFree);
    // Pinning follows OWNED blocks only, so the page keeps its pin state; only its list moves.
    const int32_t page_index = page_of(block);
    pages_[page_index].free_blocks.push_front(block);
    relink_page(page_index);
    ++stats_.evicted_blocks;
    ++dropped;
  }
  return dropped;
}

void BlockAllocator::release_surplus_pages(int32_t keep_empty_pages) {
  FOLIO_CHECK(!in_transaction_);
  IndexList& empty = page_lists_[static_cast<int>(PageList::kEmpty)];
  while (empty.size() > keep_empty_pages) drop_page(empty.front(), /*give_back=*/true);
}

// --- Prefix lookup.

bool BlockAllocator::verify_candidate(int32_t block, uint64_t parent_hash,
                                      std::span<const int32_t> tokens,
                                      const CacheNamespace& cache_namespace) const {
  const BlockKey& key = block_keys_[block];
  if (!blocks_[block].registered || key.parent_hash != parent_hash) return false;
  if (!(key.cache_namespace == cache_namespace)) return false;
  if (pages_[page_of(block)].doomed) return false;
  const int32_t* stored = block_tokens_.data() + int64_t{block} * block_size_;
  return std::equal(tokens.begin(), tokens.end(), stored);
}

void BlockAllocator::lookup_hits(const AcquireRequest& request, std::vector<int32_t>& hits) const {
  hits.clear();
  uint64_t parent_hash = request.parent_hash;
  for (size_t index = 0; index < request.hit_candidates.size(); ++index) {
    const uint64_t hash = request.hit_candidates[index];
    const auto entry = prefix_index_.find(hash);
    if (entry == prefix_index_.end()) break;
    const auto tokens = request.candidate_tokens.subspan(index * block_size_, block_size_);
    if (!verify_candidate(entry->second, parent_hash, tokens, request.cache_namespace)) break;
    hits.push_back(entry->second);
    parent_hash = hash;
  }
}

bool BlockAllocator::has_verified_hit(uint64_t hash, uint64_t parent_hash,
                                      std::span<const int32_t> tokens,
                                      const CacheNamespace& cache_namespace) const {
  const auto entry = prefix_index_.find(hash);
  return entry != prefix_index_.end() &&
         verify_candidate(entry->second, parent_hash, tokens, cache_namespace);
}

int64_t BlockAllocator::count_cached(std::span<const int32_t> blocks) const {
  int64_t cached = 0;
  for (int32_t block : blocks) cached += blocks_[block].state == BlockState::kCached ? 1 : 0;
  return cached;
}

bool BlockAllocator::register_block(BlockId block, uint64_t hash, uint64_t parent_hash,
                                    std::span<const int32_t> tokens,
                                    const CacheNamespace& cache_namespace) {
  FOLIO_CHECK(!in_transaction_);
  BlockSlot& slot = blocks_[block.value()];
  FOLIO_CHECK(slot.state == BlockState::kOwned && !slot.registered);
  FOLIO_CHECK(static_cast<int32_t>(tokens.size()) == block_size_);
  if (!prefix_index_.emplace(hash, block.value()).second) return false;
  slot.registered = true;
  block_keys_[block.value()] = BlockKey{hash, parent_hash, cache_namespace};
  std::copy(tokens.begin(), tokens.end(),
            block_tokens_.begin() + int64_t{block.value()} * block_size_);
  return true;
}

// --- Transactions.

void BlockAllocator::begin() {
  FOLIO_CHECK(!in_transaction_, "a block allocator transaction is already open");
  in_transaction_ = true;
}

void BlockAllocator::acquire_pages(const AcquireRequest& request, std::vector<int32_t>& hits) {
  const auto num_new = [&] {
    return int64_t{request.num_blocks} - static_cast<int64_t>(hits.size());
  };
  while (counts_.free < num_new()) {
    // When the source has no page to spare it would evict pages, ours among them; evicting
    // our own CACHED blocks in LRU order loses less, so ask only if those do not suffice.
    const bool own_blocks_suffice = counts_.free + counts_.cached - count_cached(hits) >= num_new();
    if (own_blocks_suffice && source_.num_pages_available() <= 0) break;
    const int64_t free_before = counts_.free;
    Result<KvPage> page = source_.allocate_page();
    if (!page.ok()) break;
    // The source may have made room by evicting one of our unpinned pages (its notice came from
    // inside allocate_page), possibly the very index it returned: drop those pages first.
    if (drain_evictions()) lookup_hits(request, hits);
    install_page(*page);
    // No progress: the source is trading our own free pages back; reuse CACHED blocks instead.
    if (counts_.free <= free_before) break;
  }
}

AcquireStatus BlockAllocator::acquire(const AcquireRequest& request, std::vector<BlockId>& blocks,
                                      int32_t& num_hits) {
  FOLIO_CHECK(in_transaction_ && undo_log_.empty(), "acquire() runs once per transaction");
  FOLIO_CHECK(request.candidate_tokens.size() == request.hit_candidates.size() * block_size_);
  std::vector<int32_t>& hits = scratch_hits_;
  drain_evictions();
  lookup_hits(request, hits);
  const auto num_new = [&] {
    return int64_t{request.num_blocks} - static_cast<int64_t>(hits.size());
  };
  // Asking the source is a call into another component: only when our own blocks fall short.
  const int64_t own_blocks = counts_.free + counts_.cached - count_cached(hits);
  if (own_blocks - num_new() < request.watermark_blocks &&
      own_blocks + int64_t{source_.num_pages_available()} * blocks_per_page_ - num_new() <
          request.watermark_blocks) {
    return AcquireStatus::kNoCapacityNow;
  }
  // Phase A: pages from the source. Phase B (below) neither allocates pages nor drains.
  acquire_pages(request, hits);
  if (counts_.free + counts_.cached - count_cached(hits) < num_new()) {
    return AcquireStatus::kNoCapacityNow;
  }
  size_t taken_hits = 0;
  while (taken_hits < hits.size() && take_hit(hits[taken_hits])) ++taken_hits;
  hits.resize(taken_hits);  // a hit whose page is being evicted ends the reusable prefix
  blocks.clear();
  for (int32_t hit : hits) blocks.emplace_back(hit);
  for (int64_t index = 0; index < num_new(); ++index) {
    int32_t block = take_free_block();
    if (block < 0) block = take_cached_block();
    if (block < 0) return AcquireStatus::kNoCapacityNow;
    blocks.emplace_back(block);
  }
  num_hits = static_cast<int32_t>(hits.size());
  pending_stats_.queried_blocks += request.num_queried_blocks;
  pending_stats_.hit_blocks += num_hits;
  pending_stats_.missed_blocks += request.num_queried_blocks - num_hits;
  pending_stats_.hit_tokens += int64_t{num_hits} * block_size_;
  return AcquireStatus::kAcquired;
}

bool BlockAllocator::take_hit(int32_t block) {
  const BlockSlot& slot = blocks_[block];
  if (slot.state == BlockState::kOwned) {
    set_reference(block, slot.ref_count + 1);
    return true;
  }
  FOLIO_DCHECK(slot.state == BlockState::kCached);
  const int32_t page_index = page_of(block);
  if (!pin_page(page_index)) return false;
  take_block(block, lru_);
  relink_page(page_index);
  return true;
}

int32_t BlockAllocator::take_free_block() {
  // Pinned pages first (no pin call, keeps other pages empty and releasable), then pages that
  // also hold CACHED blocks, then empty pages.
  for (PageList which :
       {PageList::kPinnedWithFree, PageList::kUnpinnedWithFree, PageList::kEmpty}) {
    const IndexList& list = page_lists_[static_cast<int>(which)];
    for (int32_t page_index = list.front(); page_index >= 0; page_index = list.next(page_index)) {
      if (!pin_page(page_index)) continue;
      PageSlot& page = pages_[page_index];
      const int32_t block = page.free_blocks.front();
      take_block(block, page.free_blocks);
      relink_page(page_index);
      return block;
    }
  }
  return -1;
}

int32_t BlockAllocator::take_cached_block() {
  for (int32_t block = lru_.front(); block >= 0; block = lru_.next(block)) {
    const int32_t page_index = page_of(block);
    if (!pin_page(page_index)) continue;
    take_block(block, lru_);
    reclaimed_cached_.push_back(block);
    relink_page(page_index);
    return block;
  }
  return -1;
}

void BlockAllocator::commit() {
  FOLIO_CHECK(in_transaction_);
  in_transaction_ = false;
  for (int32_t block : reclaimed_cached_) {
    const auto entry = prefix_index_.find(block_keys_[block].hash);
    FOLIO_CHECK(entry != prefix_index_.end() && entry->second == block);
    prefix_index_.erase(entry);
    blocks_[block].registered = false;
    ++stats_.evicted_blocks;
  }
  stats_.queried_blocks += pending_stats_.queried_blocks;
  stats_.hit_blocks += pending_stats_.hit_blocks;
  stats_.missed_blocks += pending_stats_.missed_blocks;
  stats_.hit_tokens += pending_stats_.hit_tokens;
  // Pages taken from the source but not needed after all: unpin, so they may be evicted.
  for (int32_t page_index : installed_pages_) {
    PageSlot& page = pages_[page_index];
    if (page.held && page.pinned && page.num_owned == 0) {
      source_.unpin(page.page);
      page.pinned = false;
      --counts_.pinned_pages;
      relink_page(page_index);
    }
  }
  undo_log_.clear();
  reclaimed_cached_.clear();
  installed_pages_.clear();
  pending_stats_ = PrefixCacheStats{};
}

void BlockAllocator::rollback() {
  FOLIO_CHECK(in_transaction_);
  in_transaction_ = false;
  for (auto entry = undo_log_.rbegin(); entry != undo_log_.rend(); ++entry) undo(*entry);
  undo_log_.clear();
  reclaimed_cached_.clear();
  installed_pages_.clear();
  pending_stats_ = PrefixCacheStats{};
}

// --- Outside transactions.

int32_t BlockAllocator::take_block_from_pinned_page() {
  FOLIO_CHECK(!in_transaction_);
  const int32_t page_index = page_lists_[static_cast<int>(PageList::kPinnedWithFree)].front();
  if (page_index < 0) return -1;
  PageSlot& page = pages_[page_index];
  const int32_t block = page.free_blocks.front();
  take_block(block, page.free_blocks);
  relink_page(page_index);
  return block;
}

void BlockAllocator::add_reference(BlockId block) {
  FOLIO_CHECK(!in_transaction_);
  BlockSlot& slot = blocks_[block.value()];
  FOLIO_CHECK(slot.state == BlockState::kOwned, "add_reference to block {} that is not owned",
              block);
  note_reference_change(slot.ref_count, slot.ref_count + 1);
  ++slot.ref_count;
}

bool BlockAllocator::release_reference(BlockId block_id) {
  FOLIO_CHECK(!in_transaction_);
  const int32_t block = block_id.value();
  BlockSlot& slot = blocks_[block];
  FOLIO_CHECK(slot.state == BlockState::kOwned && slot.ref_count >= 1,
              "release of block {} that is not owned", block);
  note_reference_change(slot.ref_count, slot.ref_count - 1);
  if (--slot.ref_count > 0) return false;
  const int32_t page_index = page_of(block);
  PageSlot& page = pages_[page_index];
  if (slot.registered) {
    set_state(block, BlockState::kCached);
    lru_.push_back(block);  // most recently used end
  } else {
    set_state(block, BlockState::kFree);
    page.free_blocks.push_front(block);  // reused first, while its lines may still be warm
  }
  if (page.num_owned == 0) {
    source_.unpin(page.page);
    page.pinned = false;
    --counts_.pinned_pages;
  }
  relink_page(page_index);
  return true;
}

}  // namespace folio::kv
