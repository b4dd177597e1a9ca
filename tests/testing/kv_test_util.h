// Test support for kv/: a tiny block geometry, a writer/checker of synthetic KV contents, a
// page source decorator that injects failures, and a snapshot of a manager's observable state.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <vector>

#include "folio/kv/block_manager.h"
#include "folio/kv/kv_page_source.h"

namespace folio::kv::testing {

// 1 layer, 1 KV head, head dim 4, f32: a block is block_size * 32 bytes.
inline ir::KvCacheGeometry tiny_geometry(int32_t block_size = 8) {
  ir::KvCacheGeometry geometry;
  geometry.block_size = block_size;
  geometry.num_layers = 1;
  geometry.num_kv_heads = 1;
  geometry.head_dim = 4;
  geometry.dtype = DType::kF32;
  return geometry;
}

// Synthetic KV that depends, like real KV, on the token, everything before it and the adapter
// (not on the cache salt, which only isolates): every element of position p's K and V rows is
// key(tokens[0..p], adapter) plus the element's index.
class KvContents {
 public:
  // keys[p] for every position of `tokens`.
  static std::vector<uint64_t> position_keys(std::span<const int32_t> tokens,
                                             const CacheNamespace& cache_namespace) {
    std::vector<uint64_t> keys;
    uint64_t key = 0x243f6a8885a308d3ULL ^ static_cast<uint64_t>(cache_namespace.adapter_id) * 31;
    for (int32_t token : tokens) {
      key = (key ^ static_cast<uint32_t>(token)) * 0x100000001b3ULL;
      key ^= key >> 29;
      keys.push_back(key);
    }
    return keys;
  }

  static float element(uint64_t key, int64_t index) {
    return static_cast<float>((key >> 44) + static_cast<uint64_t>(index));  // exact in f32
  }

  // Writes positions [begin, end) of `seq` through its block table, as a forward pass would.
  static void write(const BlockManager& manager, SeqId seq, std::span<const int32_t> tokens,
                    const CacheNamespace& cache_namespace, int32_t begin, int32_t end) {
    const std::vector<uint64_t> keys = position_keys(tokens, cache_namespace);
    const KvLayoutNumbers layout = manager.layout();
    const std::span<const int32_t> table = *manager.block_table(seq);
    for (int32_t position = begin; position < end; ++position) {
      for_each_element(layout, table, position, [&](float* element, int64_t index) {
        *element = KvContents::element(keys[position], index);
      });
    }
  }

  // Checks positions [0, end) of `seq`.
  static ::testing::AssertionResult verify(const BlockManager& manager, SeqId seq,
                                           std::span<const int32_t> tokens,
                                           const CacheNamespace& cache_namespace, int32_t end) {
    const std::vector<uint64_t> keys = position_keys(tokens, cache_namespace);
    const KvLayoutNumbers layout = manager.layout();
    const std::span<const int32_t> table = *manager.block_table(seq);
    for (int32_t position = 0; position < end; ++position) {
      bool ok = true;
      for_each_element(layout, table, position, [&](float* element, int64_t index) {
        ok = ok && *element == KvContents::element(keys[position], index);
      });
      if (!ok) {
        return ::testing::AssertionFailure()
               << "sequence " << seq.value() << " position " << position << " (block "
               << table[position / layout.block_size] << ") holds wrong KV";
      }
    }
    return ::testing::AssertionSuccess();
  }

 private:
  template <typename Visit>
  static void for_each_element(const KvLayoutNumbers& layout, std::span<const int32_t> table,
                               int32_t position, Visit&& visit) {
    const int32_t block = table[position / layout.block_size];
    const int32_t token_in_block = position % layout.block_size;
    const int64_t row = int64_t{layout.num_kv_heads} * layout.head_dim;
    int64_t index = 0;
    for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
      for (int32_t key_or_value = 0; key_or_value < 2; ++key_or_value) {
        auto* base =
            reinterpret_cast<float*>(layout.block_pointer(block)) +
            ((int64_t{layer} * 2 + key_or_value) * layout.block_size + token_in_block) * row;
        for (int64_t element = 0; element < row; ++element) visit(base + element, index++);
      }
    }
  }
};

// Forwards to another source, failing chosen calls (LevelDB-style fault injection).
class FaultyPageSource final : public KvPageSource {
 public:
  explicit FaultyPageSource(KvPageSource& inner) : inner_(inner) {}

  // The next `successes` allocations succeed, the ones after fail (-1: never fail).
  void fail_allocations_after(int32_t successes) { allocations_left_ = successes; }
  void fail_pins(bool fail) { fail_pins_ = fail; }
  // Reports this many available pages instead of the truth (-1: the truth), like a pool that
  // counts evictable pages of other owners.
  void override_available(int32_t pages) { available_override_ = pages; }

  int64_t page_bytes() const override { return inner_.page_bytes(); }
  std::byte* base() const override { return inner_.base(); }
  int32_t capacity_pages() const override { return inner_.capacity_pages(); }
  int32_t num_pages_available() const override {
    return available_override_ >= 0 ? available_override_ : inner_.num_pages_available();
  }
  Result<KvPage> allocate_page() override {
    if (allocations_left_ == 0) return resource_exhausted("injected allocation failure");
    if (allocations_left_ > 0) --allocations_left_;
    return inner_.allocate_page();
  }
  Status release_page(const KvPage& page) override { return inner_.release_page(page); }
  Status pin(const KvPage& page) override {
    if (fail_pins_) return failed_precondition("injected pin failure");
    return inner_.pin(page);
  }
  void unpin(const KvPage& page) override { inner_.unpin(page); }
  void set_eviction_handler(KvEvictionHandler* handler) override {
    inner_.set_eviction_handler(handler);
  }

 private:
  KvPageSource& inner_;
  int32_t allocations_left_ = -1;
  bool fail_pins_ = false;
  int32_t available_override_ = -1;
};

// What a caller can observe of a manager: block states, references, registration, LRU order,
// counts, statistics and the tables of the given sequences.
struct ManagerSnapshot {
  std::vector<int32_t> block_words;  // state | registered << 4 | ref << 8
  std::vector<int32_t> lru;
  std::vector<int64_t> numbers;
  std::map<int64_t, std::vector<int32_t>> tables;

  static ManagerSnapshot take(const BlockManager& manager, std::span<const SeqId> seqs) {
    ManagerSnapshot snapshot;
    const BlockAllocator& allocator = manager.allocator();
    for (int32_t block = 0; block < allocator.capacity_blocks(); ++block) {
      const BlockId id(block);
      snapshot.block_words.push_back(static_cast<int32_t>(allocator.state(id)) |
                                     (allocator.is_registered(id) ? 16 : 0) |
                                     (allocator.ref_count(id) << 8));
    }
    snapshot.lru = allocator.lru_order();
    const BlockCounts& counts = manager.counts();
    const PrefixCacheStats& stats = manager.prefix_stats();
    snapshot.numbers = {counts.total,         counts.free,          counts.owned,
                        counts.cached,        counts.held_pages,    counts.pinned_pages,
                        stats.queried_blocks, stats.hit_blocks,     stats.missed_blocks,
                        stats.hit_tokens,     stats.evicted_blocks, manager.num_sequences()};
    for (SeqId seq : seqs) {
      const auto swapped = manager.is_swapped(seq);
      if (!swapped.ok()) continue;
      if (*swapped) {
        snapshot.tables[seq.value()] = {-1};
        continue;
      }
      const auto table = *manager.block_table(seq);
      snapshot.tables[seq.value()] = std::vector<int32_t>(table.begin(), table.end());
    }
    return snapshot;
  }

  friend bool operator==(const ManagerSnapshot&, const ManagerSnapshot&) = default;
};

}  // namespace folio::kv::testing
