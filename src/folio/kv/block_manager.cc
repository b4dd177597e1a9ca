#include "folio/kv/block_manager.h"

#include <algorithm>
#include <cmath>

#include "folio/base/check.h"

namespace folio::kv {

namespace {

// Bits of BlockManager::copy_pending_.
constexpr uint8_t kCopySource = 1;
constexpr uint8_t kCopyDestination = 2;

int64_t blocks_for(int64_t num_tokens, int32_t block_size) {
  return (num_tokens + block_size - 1) / block_size;
}

}  // namespace

// --- Reservation.

BlockManager::Reservation::Reservation(Reservation&& other) noexcept
    : manager_(std::exchange(other.manager_, nullptr)),
      seq_(other.seq_),
      sequence_(std::move(other.sequence_)),
      outcome_(other.outcome_) {}

BlockManager::Reservation::~Reservation() {
  if (manager_ != nullptr) manager_->rollback(std::move(*this));
}

// --- Construction.

Result<std::unique_ptr<BlockManager>> BlockManager::create(const BlockManagerOptions& options,
                                                           KvPageSource& source,
                                                           KvBlockCopier& copier,
                                                           HostSwapSpace* swap_space) {
  FOLIO_RETURN_IF_ERROR(options.geometry.validate());
  const ir::KvCacheGeometry& geometry = options.geometry;
  if (options.max_context_tokens <= 0) {
    return invalid_argument("max_context_tokens must be positive, got {}",
                            options.max_context_tokens);
  }
  if (!(options.watermark >= 0.0 && options.watermark < 1.0)) {
    return invalid_argument("watermark {} is not a fraction in [0, 1)", options.watermark);
  }
  if (options.keep_empty_pages < 0) {
    return invalid_argument("keep_empty_pages must not be negative");
  }
  const int64_t block_bytes = geometry.block_bytes();
  if (block_bytes > source.page_bytes()) {
    return invalid_argument(
        "a KV block of {} bytes ({} tokens x {} layers x {} KV heads x head dim {} x K and V) "
        "does not fit a page of {} bytes; use a smaller block size or larger pages",
        block_bytes, geometry.block_size, geometry.num_layers, geometry.num_kv_heads,
        geometry.head_dim, source.page_bytes());
  }
  if (swap_space != nullptr && swap_space->block_bytes() != block_bytes) {
    return invalid_argument("host swap space blocks are {} bytes but KV blocks are {} bytes",
                            swap_space->block_bytes(), block_bytes);
  }
  const auto blocks_per_page = static_cast<int32_t>(source.page_bytes() / block_bytes);
  std::unique_ptr<BlockManager> manager(
      new BlockManager(options, source, copier, swap_space, blocks_per_page));
  if (options.num_dummy_blocks < 1 || options.num_dummy_blocks > blocks_per_page) {
    return invalid_argument("num_dummy_blocks {} must be in [1, {}] (blocks per page)",
                            options.num_dummy_blocks, blocks_per_page);
  }
  // A fresh allocator hands out its first page's blocks in order, so the dummy blocks are
  // contiguous; checked rather than assumed.
  std::vector<int32_t> dummies;
  for (int32_t index = 0; index < options.num_dummy_blocks; ++index) {
    FOLIO_ASSIGN_OR_RETURN(const int32_t dummy, manager->acquire_one_block());
    if (dummy < 0) {
      return resource_exhausted("the KV page source has no page left for the dummy blocks");
    }
    dummies.push_back(dummy);
  }
  std::sort(dummies.begin(), dummies.end());
  FOLIO_CHECK(dummies.back() - dummies.front() + 1 == options.num_dummy_blocks,
              "dummy blocks {}..{} are not contiguous", dummies.front(), dummies.back());
  manager->dummy_block_ = BlockId(dummies.front());
  return manager;
}

BlockManager::BlockManager(const BlockManagerOptions& options, KvPageSource& source,
                           KvBlockCopier& copier, HostSwapSpace* swap_space,
                           int32_t blocks_per_page)
    : options_(options),
      source_(source),
      copier_(copier),
      swap_space_(swap_space),
      blocks_per_page_(blocks_per_page),
      allocator_(
          std::make_unique<BlockAllocator>(source, blocks_per_page, options.geometry.block_size)) {
  watermark_blocks_ =
      static_cast<int64_t>(options.watermark * static_cast<double>(allocator_->max_held_blocks()));
  copy_pending_.assign(static_cast<size_t>(allocator_->capacity_blocks()), 0);
}

BlockManager::~BlockManager() = default;

KvLayoutNumbers BlockManager::layout() const {
  const ir::KvCacheGeometry& geometry = options_.geometry;
  return KvLayoutNumbers{source_.base(),         source_.page_bytes(), blocks_per_page_,
                         geometry.block_bytes(), geometry.block_size,  geometry.num_layers,
                         geometry.num_kv_heads,  geometry.head_dim,    geometry.dtype};
}

// --- Helpers.

Status BlockManager::begin_operation() {
  if (reservation_open_) {
    return failed_precondition(
        "a KV reservation is open on this block manager; commit or roll it back first");
  }
  allocator_->process_evictions();
  return Status();
}

Result<BlockManager::Sequence*> BlockManager::find_resident(SeqId seq, const char* operation) {
  const auto entry = sequences_.find(seq);
  if (entry == sequences_.end()) {
    return not_found("{}: sequence {} is not in the KV cache (never allocated, or already freed)",
                     operation, seq);
  }
  if (entry->second.swapped) {
    return failed_precondition("{}: sequence {} is swapped out; swap it in first", operation, seq);
  }
  return &entry->second;
}

Result<const BlockManager::Sequence*> BlockManager::find_resident(SeqId seq,
                                                                  const char* operation) const {
  FOLIO_ASSIGN_OR_RETURN(Sequence * sequence,
                         const_cast<BlockManager*>(this)->find_resident(seq, operation));
  return static_cast<const Sequence*>(sequence);
}

Status BlockManager::flush_copies_if_needed() {
  if (!flush_needed_) return Status();
  return apply_pending_copies();
}

Status BlockManager::apply_pending_copies() {
  if (pending_copies_.empty()) return Status();
  FOLIO_RETURN_IF_ERROR(copier_.copy_blocks(layout(), pending_copies_));
  for (const BlockCopy& copy : pending_copies_) {
    copy_pending_[copy.source] = 0;
    copy_pending_[copy.destination] = 0;
  }
  pending_copies_.clear();
  flush_needed_ = false;
  return Status();
}

Result<int32_t> BlockManager::acquire_one_block() {
  FOLIO_RETURN_IF_ERROR(flush_copies_if_needed());
  if (const int32_t block = allocator_->take_block_from_pinned_page(); block >= 0) return block;
  AcquireRequest request;
  request.num_blocks = 1;
  int32_t num_hits = 0;
  allocator_->begin();
  if (allocator_->acquire(request, scratch_blocks_, num_hits) != AcquireStatus::kAcquired) {
    allocator_->rollback();
    return -1;
  }
  allocator_->commit();
  return scratch_blocks_.front().value();
}

void BlockManager::release_block(int32_t block) {
  if (allocator_->release_reference(BlockId(block)) && copy_pending_[block] != 0) {
    flush_needed_ = true;
  }
}

uint64_t BlockManager::block_hash(Sequence& sequence, int32_t index) const {
  const int32_t block_size = options_.geometry.block_size;
  FOLIO_DCHECK(int64_t{index + 1} * block_size <= static_cast<int64_t>(sequence.tokens.size()));
  while (static_cast<int32_t>(sequence.block_hashes.size()) <= index) {
    const auto next = static_cast<int32_t>(sequence.block_hashes.size());
    const uint64_t parent = next == 0 ? sequence.parent_hash : sequence.block_hashes.back();
    const auto tokens = std::span<const int32_t>(sequence.tokens)
                            .subspan(static_cast<size_t>(next) * block_size, block_size);
    sequence.block_hashes.push_back(hash_block(parent, tokens, sequence.cache_namespace));
  }
  return sequence.block_hashes[index];
}

void BlockManager::register_computed_blocks(Sequence& sequence) {
  const int32_t block_size = options_.geometry.block_size;
  const int32_t num_full = sequence.num_computed / block_size;
  for (int32_t index = sequence.num_registered; index < num_full; ++index) {
    const BlockId block(sequence.blocks[index]);
    const uint64_t hash = block_hash(sequence, index);
    if (allocator_->is_registered(block)) continue;  // shared with a fork that registered it
    const uint64_t parent = index == 0 ? sequence.parent_hash : sequence.block_hashes[index - 1];
    const auto tokens = std::span<const int32_t>(sequence.tokens)
                            .subspan(static_cast<size_t>(index) * block_size, block_size);
    // false: an identical block is already cached; this one stays unregistered (freed as FREE).
    allocator_->register_block(block, hash, parent, tokens, sequence.cache_namespace);
  }
  sequence.num_registered = std::max(sequence.num_registered, num_full);
}

AcquireRequest BlockManager::prefix_request(Sequence& sequence, int32_t num_queried) {
  const int32_t block_size = options_.geometry.block_size;
  // Hash only as far as the cache answers: the candidates end at the first miss.
  int32_t num_candidates = 0;
  while (num_candidates < num_queried) {
    const uint64_t hash = block_hash(sequence, num_candidates);
    const uint64_t parent =
        num_candidates == 0 ? sequence.parent_hash : sequence.block_hashes[num_candidates - 1];
    const auto tokens = std::span<const int32_t>(sequence.tokens)
                            .subspan(static_cast<size_t>(num_candidates) * block_size, block_size);
    if (!allocator_->has_verified_hit(hash, parent, tokens, sequence.cache_namespace)) break;
    ++num_candidates;
  }
  AcquireRequest acquire;
  acquire.hit_candidates = std::span<const uint64_t>(sequence.block_hashes).first(num_candidates);
  acquire.candidate_tokens = std::span<const int32_t>(sequence.tokens)
                                 .first(static_cast<size_t>(num_candidates) * block_size);
  acquire.num_queried_blocks = num_queried;
  acquire.parent_hash = sequence.parent_hash;
  acquire.cache_namespace = sequence.cache_namespace;
  return acquire;
}

// --- Admission and allocation.

Admission BlockManager::can_allocate(int32_t num_tokens) const {
  if (num_tokens <= 0 || num_tokens > options_.max_context_tokens) return Admission::kNeverFits;
  const int64_t needed = blocks_for(num_tokens, options_.geometry.block_size);
  // The dummy blocks are never available.
  if (needed > max_sequence_blocks() - watermark_blocks_) {
    return Admission::kNeverFits;
  }
  if (allocator_->num_obtainable_blocks() - needed < watermark_blocks_) {
    return Admission::kNoCapacityNow;
  }
  return Admission::kAdmitted;
}

Result<AllocateOutcome> BlockManager::allocate(SeqId seq, std::span<const int32_t> tokens,
                                               const CacheNamespace& cache_namespace) {
  BlockAllocationRequest request;
  request.tokens = tokens;
  request.cache_namespace = cache_namespace;
  FOLIO_ASSIGN_OR_RETURN(Reservation reservation, prepare_allocate(seq, request));
  const AllocateOutcome outcome = reservation.outcome();
  if (reservation.is_open()) commit(std::move(reservation));
  return outcome;
}

bool BlockManager::fits_ever(int32_t num_tokens, bool apply_watermark) const {
  if (num_tokens <= 0 || num_tokens > options_.max_context_tokens) return false;
  const int64_t reserve = apply_watermark ? watermark_blocks_ : 0;
  return blocks_for(num_tokens, options_.geometry.block_size) <= max_sequence_blocks() - reserve;
}

bool BlockManager::has_room_for(const RoomQuery& query) const {
  if (query.num_tokens > options_.max_context_tokens) return false;
  const int64_t needed = blocks_for(query.num_tokens, options_.geometry.block_size);
  const auto share = static_cast<int64_t>(
      std::ceil(query.reserve_fraction * static_cast<double>(max_sequence_blocks())));
  const int64_t reserve = std::max(
      {query.apply_watermark ? watermark_blocks_ : int64_t{0}, query.reserve_blocks, share});
  return allocator_->num_obtainable_blocks() - needed >= reserve;
}

Result<AllocateOutcome> BlockManager::allocate_sequence(SeqId seq,
                                                        const BlockAllocationRequest& request) {
  // Beyond the context limit is "never fits" here (KvCache), an error for prepare_allocate.
  if (static_cast<int64_t>(request.tokens.size()) > options_.max_context_tokens) {
    return AllocateOutcome{Admission::kNeverFits, 0};
  }
  FOLIO_ASSIGN_OR_RETURN(Reservation reservation, prepare_allocate(seq, request));
  const AllocateOutcome outcome = reservation.outcome();
  if (reservation.is_open()) commit(std::move(reservation));
  return outcome;
}

Result<AppendedToken> BlockManager::append_token(SeqId seq, int32_t token) {
  FOLIO_ASSIGN_OR_RETURN(const AppendOutcome outcome, append_slot(seq, token));
  return AppendedToken{outcome.status, 0};
}

Result<BlockManager::Reservation> BlockManager::prepare_allocate(
    SeqId seq, const BlockAllocationRequest& request) {
  FOLIO_RETURN_IF_ERROR(begin_operation());
  const int32_t block_size = options_.geometry.block_size;
  const auto num_tokens = static_cast<int64_t>(request.tokens.size());
  if (sequences_.contains(seq)) {
    return already_exists("allocate: sequence {} is already in the KV cache", seq);
  }
  if (num_tokens == 0) return invalid_argument("allocate: sequence {} has no tokens", seq);
  if (num_tokens > options_.max_context_tokens) {
    return out_of_range("allocate: sequence {} has {} tokens, more than the context limit of {}",
                        seq, num_tokens, options_.max_context_tokens);
  }
  Reservation reservation;
  reservation.seq_ = seq;
  const int64_t num_blocks = blocks_for(num_tokens, block_size);
  const int64_t watermark = request.apply_watermark ? watermark_blocks_ : 0;
  if (num_blocks > max_sequence_blocks() - watermark) {
    reservation.outcome_.admission = Admission::kNeverFits;
    return reservation;
  }
  FOLIO_RETURN_IF_ERROR(flush_copies_if_needed());
  Sequence& sequence = reservation.sequence_;
  if (!spare_sequences_.empty()) {
    sequence = std::move(spare_sequences_.back());
    spare_sequences_.pop_back();
  }
  sequence.cache_namespace = request.cache_namespace;
  sequence.parent_hash = request.parent_hash;
  sequence.tokens.assign(request.tokens.begin(), request.tokens.end());
  const int64_t max_hit_tokens = std::clamp<int64_t>(
      request.max_hit_tokens < 0 ? num_tokens - 1 : request.max_hit_tokens, 0, num_tokens);
  AcquireRequest acquire =
      prefix_request(sequence, static_cast<int32_t>(max_hit_tokens / block_size));
  acquire.num_blocks = static_cast<int32_t>(num_blocks);
  acquire.watermark_blocks = watermark;
  int32_t num_hits = 0;
  allocator_->begin();
  if (allocator_->acquire(acquire, scratch_blocks_, num_hits) != AcquireStatus::kAcquired) {
    allocator_->rollback();
    reservation.outcome_.admission = Admission::kNoCapacityNow;
    return reservation;
  }
  sequence.blocks.reserve(scratch_blocks_.size());
  for (BlockId block : scratch_blocks_) sequence.blocks.push_back(block.value());
  sequence.num_computed = num_hits * block_size;
  sequence.num_registered = num_hits;
  reservation.outcome_ = AllocateOutcome{Admission::kAdmitted, num_hits * block_size};
  reservation.manager_ = this;
  reservation_open_ = true;
  return reservation;
}

void BlockManager::commit(Reservation&& reservation) {
  FOLIO_CHECK(reservation.manager_ == this && reservation_open_,
              "commit of a reservation that is not open on this manager");
  allocator_->commit();
  sequences_.emplace(reservation.seq_, std::move(reservation.sequence_));
  reservation.manager_ = nullptr;
  reservation_open_ = false;
}

void BlockManager::rollback(Reservation&& reservation) {
  FOLIO_CHECK(reservation.manager_ == this && reservation_open_,
              "rollback of a reservation that is not open on this manager");
  allocator_->rollback();
  reservation.manager_ = nullptr;
  reservation_open_ = false;
}

// --- Growth and release.

Result<AppendOutcome> BlockManager::append_slot(SeqId seq, int32_t token) {
  FOLIO_RETURN_IF_ERROR(begin_operation());
  FOLIO_ASSIGN_OR_RETURN(Sequence * sequence, find_resident(seq, "append_slot"));
  const int32_t block_size = options_.geometry.block_size;
  const auto position = static_cast<int64_t>(sequence->tokens.size());
  if (position + 1 > options_.max_context_tokens) {
    return out_of_range("append_slot: sequence {} already has {} tokens, the context limit", seq,
                        position);
  }
  AppendOutcome outcome;
  // block_size is a power of two (8, 16 or 32): a mask, not a 64-bit division.
  const int64_t offset = position & (block_size - 1);
  if (offset == 0) {
    FOLIO_ASSIGN_OR_RETURN(const int32_t block, acquire_one_block());
    if (block < 0) return outcome;  // kNoCapacityNow, nothing changed
    sequence->blocks.push_back(block);
  } else if (allocator_->ref_count(BlockId(sequence->blocks.back())) > 1) {
    FOLIO_RETURN_IF_ERROR(copy_on_write(*sequence, outcome));
    if (!outcome.copy_on_write.has_value()) return outcome;  // kNoCapacityNow
  }
  sequence->tokens.push_back(token);
  outcome.status = AppendStatus::kAppended;
  outcome.slot = int64_t{sequence->blocks.back()} * block_size + offset;
  return outcome;
}

Status BlockManager::copy_on_write(Sequence& sequence, AppendOutcome& outcome) {
  // The partial last block is shared (a fork): the sequence writes into a private copy.
  const int32_t shared = sequence.blocks.back();
  // A block may be read by several queued copies but must not also be written by one.
  if ((copy_pending_[shared] & kCopyDestination) != 0) {
    FOLIO_RETURN_IF_ERROR(apply_pending_copies());
  }
  FOLIO_ASSIGN_OR_RETURN(const int32_t block, acquire_one_block());
  if (block < 0) return Status();  // no capacity: outcome.copy_on_write stays empty
  const BlockCopy copy{shared, block};
  pending_copies_.push_back(copy);
  copy_pending_[shared] |= kCopySource;
  copy_pending_[block] |= kCopyDestination;
  release_block(shared);  // still referenced by the other holders
  sequence.blocks.back() = block;
  outcome.copy_on_write = copy;
  return Status();
}

Status BlockManager::mark_computed(SeqId seq, int32_t num_computed_tokens) {
  FOLIO_RETURN_IF_ERROR(begin_operation());
  FOLIO_ASSIGN_OR_RETURN(Sequence * sequence, find_resident(seq, "mark_computed"));
  if (num_computed_tokens < sequence->num_computed ||
      num_computed_tokens > static_cast<int64_t>(sequence->tokens.size())) {
    return out_of_range(
        "mark_computed: sequence {} has {} tokens of which {} are computed; {} is not in [{}, {}]",
        seq, sequence->tokens.size(), sequence->num_computed, num_computed_tokens,
        sequence->num_computed, sequence->tokens.size());
  }
  sequence->num_computed = num_computed_tokens;
  register_computed_blocks(*sequence);
  return Status();
}

Result<int64_t> BlockManager::drop_cached_blocks() {
  FOLIO_RETURN_IF_ERROR(begin_operation());
  const int64_t dropped = allocator_->drop_cached_blocks();
  allocator_->release_surplus_pages(options_.keep_empty_pages);
  return dropped;
}

Status BlockManager::free(SeqId seq) {
  FOLIO_RETURN_IF_ERROR(begin_operation());
  const auto entry = sequences_.find(seq);
  if (entry == sequences_.end()) {
    return not_found("free: sequence {} is not in the KV cache (never allocated, or already freed)",
                     seq);
  }
  Sequence& sequence = entry->second;
  if (sequence.swapped) {
    for (int32_t block : sequence.blocks) swap_space_->release(block);
  } else {
    // Tail first, so the tail reaches the LRU's old end and is evicted before the head, which
    // other sequences are likelier to share.
    for (auto block = sequence.blocks.rbegin(); block != sequence.blocks.rend(); ++block) {
      release_block(*block);
    }
  }
  recycle(std::move(sequence));
  sequences_.erase(entry);
  allocator_->release_surplus_pages(options_.keep_empty_pages);
  return Status();
}

void BlockManager::recycle(Sequence&& sequence) {
  // Keeps the vectors' capacity for the next admission: three allocations fewer per sequence.
  constexpr size_t kMaxSpareSequences = 64;
  if (spare_sequences_.size() >= kMaxSpareSequences) return;
  Sequence& spare = spare_sequences_.emplace_back(std::move(sequence));
  spare.swapped = false;
  spare.tokens.clear();
  spare.blocks.clear();
  spare.block_hashes.clear();
  spare.num_computed = 0;
  spare.num_registered = 0;
}

Status BlockManager::fork(SeqId parent, SeqId child) {
  FOLIO_RETURN_IF_ERROR(begin_operation());
  FOLIO_ASSIGN_OR_RETURN(Sequence * source, find_resident(parent, "fork"));
  if (sequences_.contains(child)) {
    return already_exists("fork: child sequence {} is already in the KV cache", child);
  }
  Sequence copy = *source;
  for (int32_t block : copy.blocks) allocator_->add_reference(BlockId(block));
  sequences_.emplace(child, std::move(copy));
  return Status();
}

// --- Queries.

Result<bool> BlockManager::is_swapped(SeqId seq) const {
  const auto entry = sequences_.find(seq);
  if (entry == sequences_.end()) return not_found("sequence {} is not in the KV cache", seq);
  return entry->second.swapped;
}

Result<int32_t> BlockManager::num_tokens(SeqId seq) const {
  const auto entry = sequences_.find(seq);
  if (entry == sequences_.end()) return not_found("sequence {} is not in the KV cache", seq);
  return static_cast<int32_t>(entry->second.tokens.size());
}

Result<uint64_t> BlockManager::last_block_hash(SeqId seq) {
  const auto entry = sequences_.find(seq);
  if (entry == sequences_.end()) return not_found("sequence {} is not in the KV cache", seq);
  Sequence& sequence = entry->second;
  const auto num_full = static_cast<int32_t>(sequence.tokens.size() / options_.geometry.block_size);
  return num_full == 0 ? sequence.parent_hash : block_hash(sequence, num_full - 1);
}

}  // namespace folio::kv
