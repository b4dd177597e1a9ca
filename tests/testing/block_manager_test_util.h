// BlockManagerFixture: one block manager over the tiny geometry (testing/kv_test_util.h), its
// fixed page source behind a FaultyPageSource (pass-through until a test injects a fault), host
// swap space and a copier that counts batches; with the helpers most block-manager tests use:
// prefill (allocate, write the uncached KV, mark computed) and table.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "folio/kv/block_manager.h"
#include "folio/kv/fixed_page_source.h"
#include "testing/kv_test_util.h"
#include "testing/tokens.h"

namespace folio::kv::testing {

inline constexpr int32_t kTinyBlockSize = 8;
inline constexpr int64_t kTinyBlockBytes = kTinyBlockSize * 32;  // tiny_geometry

// Counts batches so tests can see that a step's copy-on-write pairs run as one call.
class CountingCopier final : public KvBlockCopier {
 public:
  Status copy_blocks(const KvLayoutNumbers& layout, std::span<const BlockCopy> copies) override {
    ++num_batches;
    last_batch.assign(copies.begin(), copies.end());
    return host.copy_blocks(layout, copies);
  }
  Status copy_to_host(const KvLayoutNumbers& layout, HostSwapSpace& swap,
                      std::span<const BlockCopy> copies) override {
    return host.copy_to_host(layout, swap, copies);
  }
  Status copy_to_device(const KvLayoutNumbers& layout, const HostSwapSpace& swap,
                        std::span<const BlockCopy> copies) override {
    return host.copy_to_device(layout, swap, copies);
  }
  HostKvBlockCopier host;
  int num_batches = 0;
  std::vector<BlockCopy> last_batch;
};

struct BlockManagerSetup {
  int32_t num_pages = 16;
  int32_t blocks_per_page = 4;
  double watermark = 0.0;
  int32_t swap_blocks = 32;
  int32_t max_context_tokens = 256;
};

class BlockManagerFixture : public ::testing::Test {
 protected:
  // Replaces the manager (and its source and swap space) with a fresh one.
  void make_manager(const BlockManagerSetup& setup) {
    manager_.reset();
    source_ =
        std::make_unique<FixedPageSource>(kTinyBlockBytes * setup.blocks_per_page, setup.num_pages);
    faulty_ = std::make_unique<FaultyPageSource>(*source_);
    swap_ = std::make_unique<HostSwapSpace>(kTinyBlockBytes, setup.swap_blocks);
    BlockManagerOptions options;
    options.geometry = tiny_geometry(kTinyBlockSize);
    options.max_context_tokens = setup.max_context_tokens;
    options.watermark = setup.watermark;
    auto created = BlockManager::create(options, *faulty_, copier_, swap_.get());
    ASSERT_TRUE(created.ok()) << created.status().to_string();
    manager_ = std::move(created).value();
  }

  // Allocates, writes the KV of the uncached positions and marks them computed: a prefill.
  AllocateOutcome prefill(SeqId seq, std::span<const int32_t> prompt,
                          const CacheNamespace& cache_namespace = {}) {
    auto outcome = manager_->allocate(seq, prompt, cache_namespace);
    EXPECT_TRUE(outcome.ok()) << outcome.status().to_string();
    if (!outcome.ok() || outcome->admission != Admission::kAdmitted) return outcome.value_or({});
    KvContents::write(*manager_, seq, prompt, cache_namespace, outcome->num_cached_tokens,
                      static_cast<int32_t>(prompt.size()));
    EXPECT_TRUE(manager_->mark_computed(seq, static_cast<int32_t>(prompt.size())).ok());
    return *outcome;
  }

  std::vector<int32_t> table(SeqId seq) {
    auto result = manager_->block_table(seq);
    EXPECT_TRUE(result.ok()) << result.status().to_string();
    return result.ok() ? std::vector<int32_t>(result->begin(), result->end())
                       : std::vector<int32_t>{};
  }

  std::unique_ptr<FixedPageSource> source_;
  std::unique_ptr<FaultyPageSource> faulty_;  // what the manager allocates from
  std::unique_ptr<HostSwapSpace> swap_;
  CountingCopier copier_;
  std::unique_ptr<BlockManager> manager_;
};

}  // namespace folio::kv::testing
