// Block manager throughput against a naive baseline measured in the same run: a mutex around a
// std::map of block tables and a free-list vector, which is how a KV allocator is usually first
// written. Report folio / naive items per second.
//
//   BM_Folio_AllocateFree / BM_Naive_AllocateFree: allocate a 256-token prompt (16 blocks), free
//   it; 64 other sequences stay live. Items: allocate + free pairs.
//   BM_Folio_Append / BM_Naive_Append: one decode token per iteration, round robin over 256 live
//   sequences (a new block every 16 appends); a sequence that reaches 1024 tokens is freed and
//   re-admitted with a 64-token prompt. Items: appends.
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <vector>

#include "folio/base/check.h"
#include "folio/kv/block_manager.h"
#include "folio/kv/fixed_page_source.h"

namespace folio::kv {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kNumBlocks = 65536;

class NaiveBlockManager {
 public:
  explicit NaiveBlockManager(int32_t num_blocks) {
    free_.resize(static_cast<size_t>(num_blocks));
    std::iota(free_.rbegin(), free_.rend(), 0);
  }
  bool allocate(int64_t seq, int32_t num_tokens) {
    std::lock_guard lock(mutex_);
    const auto needed = static_cast<size_t>((num_tokens + kBlockSize - 1) / kBlockSize);
    if (free_.size() < needed || tables_.contains(seq)) return false;
    Table& table = tables_[seq];
    table.num_tokens = num_tokens;
    for (size_t index = 0; index < needed; ++index) {
      table.blocks.push_back(free_.back());
      free_.pop_back();
    }
    return true;
  }
  int64_t append_slot(int64_t seq) {
    std::lock_guard lock(mutex_);
    const auto entry = tables_.find(seq);
    if (entry == tables_.end()) return -1;
    Table& table = entry->second;
    if (table.num_tokens % kBlockSize == 0) {
      if (free_.empty()) return -1;
      table.blocks.push_back(free_.back());
      free_.pop_back();
    }
    const int32_t position = table.num_tokens++;
    return int64_t{table.blocks[position / kBlockSize]} * kBlockSize + position % kBlockSize;
  }
  bool free(int64_t seq) {
    std::lock_guard lock(mutex_);
    const auto entry = tables_.find(seq);
    if (entry == tables_.end()) return false;
    for (int32_t block : entry->second.blocks) free_.push_back(block);
    tables_.erase(entry);
    return true;
  }
  int32_t num_tokens(int64_t seq) {
    std::lock_guard lock(mutex_);
    return tables_.at(seq).num_tokens;
  }

 private:
  struct Table {
    std::vector<int32_t> blocks;
    int32_t num_tokens = 0;
  };
  std::mutex mutex_;
  std::map<int64_t, Table> tables_;
  std::vector<int32_t> free_;
};

// A folio block manager over a fixed page source of kNumBlocks blocks (tiny blocks: the
// benchmark measures bookkeeping, not memory traffic).
struct FolioFixture {
  FolioFixture() {
    ir::KvCacheGeometry geometry;
    geometry.block_size = kBlockSize;
    geometry.num_layers = 1;
    geometry.num_kv_heads = 1;
    geometry.head_dim = 4;
    geometry.dtype = DType::kF32;
    source = std::make_unique<FixedPageSource>(geometry.block_bytes() * 64, kNumBlocks / 64);
    BlockManagerOptions options;
    options.geometry = geometry;
    options.max_context_tokens = 4096;
    manager = std::move(BlockManager::create(options, *source, copier)).value();
  }
  std::unique_ptr<FixedPageSource> source;
  HostKvBlockCopier copier;
  std::unique_ptr<BlockManager> manager;
};

std::vector<int32_t> prompt_tokens(int32_t count, int32_t salt) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (int32_t index = 0; index < count; ++index) tokens[index] = (index * 7919 + salt) % 32000;
  return tokens;
}

void BM_Folio_AllocateFree(benchmark::State& state) {
  FolioFixture fixture;
  BlockManager& manager = *fixture.manager;
  for (int64_t seq = 0; seq < 64; ++seq) {
    FOLIO_CHECK(manager.allocate(SeqId(seq), prompt_tokens(512, static_cast<int32_t>(seq))).ok());
  }
  const std::vector<int32_t> prompt = prompt_tokens(256, 12345);
  int64_t seq = 1000;
  for (auto _ : state) {
    auto outcome = manager.allocate(SeqId(seq), prompt);
    benchmark::DoNotOptimize(outcome);
    FOLIO_CHECK(manager.free(SeqId(seq)).ok());
    ++seq;
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Naive_AllocateFree(benchmark::State& state) {
  NaiveBlockManager manager(kNumBlocks);
  for (int64_t seq = 0; seq < 64; ++seq) FOLIO_CHECK(manager.allocate(seq, 512));
  int64_t seq = 1000;
  for (auto _ : state) {
    const bool allocated = manager.allocate(seq, 256);
    benchmark::DoNotOptimize(allocated);
    FOLIO_CHECK(manager.free(seq));
    ++seq;
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Folio_Append(benchmark::State& state) {
  FolioFixture fixture;
  BlockManager& manager = *fixture.manager;
  constexpr int64_t kLive = 256;
  const std::vector<int32_t> prompt = prompt_tokens(64, 1);
  std::vector<int32_t> lengths(kLive, 64);
  std::vector<int64_t> ids(kLive);
  for (int64_t index = 0; index < kLive; ++index) {
    ids[index] = index;
    FOLIO_CHECK(manager.allocate(SeqId(index), prompt).ok());
  }
  int64_t next_id = kLive;
  int64_t cursor = 0;
  for (auto _ : state) {
    const int64_t slot_index = cursor++ % kLive;
    if (lengths[slot_index] == 1024) {
      FOLIO_CHECK(manager.free(SeqId(ids[slot_index])).ok());
      ids[slot_index] = next_id++;
      FOLIO_CHECK(manager.allocate(SeqId(ids[slot_index]), prompt).ok());
      lengths[slot_index] = 64;
    }
    auto outcome = manager.append_slot(SeqId(ids[slot_index]), 42);
    benchmark::DoNotOptimize(outcome);
    ++lengths[slot_index];
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Naive_Append(benchmark::State& state) {
  NaiveBlockManager manager(kNumBlocks);
  constexpr int64_t kLive = 256;
  std::vector<int32_t> lengths(kLive, 64);
  std::vector<int64_t> ids(kLive);
  for (int64_t index = 0; index < kLive; ++index) {
    ids[index] = index;
    FOLIO_CHECK(manager.allocate(index, 64));
  }
  int64_t next_id = kLive;
  int64_t cursor = 0;
  for (auto _ : state) {
    const int64_t slot_index = cursor++ % kLive;
    if (lengths[slot_index] == 1024) {
      FOLIO_CHECK(manager.free(ids[slot_index]));
      ids[slot_index] = next_id++;
      FOLIO_CHECK(manager.allocate(ids[slot_index], 64));
      lengths[slot_index] = 64;
    }
    const int64_t slot = manager.append_slot(ids[slot_index]);
    benchmark::DoNotOptimize(slot);
    ++lengths[slot_index];
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(BM_Folio_AllocateFree);
BENCHMARK(BM_Naive_AllocateFree);
BENCHMARK(BM_Folio_Append);
BENCHMARK(BM_Naive_Append);

}  // namespace
}  // namespace folio::kv

BENCHMARK_MAIN();
