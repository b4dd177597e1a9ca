#include "folio/kv/kv_parallel_cache.h"

#include <algorithm>

#include "folio/base/check.h"
#include "folio/kv/prefix_hash.h"

namespace folio::kv {

Result<std::unique_ptr<KvParallelCache>> KvParallelCache::create(std::vector<BlockManager*> groups,
                                                                 int32_t tokens_per_group) {
  if (groups.empty()) return invalid_argument("KV-parallel cache needs at least one group");
  const int32_t block_size = groups.front()->options().geometry.block_size;
  for (size_t index = 0; index < groups.size(); ++index) {
    const BlockManagerOptions& options = groups[index]->options();
    if (options.geometry.block_size != block_size) {
      return invalid_argument("KV-parallel group {} has block size {} but group 0 has {}", index,
                              options.geometry.block_size, block_size);
    }
    if (options.max_context_tokens < tokens_per_group) {
      return invalid_argument(
          "KV-parallel group {} accepts {} tokens per sequence, fewer than "
          "tokens_per_group {}",
          index, options.max_context_tokens, tokens_per_group);
    }
  }
  if (tokens_per_group <= 0 || tokens_per_group % block_size != 0) {
    return invalid_argument("tokens_per_group {} is not a positive multiple of the block size {}",
                            tokens_per_group, block_size);
  }
  return std::unique_ptr<KvParallelCache>(new KvParallelCache(std::move(groups), tokens_per_group));
}

Result<KvpAllocateOutcome> KvParallelCache::allocate(SeqId seq, std::span<const int32_t> tokens,
                                                     const CacheNamespace& cache_namespace) {
  if (static_cast<int64_t>(tokens.size()) > max_context_tokens() && !sequences_.contains(seq)) {
    return out_of_range("allocate: sequence {} has {} tokens, more than the {} groups x {} tokens",
                        seq, tokens.size(), num_groups(), tokens_per_group_);
  }
  BlockAllocationRequest request;
  request.tokens = tokens;
  request.cache_namespace = cache_namespace;
  return allocate_spread(seq, request);
}

Result<KvpAllocateOutcome> KvParallelCache::allocate_spread(SeqId seq,
                                                            const BlockAllocationRequest& request) {
  const std::span<const int32_t> tokens = request.tokens;
  const CacheNamespace& cache_namespace = request.cache_namespace;
  const auto num_tokens = static_cast<int64_t>(tokens.size());
  if (sequences_.contains(seq)) {
    return already_exists("allocate: sequence {} is already in the KV-parallel cache", seq);
  }
  if (num_tokens == 0) return invalid_argument("allocate: sequence {} has no tokens", seq);
  if (request.parent_hash != kRootPrefixHash) {
    return invalid_argument(
        "allocate: sequence {} names a parent hash; the KV-parallel cache chains its groups "
        "itself",
        seq);
  }
  KvpAllocateOutcome outcome;
  // Never fitting outranks "not now": a member that can never hold its share decides, whatever
  // the members before it have free.
  if (!fits_ever(static_cast<int32_t>(std::min<int64_t>(num_tokens, INT32_MAX)),
                 request.apply_watermark)) {
    outcome.admission = Admission::kNeverFits;
    return outcome;
  }
  const int32_t block_size = groups_.front()->options().geometry.block_size;
  const int32_t num_spanned = groups_for(num_tokens);
  outcome.num_groups = num_spanned;
  // Most leading tokens the prefix cache may serve: the sequence's last token is always
  // computed (its logits are needed).
  const int64_t hit_limit = request.max_hit_tokens < 0
                                ? num_tokens - 1
                                : std::min<int64_t>(request.max_hit_tokens, num_tokens - 1);
  // Destroying an open reservation rolls it back, so every early return below leaves each
  // group as it was.
  std::vector<BlockManager::Reservation> prepared;
  prepared.reserve(static_cast<size_t>(num_spanned));
  uint64_t parent_hash = kRootPrefixHash;
  bool whole_prefix_cached = true;
  std::vector<uint64_t> hashes;
  for (int32_t group = 0; group < num_spanned; ++group) {
    const int64_t begin = int64_t{group} * tokens_per_group_;
    const int64_t end = std::min<int64_t>(num_tokens, begin + tokens_per_group_);
    const bool last = group + 1 == num_spanned;
    BlockAllocationRequest group_request;
    group_request.tokens =
        tokens.subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
    group_request.cache_namespace = cache_namespace;
    group_request.parent_hash = parent_hash;
    group_request.max_hit_tokens =
        whole_prefix_cached
            ? static_cast<int32_t>(std::clamp<int64_t>(hit_limit - begin, 0, end - begin))
            : 0;
    group_request.apply_watermark = request.apply_watermark;
    auto reservation = groups_[group]->prepare_allocate(seq, group_request);
    if (!reservation.ok()) return reservation.status().with_context(fmt::format("group {}", group));
    const AllocateOutcome& group_outcome = reservation->outcome();
    if (group_outcome.admission != Admission::kAdmitted) {
      outcome.admission = group_outcome.admission;
      return outcome;
    }
    outcome.num_cached_tokens += group_outcome.num_cached_tokens;
    whole_prefix_cached = whole_prefix_cached && group_outcome.num_cached_tokens == end - begin;
    prepared.push_back(std::move(reservation).value());
    if (!last) {
      hashes.clear();
      append_full_block_hashes(parent_hash, group_request.tokens, block_size, cache_namespace,
                               hashes);
      parent_hash = hashes.back();
    }
  }
  for (int32_t group = 0; group < num_spanned; ++group) {
    groups_[group]->commit(std::move(prepared[group]));
  }
  sequences_.emplace(
      seq, Sequence{static_cast<int32_t>(num_tokens), outcome.num_cached_tokens, cache_namespace});
  outcome.admission = Admission::kAdmitted;
  return outcome;
}

Result<KvpAppendOutcome> KvParallelCache::open_next_group(SeqId seq, Sequence& sequence,
                                                          int32_t token) {
  const int32_t group = sequence.num_tokens / tokens_per_group_;
  FOLIO_ASSIGN_OR_RETURN(const uint64_t parent_hash, groups_[group - 1]->last_block_hash(seq));
  const int32_t tokens[1] = {token};
  BlockAllocationRequest request;
  request.tokens = tokens;
  request.cache_namespace = sequence.cache_namespace;
  request.parent_hash = parent_hash;
  request.max_hit_tokens = 0;
  request.apply_watermark = false;  // an append, not an admission
  FOLIO_ASSIGN_OR_RETURN(auto reservation, groups_[group]->prepare_allocate(seq, request));
  KvpAppendOutcome outcome;
  outcome.group = group;
  if (reservation.outcome().admission != Admission::kAdmitted) return outcome;
  groups_[group]->commit(std::move(reservation));
  FOLIO_ASSIGN_OR_RETURN(const auto table, groups_[group]->block_table(seq));
  outcome.status = AppendStatus::kAppended;
  outcome.slot = int64_t{table.front()} * groups_[group]->options().geometry.block_size;
  return outcome;
}

Result<KvpAppendOutcome> KvParallelCache::append_slot(SeqId seq, int32_t token) {
  const auto entry = sequences_.find(seq);
  if (entry == sequences_.end()) {
    return not_found("append_slot: sequence {} is not in the KV-parallel cache", seq);
  }
  Sequence& sequence = entry->second;
  if (sequence.num_tokens + int64_t{1} > max_context_tokens()) {
    return out_of_range("append_slot: sequence {} already has {} tokens, the context limit", seq,
                        sequence.num_tokens);
  }
  KvpAppendOutcome outcome;
  if (sequence.num_tokens % tokens_per_group_ == 0) {
    FOLIO_ASSIGN_OR_RETURN(outcome, open_next_group(seq, sequence, token));
  } else {
    outcome.group = sequence.num_tokens / tokens_per_group_;
    FOLIO_ASSIGN_OR_RETURN(const AppendOutcome appended,
                           groups_[outcome.group]->append_slot(seq, token));
    outcome.status = appended.status;
    outcome.slot = appended.slot;
    outcome.copy_on_write = appended.copy_on_write;
  }
  if (outcome.status == AppendStatus::kAppended) ++sequence.num_tokens;
  return outcome;
}

Status KvParallelCache::mark_computed(SeqId seq, int32_t num_computed_tokens) {
  const auto entry = sequences_.find(seq);
  if (entry == sequences_.end()) {
    return not_found("mark_computed: sequence {} is not in the KV-parallel cache", seq);
  }
  Sequence& sequence = entry->second;
  if (num_computed_tokens < sequence.num_computed || num_computed_tokens > sequence.num_tokens) {
    return out_of_range("mark_computed: {} is not in [{}, {}] for sequence {}", num_computed_tokens,
                        sequence.num_computed, sequence.num_tokens, seq);
  }
  for (int32_t group = 0; group < groups_for(sequence.num_tokens); ++group) {
    const int32_t begin = group * tokens_per_group_;
    const int32_t in_group = std::clamp(num_computed_tokens - begin, 0, tokens_per_group_);
    const int32_t already = std::clamp(sequence.num_computed - begin, 0, tokens_per_group_);
    if (in_group == already) continue;
    const Status status = groups_[group]->mark_computed(seq, in_group);
    FOLIO_CHECK(status.ok(), "KV-parallel group {} disagrees about sequence {}: {}", group, seq,
                status);
  }
  sequence.num_computed = num_computed_tokens;
  return Status();
}

Status KvParallelCache::free(SeqId seq) {
  const auto entry = sequences_.find(seq);
  if (entry == sequences_.end()) {
    return not_found(
        "free: sequence {} is not in the KV-parallel cache (never allocated, or already freed)",
        seq);
  }
  for (int32_t group = 0; group < groups_for(entry->second.num_tokens); ++group) {
    const Status status = groups_[group]->free(seq);
    FOLIO_CHECK(status.ok(), "KV-parallel group {} disagrees about sequence {}: {}", group, seq,
                status);
  }
  sequences_.erase(entry);
  return Status();
}

Status KvParallelCache::fork(SeqId parent, SeqId child) {
  const auto entry = sequences_.find(parent);
  if (entry == sequences_.end()) {
    return not_found("fork: sequence {} is not in the KV-parallel cache", parent);
  }
  if (sequences_.contains(child)) {
    return already_exists("fork: child sequence {} is already in the KV-parallel cache", child);
  }
  for (int32_t group = 0; group < groups_for(entry->second.num_tokens); ++group) {
    const Status status = groups_[group]->fork(parent, child);
    FOLIO_CHECK(status.ok(), "KV-parallel group {} cannot fork sequence {}: {}", group, parent,
                status);
  }
  const Sequence copy = entry->second;
  sequences_.emplace(child, copy);
  return Status();
}

Status KvParallelCache::fill_block_tables(int32_t group, std::span<const SeqId> seqs,
                                          int32_t max_blocks_per_sequence,
                                          std::span<int32_t> out) const {
  if (group < 0 || group >= num_groups()) {
    return invalid_argument("fill_block_tables: group {} of {}", group, num_groups());
  }
  if (max_blocks_per_sequence <= 0) {
    return invalid_argument("fill_block_tables: max_blocks_per_sequence must be positive");
  }
  const auto row = static_cast<size_t>(max_blocks_per_sequence);
  if (out.size() < seqs.size() * row) {
    return invalid_argument("fill_block_tables: buffer of {} entries is too small for {} x {}",
                            out.size(), seqs.size(), row);
  }
  const BlockManager& manager = *groups_[group];
  std::vector<std::span<const int32_t>> tables(seqs.size());
  for (size_t index = 0; index < seqs.size(); ++index) {
    const SeqId seq = seqs[index];
    if (!sequences_.contains(seq)) {
      return not_found("fill_block_tables: sequence {} is not in the KV-parallel cache", seq);
    }
    if (!manager.contains(seq)) continue;  // does not reach this group
    FOLIO_ASSIGN_OR_RETURN(tables[index], manager.block_table(seq));
    if (tables[index].size() > row) {
      return out_of_range(
          "fill_block_tables: sequence {} has {} blocks in group {}, more than the {} a row holds",
          seq, tables[index].size(), group, row);
    }
  }
  for (size_t index = 0; index < seqs.size(); ++index) {
    int32_t* destination = out.data() + index * row;
    std::copy(tables[index].begin(), tables[index].end(), destination);
    std::fill(destination + tables[index].size(), destination + row, manager.dummy_block().value());
  }
  return Status();
}

Status KvParallelCache::fill_slot_mapping(int32_t group, std::span<const StepSegment> segments,
                                          std::span<int32_t> out) const {
  if (group < 0 || group >= num_groups()) {
    return invalid_argument("fill_slot_mapping: group {} of {}", group, num_groups());
  }
  const BlockManager& manager = *groups_[group];
  const int64_t block_size = manager.options().geometry.block_size;
  const int64_t range_begin = int64_t{group} * tokens_per_group_;
  const int64_t range_end = range_begin + tokens_per_group_;
  size_t token = 0;
  for (const StepSegment& segment : segments) {
    if (token + static_cast<size_t>(segment.num_tokens) > out.size()) {
      return invalid_argument("fill_slot_mapping: buffer of {} entries is too small", out.size());
    }
    const auto entry = sequences_.find(segment.seq);
    if (entry == sequences_.end()) {
      return not_found("fill_slot_mapping: sequence {} is not in the KV-parallel cache",
                       segment.seq);
    }
    if (int64_t{segment.first_position} + segment.num_tokens > entry->second.num_tokens) {
      return out_of_range("fill_slot_mapping: sequence {} has {} tokens, the step writes [{}, {})",
                          segment.seq, entry->second.num_tokens, segment.first_position,
                          int64_t{segment.first_position} + segment.num_tokens);
    }
    std::span<const int32_t> table;
    if (manager.contains(segment.seq)) {
      FOLIO_ASSIGN_OR_RETURN(table, manager.block_table(segment.seq));
    }
    for (int32_t i = 0; i < segment.num_tokens; ++i, ++token) {
      const int64_t position = int64_t{segment.first_position} + i;
      if (position < range_begin || position >= range_end) {
        out[token] = -1;
        continue;
      }
      const int64_t offset = position - range_begin;
      FOLIO_CHECK(offset / block_size < static_cast<int64_t>(table.size()),
                  "KV-parallel group {} holds {} blocks of sequence {}, position {} is in it",
                  group, table.size(), segment.seq, position);
      out[token] = static_cast<int32_t>(
          table[static_cast<size_t>(offset / block_size)] * block_size + offset % block_size);
    }
  }
  std::fill(out.begin() + static_cast<std::ptrdiff_t>(token), out.end(), -1);
  return Status();
}

Result<int32_t> KvParallelCache::num_tokens(SeqId seq) const {
  const auto entry = sequences_.find(seq);
  if (entry == sequences_.end())
    return not_found("sequence {} is not in the KV-parallel cache", seq);
  return entry->second.num_tokens;
}

Result<int32_t> KvParallelCache::num_groups_spanned(SeqId seq) const {
  FOLIO_ASSIGN_OR_RETURN(const int32_t tokens, num_tokens(seq));
  return groups_for(tokens);
}

// --- KvCache.

bool KvParallelCache::fits_ever(int32_t num_tokens, bool apply_watermark) const {
  if (num_tokens <= 0 || num_tokens > max_context_tokens()) return false;
  for (int32_t group = 0; group < groups_for(num_tokens); ++group) {
    if (!groups_[group]->fits_ever(share_of(num_tokens, group), apply_watermark)) return false;
  }
  return true;
}

bool KvParallelCache::has_room_for(const RoomQuery& query) const {
  if (query.num_tokens > max_context_tokens()) return false;
  for (int32_t group = 0; group < members_spanned(query.num_tokens); ++group) {
    RoomQuery share = query;
    share.num_tokens = share_of(query.num_tokens, group);
    if (!groups_[group]->has_room_for(share)) return false;
  }
  return true;
}

Result<AllocateOutcome> KvParallelCache::allocate_sequence(SeqId seq,
                                                           const BlockAllocationRequest& request) {
  FOLIO_ASSIGN_OR_RETURN(const KvpAllocateOutcome spread, allocate_spread(seq, request));
  return AllocateOutcome{spread.admission, spread.num_cached_tokens};
}

Result<AppendedToken> KvParallelCache::append_token(SeqId seq, int32_t token) {
  FOLIO_ASSIGN_OR_RETURN(const KvpAppendOutcome outcome, append_slot(seq, token));
  return AppendedToken{outcome.status, outcome.group};
}

Result<bool> KvParallelCache::is_swapped(SeqId seq) const {
  if (!sequences_.contains(seq)) {
    return not_found("is_swapped: sequence {} is not in the KV-parallel cache", seq);
  }
  return false;
}

Result<SwapOutcome> KvParallelCache::swap_out(std::span<const SeqId>) {
  return failed_precondition(
      "a KV-parallel cache does not swap (its members' swaps are not coordinated); preempt by "
      "recompute");
}

Result<SwapOutcome> KvParallelCache::swap_in(std::span<const SeqId>, bool) {
  return failed_precondition(
      "a KV-parallel cache does not swap (its members' swaps are not coordinated); preempt by "
      "recompute");
}

Status KvParallelCache::apply_pending_copies() {
  for (int32_t group = 0; group < num_groups(); ++group) {
    FOLIO_RETURN_IF_ERROR(groups_[group]->apply_pending_copies().with_context(
        fmt::format("KV-parallel group {}", group)));
  }
  return Status();
}

BlockCounts KvParallelCache::total_counts() const {
  BlockCounts total;
  for (const BlockManager* group : groups_) {
    const BlockCounts& counts = group->counts();
    total.total += counts.total;
    total.free += counts.free;
    total.owned += counts.owned;
    total.cached += counts.cached;
    total.shared += counts.shared;
    total.held_pages += counts.held_pages;
    total.pinned_pages += counts.pinned_pages;
  }
  return total;
}

PrefixCacheStats KvParallelCache::total_prefix_stats() const {
  PrefixCacheStats total;
  for (const BlockManager* group : groups_) {
    const PrefixCacheStats& stats = group->prefix_stats();
    total.queried_blocks += stats.queried_blocks;
    total.hit_blocks += stats.hit_blocks;
    total.missed_blocks += stats.missed_blocks;
    total.hit_tokens += stats.hit_tokens;
    total.evicted_blocks += stats.evicted_blocks;
  }
  return total;
}

int64_t KvParallelCache::total_sequence_blocks() const {
  int64_t total = 0;
  for (const BlockManager* group : groups_) total += group->max_sequence_blocks();
  return total;
}

int64_t KvParallelCache::total_reserved_blocks() const {
  int64_t total = 0;
  for (const BlockManager* group : groups_) total += group->num_dummy_blocks();
  return total;
}

void KvParallelCache::check_cache_invariants() const {
  std::vector<int64_t> held(groups_.size(), 0);
  for (const auto& [seq, sequence] : sequences_) {
    FOLIO_CHECK(sequence.num_computed <= sequence.num_tokens);
    for (int32_t group = 0; group < num_groups(); ++group) {
      const int32_t share = share_of(sequence.num_tokens, group);
      const BlockManager& manager = *groups_[group];
      FOLIO_CHECK(manager.contains(seq) == (share > 0),
                  "sequence {} ({} tokens) {} in KV-parallel group {}", seq, sequence.num_tokens,
                  manager.contains(seq) ? "is" : "is not", group);
      if (share == 0) continue;
      ++held[static_cast<size_t>(group)];
      FOLIO_CHECK(*manager.num_tokens(seq) == share,
                  "sequence {} holds {} tokens in KV-parallel group {}, its share is {}", seq,
                  *manager.num_tokens(seq), group, share);
    }
  }
  for (int32_t group = 0; group < num_groups(); ++group) {
    groups_[group]->check_invariants();
    FOLIO_CHECK(groups_[group]->num_sequences() == held[static_cast<size_t>(group)],
                "KV-parallel group {} holds {} sequences, the cache spans it with {}", group,
                groups_[group]->num_sequences(), held[static_cast<size_t>(group)]);
  }
}

}  // namespace folio::kv
